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


def punkt_tab_folder(tmp: Path) -> Path:
    """An NLTK data folder holding ``tokenizers/punkt_tab/english`` written from the Punkt model we ship.

    NLTK then loads it with its own ``PunktTokenizer``, so the reference takes NLTK's loading path,
    not ours.
    """
    from punkt.data import load_module

    model = load_module("english")
    root = tmp / "nltk_data"
    english = root / "tokenizers" / "punkt_tab" / "english"
    english.mkdir(parents=True)
    (english / "abbrev_types.txt").write_text("".join(f"{a}\n" for a in sorted(model.ABBREV_TYPES)), "utf-8")
    (english / "sent_starters.txt").write_text("".join(f"{s}\n" for s in sorted(model.SENT_STARTERS)), "utf-8")
    (english / "collocations.tab").write_text("".join(f"{a}\t{b}\n" for a, b in sorted(model.COLLOCATIONS)), "utf-8")
    (english / "ortho_context.tab").write_text(
        "".join(f"{k}\t{v}\n" for k, v in sorted(model.ORTHO_CONTEXT.items())), "utf-8"
    )
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
