"""The authors' judge prompts and the articles they quote: where they are read from, how fetched, how filled.

Five files are MT-Eval's instrument, like its data, so none of their text is in this package:
the four prompt files of ``prompts/`` and ``raw_data/documents.jsonl`` (the 100 articles whose
text ``evaluate.py`` puts in ``{content}``). They are read at run time from one folder:

- ``$SYSBENCH_MTEVAL_PROMPTS`` when set (tests and CI point it at ``../shared/mteval/prompts``);
- else the user cache (``$SYSBENCH_GPU_CACHE``, ``$XDG_CACHE_HOME/sysbench-gpu`` or
  ``~/.cache/sysbench-gpu``) under ``mteval-prompts/<commit>/``, filled once from the official
  repository at the pinned commit.

Every file is checked against its pinned SHA-256 wherever it comes from, so a run names exactly
the instrument it used. Filling follows the authors' ``evaluate.py`` per task: chained plain
replacements in their order, the reply unstripped for refinement and stripped elsewhere,
constraints numbered only for multi-turn refinement, no counts for expansion, for follow-up the
reply as the conversation's last assistant line, and ``{content}`` the article of
``documents.jsonl`` that the turn id names, its first paragraph (the topic line) cut off. Then,
as the authors' client (``utils/openai_generate.py``) does before it sends a prompt, every
backslash followed by ``n`` (two characters) becomes a newline: the prompt is what their
client sends, byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sysbench_gpu.benchmarks.mteval.judge_prompt import (
    ScoreTemplate,
    judge_kind,
    turn_constraints,
)
from sysbench_gpu.benchmarks.mteval.sentences import count_sentences, count_words
from sysbench_gpu.core.errors import SysbenchError, where
from sysbench_gpu.core.rundir import write_bytes_atomic
from sysbench_gpu.core.sessions import Session

OFFICIAL_REPOSITORY = "KwanWaiChung/MT-Eval"
OFFICIAL_COMMIT = "bfe3a46e41c9837a8ca2a9957c1b1699e5fffef1"
OFFICIAL_SOURCE = f"https://raw.githubusercontent.com/{OFFICIAL_REPOSITORY}/{OFFICIAL_COMMIT}/prompts/"
PROMPTS_ENV = "SYSBENCH_MTEVAL_PROMPTS"
DOWNLOAD_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class PinnedFile:
    filename: str
    sha256: str


@dataclass(frozen=True)
class PromptFile(PinnedFile):
    kind: str  # which turns it scores: refinement_single | refinement_multi | expansion | follow-up


PROMPT_FILES: tuple[PromptFile, ...] = (
    PromptFile(
        kind="refinement_single",
        filename="refinement_single_evaluation.txt",
        sha256="36a15a0957a76ca56e116914f61029541b959d8c58ce0da90fb367173123f372",
    ),
    PromptFile(
        kind="refinement_multi",
        filename="refinement_multi_evaluation.txt",
        sha256="a8831d27d6c94b00cdaa821aef0232317b278810610530ed3eff519571322683",
    ),
    PromptFile(
        kind="expansion",
        filename="expansion_evaluation.txt",
        sha256="8168474867af2134fe968b1df800390bd4fa1b97ef52202b328de699780e293d",
    ),
    PromptFile(
        kind="follow-up",
        filename="mt-bench_evaluation.txt",
        sha256="bde1551acb09d7a411f183098715be7b5de376a2a182c531ed482f4341ee59dd",
    ),
)
# raw_data/documents.jsonl at the same commit: the articles evaluate.py quotes in {content}.
DOCUMENTS_FILE = PinnedFile(
    filename="documents.jsonl", sha256="229204aa4c31d84c9ef2e53b1aeb1bb991ea54e0a8f485fc9219d8125c87117f"
)
PINNED_FILES: tuple[PinnedFile, ...] = (*PROMPT_FILES, DOCUMENTS_FILE)
OFFICIAL_KINDS: tuple[str, ...] = tuple(f.kind for f in PROMPT_FILES)
# The prompts with a {content} placeholder, which get the documents.
KINDS_WITH_DOCUMENT: frozenset[str] = frozenset({"refinement_single", "refinement_multi", "expansion"})


def cache_root() -> Path:
    """The user cache of sysbench-gpu (the same rule as the model cache)."""
    explicit = os.environ.get("SYSBENCH_GPU_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sysbench-gpu"


def prompts_folder() -> tuple[Path, bool]:
    """The folder the prompts are read from, and whether it is the cache (which may be filled by a download)."""
    explicit = os.environ.get(PROMPTS_ENV)
    if explicit:
        return Path(explicit), False
    return cache_root() / "mteval-prompts" / OFFICIAL_COMMIT[:7], True


def load_official_prompts(folder: Path | None = None, *, source: str = OFFICIAL_SOURCE) -> dict[str, ScoreTemplate]:
    """The four official templates by kind, each checked against its pinned SHA-256, with the documents.

    The templates with ``{content}`` carry the articles of ``documents.jsonl`` (checked the same way).
    ``folder`` None: ``prompts_folder()``; the cache is filled from ``source`` first when it lacks a file.
    """
    cached = False
    if folder is None:
        folder, cached = prompts_folder()
    if cached and any(not (folder / f.filename).is_file() for f in PINNED_FILES):
        download_prompts(folder, source=source)
    payloads = {file.filename: _read_pinned(folder, file) for file in PINNED_FILES}
    documents = parse_documents(payloads[DOCUMENTS_FILE.filename], str(folder / DOCUMENTS_FILE.filename))
    templates: dict[str, ScoreTemplate] = {}
    for file in PROMPT_FILES:
        templates[file.kind] = ScoreTemplate(
            name=f"official:{file.filename}",
            kind=file.kind,
            text=payloads[file.filename].decode("utf-8"),
            sha256=file.sha256,
            documents=documents if file.kind in KINDS_WITH_DOCUMENT else (),
        )
    return templates


def _read_pinned(folder: Path, file: PinnedFile) -> bytes:
    path = folder / file.filename
    if not path.is_file():
        raise SysbenchError(
            f"{path}: no such file; {PROMPTS_ENV} must name a folder holding MT-Eval's four prompt files "
            f"(prompts/ at commit {OFFICIAL_COMMIT[:7]}) and {DOCUMENTS_FILE.filename} (its raw_data/)"
        )
    payload = path.read_bytes()
    _check_sum(file, payload, str(path))
    return payload


def parse_documents(payload: bytes, shown: str) -> tuple[str, ...]:
    """The articles of ``documents.jsonl`` in file order, each without its first paragraph, as ``evaluate.py`` trims.

    Each line's ``gen_resp`` opens with a topic line and a blank line before the article.
    """
    articles: list[str] = []
    for line_no, line in enumerate(payload.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            text = json.loads(line).get("gen_resp")
        except (ValueError, AttributeError):
            text = None
        if not isinstance(text, str) or "\n\n" not in text:
            raise SysbenchError(f"{shown}: line {line_no}: no 'gen_resp' text with a topic paragraph")
        articles.append(text.split("\n\n", 1)[1])
    return tuple(articles)


def download_prompts(dest: Path, *, source: str = OFFICIAL_SOURCE, timeout: float = DOWNLOAD_TIMEOUT_S) -> list[Path]:
    """Fetch the four prompt files and the documents from ``source`` (a URL ending in ``/``), check each sum,
    write them into ``dest``.

    All five are fetched and checked before any is written, so the folder never holds a partial set.
    ``source`` is the repository's ``prompts/``; the documents are fetched from ``../raw_data/`` beside it.
    """
    payloads: list[tuple[PinnedFile, bytes]] = []
    for file in PINNED_FILES:
        url = source + file.filename if file is not DOCUMENTS_FILE else _documents_url(source)
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - a fixed https URL or a test's file:
                payload = response.read()
        except (OSError, ValueError) as error:
            raise SysbenchError(
                f"could not download {file.filename} of MT-Eval's judge prompts from {url}: {_reason(error)}. "
                f"Offline? Copy prompts/ and raw_data/{DOCUMENTS_FILE.filename} of {OFFICIAL_REPOSITORY} at commit "
                f"{OFFICIAL_COMMIT[:7]} into {dest} (or set {PROMPTS_ENV} to a folder holding them), "
                "or pass --judge-prompts ours"
            ) from None
        _check_sum(file, payload, url)
        payloads.append((file, payload))
    written = []
    for file, payload in payloads:
        target = Path(dest) / file.filename
        write_bytes_atomic(target, payload)
        written.append(target)
    return written


def _documents_url(source: str) -> str:
    # The repository keeps the documents in raw_data/, beside prompts/; a mirror folder that is not
    # named prompts/ holds all five files itself.
    if source.endswith("/prompts/"):
        return source[: -len("prompts/")] + "raw_data/" + DOCUMENTS_FILE.filename
    return source + DOCUMENTS_FILE.filename


def _check_sum(file: PinnedFile, payload: bytes, shown: str) -> None:
    digest = hashlib.sha256(payload).hexdigest()
    if digest != file.sha256:
        raise SysbenchError(
            f"{shown}: sha256 {digest[:12]}… is not the pinned {file.sha256[:12]}… of {file.filename} "
            f"at commit {OFFICIAL_COMMIT[:7]}"
        )


def _reason(error: BaseException) -> str:
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code}"
    if isinstance(error, urllib.error.URLError):
        return str(getattr(error.reason, "strerror", None) or error.reason)
    return " ".join(str(error).split())[:200] or type(error).__name__


# ------------------------------------------------------------------ filling


def official_kind(session: Session) -> str:
    """Which official prompt scores this dialogue's turns (the choice ``evaluate.py`` makes per task)."""
    kind = judge_kind(session)
    if kind == "refinement":
        single = session.task == "refinement" and session.mteval is not None and session.mteval.setting == "single"
        return "refinement_single" if single else "refinement_multi"
    return kind


def render_official_prompt(template: ScoreTemplate, session: Session, turn_index: int, response: str) -> str:
    """The official prompt for one answered turn, as the authors' client sends it (see the module doc)."""
    kind = official_kind(session)
    if kind != template.kind:
        raise SysbenchError(f"session {session.system_id}: a {kind} dialogue, but the prompt is for {template.kind}")
    if kind in ("refinement_single", "refinement_multi"):
        constraints = turn_constraints(session, turn_index)
        listed = constraints[-1] if kind == "refinement_single" else _numbered(constraints)
        values: Sequence[tuple[str, str]] = (
            ("{response}", response),
            ("{content}", official_document(template, session, turn_index)),
            ("{num_words}", str(count_words(response))),
            ("{num_sent}", str(count_sentences(response))),
            ("{constraints}", listed),
        )
    elif kind == "expansion":
        values = (
            ("{response}", response.strip()),
            ("{content}", official_document(template, session, turn_index)),
            ("{constraints}", turn_constraints(session, turn_index)[-1]),
        )
    else:
        reply = response.strip()
        values = (
            ("{conversation}", "\n".join(_follow_up_lines(session, turn_index, reply))),
            ("{num_words}", str(count_words(reply))),
            ("{num_sent}", str(count_sentences(reply))),
        )
    return as_client_sends(_fill(template.text, values))


def as_client_sends(prompt: str) -> str:
    """The prompt as the authors' ``generate`` sends it: each backslash-n pair (two characters) made a newline.

    Their client does this to every prompt before the request; replies, articles and
    constraints that spell ``\\n`` out reach the judge as line breaks.
    """
    return prompt.replace("\\n", "\n")


def _fill(text: str, values: Sequence[tuple[str, str]]) -> str:
    # One plain replacement after another, in the authors' order: a value that holds a later
    # placeholder is filled too, as it is upstream.
    for placeholder, value in values:
        text = text.replace(placeholder, value)
    return text


def official_document(template: ScoreTemplate, session: Session, turn_index: int) -> str:
    """The article ``evaluate.py`` puts in ``{content}``: the one of ``documents.jsonl`` the turn id numbers.

    The number is the id's part before the first ``_`` (after the ``#`` in single-turn expansion
    ids, ``4#4_cls_1``), counted from 1. Multi-turn refinement reads it from the dialogue's first
    turn, as ``evaluate.py`` does; in the irrelevant-context ablation that turn is an unrelated
    one with a hash for an id (the authors' ablation scorer stops there), so the first answered
    turn names it instead.
    """
    if not template.documents:
        raise SysbenchError(
            f"{template.name}: no documents to fill {{content}} from (load_official_prompts gives them)"
        )
    kind = template.kind
    single = session.mteval is not None and session.mteval.setting == "single"
    source = session.turn(turn_index)
    if kind == "refinement_multi":
        source = session.turns[0] if session.task == "refinement" else next(t for t in session.turns if t.answered)
    turn_id = source.mteval.turn_id if source.mteval is not None else ""
    head = turn_id.split("#")[1] if kind == "expansion" and single and "#" in turn_id else turn_id
    number = head.split("_")[0]
    if not (number.isascii() and number.isdigit()) or not 1 <= int(number) <= len(template.documents):
        raise SysbenchError(
            f"{where(None, session.system_id, source.index, 'id')}: {turn_id!r} names no article of "
            f"{DOCUMENTS_FILE.filename} (1 to {len(template.documents)} before the first '_')"
        )
    return template.documents[int(number) - 1]


def _numbered(constraints: Sequence[str]) -> str:
    return "\n".join(f"{n}. {c}" for n, c in enumerate(constraints, 1))


def _follow_up_lines(session: Session, turn_index: int, reply: str) -> list[str]:
    """The previous exchange (its reference reply), the user's message, then the graded reply."""
    turn = session.turn(turn_index)
    lines: list[str] = []
    single = session.mteval is not None and session.mteval.setting == "single"
    if turn_index > 1 and not single:
        previous = session.turn(turn_index - 1)
        if previous.reference is None:
            raise SysbenchError(f"{where(None, session.system_id, turn_index - 1, 'sys')}: no reply to show the judge")
        lines += [f"User: {previous.user.strip()}", f"Assistant: {previous.reference.strip()}"]
    lines += [f"User: {turn.user.strip()}", f"Assistant: {reply}"]
    return lines


def official_templates_by_kind(templates: Mapping[str, ScoreTemplate]) -> dict[str, str]:
    """{kind: sha256} of a template set, for the manifest."""
    return {kind: t.sha256 for kind, t in templates.items()}
