"""Helpers (no tests here) that run MT-Eval's official code from ../shared/mteval/official as a reference.

The official modules import packages this project does not install (strictfire, fastchat, rouge,
pandas, tabulate, openai 0.x) and change process-wide state when imported (the root logger's
handlers, the recursion limit, multiprocessing's pickler). ``official_modules`` stubs the missing
packages, runs from a scratch copy of the folder, and puts every piece of that state back.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import multiprocessing.reduction
import os
import shutil
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


def scratch_official(shared_mteval: Path, tmp: Path) -> Path:
    """A copy of ``official/`` with ``prompts/`` beside its scripts, as the authors run them."""
    if not (shared_mteval / "official").is_dir() or not (shared_mteval / "prompts").is_dir():
        pytest.skip(f"MT-Eval's official code or prompts not found under {shared_mteval}")
    folder = tmp / "official"
    shutil.copytree(shared_mteval / "official", folder)
    shutil.copytree(shared_mteval / "prompts", folder / "prompts")
    return folder


# SHA-256 of NLTK's own English Punkt tables (nltk_data's tokenizers/punkt_tab/english/), each file's
# lines sorted, as punkt_tab_folder writes them. Taken once from NLTK's files as llama-index-core
# 0.14.25 bundles them (its _static/nltk_cache); the tables of NLTK's older PY3/english.pickle (as
# llama-index 0.9.48 bundles it, the model nltk 3.8.1 loads) are the same. The offline tests cannot
# download NLTK's data, so these pin the reference to NLTK's model and not to the package we ship.
NLTK_ENGLISH_PUNKT_SHA256 = {
    "abbrev_types.txt": "c7baa3c333ea86629a32400663db8cfcc5c6d61a37107ddeac60111b550806cd",
    "collocations.tab": "ba850bde20b6d640723a51f3e747f0f4f19c98938f1d67d2692a5595c2cc48e3",
    "ortho_context.tab": "b907db07477c8d682c83331ad38b56178e77120c4ff55bb799bf43044e75d305",
    "sent_starters.txt": "9288e8cdec3ce0026b82851a145d0b5c3cfbbe64e1ea6dfa0c41d55f2e53c858",
}


def punkt_tab_tables() -> dict[str, str]:
    """The shipped English Punkt model as the four punkt_tab files (lines sorted), by file name."""
    from punkt.data import load_module

    model = load_module("english")
    return {
        "abbrev_types.txt": "".join(f"{a}\n" for a in sorted(model.ABBREV_TYPES)),
        "sent_starters.txt": "".join(f"{s}\n" for s in sorted(model.SENT_STARTERS)),
        "collocations.tab": "".join(f"{a}\t{b}\n" for a, b in sorted(model.COLLOCATIONS)),
        "ortho_context.tab": "".join(f"{k}\t{v}\n" for k, v in sorted(model.ORTHO_CONTEXT.items())),
    }


def punkt_tab_folder(tmp: Path) -> Path:
    """An NLTK data folder holding ``tokenizers/punkt_tab/english``: NLTK's English Punkt model.

    Written from the model we ship, and refused unless each table's digest is that of NLTK's own
    file (``NLTK_ENGLISH_PUNKT_SHA256``). NLTK then loads it with its own ``PunktTokenizer``, so the
    reference takes NLTK's loading path and NLTK's parameters, not ours.
    """
    import hashlib

    tables = punkt_tab_tables()
    changed = [
        name
        for name, text in tables.items()
        if hashlib.sha256(text.encode("utf-8")).hexdigest() != NLTK_ENGLISH_PUNKT_SHA256[name]
    ]
    assert not changed, f"the shipped Punkt model differs from NLTK's English punkt_tab in {changed}"
    root = tmp / "nltk_data"
    english = root / "tokenizers" / "punkt_tab" / "english"
    english.mkdir(parents=True)
    for name, text in tables.items():
        (english / name).write_text(text, "utf-8")
    return root


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


class _Conversation:
    sep_style: Any = None
    sep = ""

    def set_system_message(self, message: str) -> None:
        self.system_message = message


def stub_modules(generate: Callable[..., Any] | None = None) -> dict[str, types.ModuleType]:
    """Stand-ins for what the official scripts import but never use in the paths the tests run."""
    fastchat = _module("fastchat")
    conversation = _module(
        "fastchat.conversation",
        SeparatorStyle=types.SimpleNamespace(ADD_COLON_SINGLE="add-colon-single"),
        get_conv_template=lambda name: _Conversation(),
    )
    fastchat.conversation = conversation  # type: ignore[attr-defined]
    never = _refuse
    return {
        "strictfire": _module("strictfire", StrictFire=never),
        "fastchat": fastchat,
        "fastchat.conversation": conversation,
        "rouge": _module("rouge", Rouge=lambda: types.SimpleNamespace(get_scores=never)),
        "tabulate": _module("tabulate", tabulate=never),
        "pandas": _module("pandas", DataFrame=object),
        "utils.bleu": _module("utils.bleu", compute=never),
        "utils.openai_generate": _module("utils.openai_generate", generate=generate or never),
    }


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a stubbed official dependency was called")


SCORE_REPLY = '{"Rationale": "stub", "Score": 5}'


def client_stubs(sent: list[dict[str, Any]], tmp_folder: Path) -> dict[str, types.ModuleType]:
    """The stubs for running the authors' own client, ``utils/openai_generate.py``, instead of a stand-in.

    ``openai`` 0.x and ``transformers`` (which it imports) are stubbed: ``ChatCompletion.create``
    keeps the arguments of each request in ``sent`` (what the client would send) and answers
    ``SCORE_REPLY``. The client reads its key pool from ``utils/api_keys.json`` when imported, so
    a placeholder pool is written into the scratch copy ``tmp_folder`` (never a real key).
    """
    (tmp_folder / "utils" / "api_keys.json").write_text('[{"key": "placeholder-not-a-key"}]', "utf-8")

    def create(**kwargs: Any) -> dict[str, Any]:
        sent.append(kwargs)
        choice = {"message": {"role": "assistant", "content": SCORE_REPLY}, "text": SCORE_REPLY}
        return {"usage": {"prompt_tokens": 1, "completion_tokens": 1}, "choices": [choice]}

    errors = {
        name: type(name, (Exception,), {})
        for name in (
            "RateLimitError",
            "APIError",
            "APIConnectionError",
            "Timeout",
            "AuthenticationError",
            "ServiceUnavailableError",
            "InvalidRequestError",
        )
    }
    error_module = _module("openai.error", **errors)
    openai = _module(
        "openai",
        error=error_module,
        ChatCompletion=types.SimpleNamespace(create=create),
        Completion=types.SimpleNamespace(create=_refuse),
    )
    stubs = stub_modules()
    del stubs["utils.openai_generate"]  # the authors' own file answers
    return {
        **stubs,
        "openai": openai,
        "openai.error": error_module,
        "transformers": _module("transformers", GPT2Tokenizer=object),
    }


def quiet_client() -> None:
    """No half-second pause after each of the client's requests (its ``sleep``), once it is imported."""
    sys.modules["utils.openai_generate"].sleep = lambda seconds: None  # type: ignore[attr-defined]


@contextlib.contextmanager
def official_modules(folder: Path, stubs: dict[str, types.ModuleType]) -> Iterator[Callable[[str], Any]]:
    """Import official scripts by file name from ``folder`` (the working directory meanwhile), stubs in place."""
    saved_modules = dict(sys.modules)
    saved_path = list(sys.path)
    saved_limit = sys.getrecursionlimit()
    saved_pickler = multiprocessing.reduction.ForkingPickler
    saved_dump = multiprocessing.reduction.dump
    root = logging.getLogger()
    saved_handlers = list(root.handlers)
    saved_level = root.level
    for name in [n for n in sys.modules if n == "utils" or n.startswith("utils.")]:
        del sys.modules[name]  # another package's ``utils`` must not answer for the authors'
    sys.modules.update(stubs)
    sys.path.insert(0, str(folder))
    cwd = os.getcwd()
    os.chdir(folder)  # the scripts open raw_data/ and prompts/ relative to it
    try:

        def load(script: str) -> Any:
            name = f"mteval_official_{Path(script).stem}"
            spec = importlib.util.spec_from_file_location(name, folder / script)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            return module

        yield load
    finally:
        for handler in root.handlers:
            if handler not in saved_handlers:
                handler.close()
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        for name in [n for n in sys.modules if n not in saved_modules]:
            del sys.modules[name]
        sys.modules.update(saved_modules)
        sys.path[:] = saved_path
        sys.setrecursionlimit(saved_limit)
        multiprocessing.reduction.ForkingPickler = saved_pickler  # type: ignore[misc]
        multiprocessing.reduction.dump = saved_dump
        os.chdir(cwd)
