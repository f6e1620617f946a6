"""The 1-10 LLM judge of MT-Eval's refinement, expansion and follow-up turns: prompt, parser, schema.

Like upstream's judge, the prompt gives the document the dialogue is about (the text after
``Content:`` in the dialogue's first such user message), the reply, its word and sentence
counts, and the constraints: for refinement every ``inst`` of the current run of turns with
the same task type (``1_sum_1``, ``1_sum_2``, ...; the list restarts when the type changes),
for expansion the turn's own ``inst``. Follow-up turns get the preceding exchange with its
reference reply (as upstream does), the user's message, and the reply. The wording is ours;
templates are files under ``templates/`` rendered with the SysBench judge's safe substitution
(``benchmarks.judge_text``).

A reply is valid when it holds a JSON object with an integer ``score`` from 1 to 10 (keys in
any case); a string ``rationale`` beside it is kept when there is one, and a reply that holds
only the score is valid too, as the authors' parser takes it. Anything else is invalid, to be
retried and finally recorded as unparsed. Nothing is evaluated: ``json.loads``, and the SysBench parser's small
token-level ``repair`` (single quotes, bare keys, trailing commas; ``benchmarks.judge_text``) when that fails.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.judge_tasks import ReplyReading
from sysbench_gpu.benchmarks.judge_text import (
    HistoryMessage,
    balanced_objects,
    format_history,
    repair,
    substitute,
    template_fields,
    template_hash,
)
from sysbench_gpu.benchmarks.mteval.data import answered_turns
from sysbench_gpu.benchmarks.mteval.sentences import count_sentences, count_words
from sysbench_gpu.benchmarks.mteval.tasks import TASKS
from sysbench_gpu.core.errors import SysbenchError, where
from sysbench_gpu.core.sessions import Session

MIN_SCORE, MAX_SCORE = 1, 10
SCORE_KEY, RATIONALE_KEY = "score", "rationale"
_RATIONALE_ALIASES = ("rationale", "reasoning", "reason")
KINDS = ("refinement", "expansion", "follow-up")
BUILTIN_TEMPLATES: Mapping[str, str] = {kind: f"mteval_{kind}.txt" for kind in KINDS}
PLACEHOLDERS: Mapping[str, str] = {
    "document": "the document the dialogue is about (refinement, expansion)",
    "constraints": "the constraints, one numbered line each (refinement, expansion)",
    "conversation": "the exchange before the reply and the user's message (follow-up)",
    "response": "the reply under evaluation",
    "num_words": "whitespace-separated words in the reply",
    "num_sentences": "sentences in the reply (NLTK Punkt, as the authors count)",
}
REQUIRED: Mapping[str, tuple[str, ...]] = {
    "refinement": ("document", "constraints", "response"),
    "expansion": ("document", "constraints", "response"),
    "follow-up": ("conversation", "response"),
}
_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)
_CONTENT_PREFIX = "Content:"
_INSTRUCTION_MARK = "\n\nInstruction:"
MAX_CANDIDATES = 50


@dataclass(frozen=True)
class ScoreTemplate:
    name: str  # the kind of a built-in template, or the file path
    kind: str  # refinement | expansion | follow-up (official: refinement_single | refinement_multi | ...)
    text: str
    sha256: str
    # Official prompts with {content}: the articles of the authors' documents.jsonl, in file order.
    documents: tuple[str, ...] = field(default=(), repr=False)


def judge_kind(session: Session) -> str:
    """Which judge template scores this dialogue's turns; an error for rule-scored tasks."""
    info = TASKS.get(session.task or "")
    if info is None or info.scorer != "judge":
        raise SysbenchError(f"session {session.system_id}: task {session.task!r} is not scored by the LLM judge")
    return "refinement" if info.category == "refinement-irrelevant" else info.category


def load_score_template(kind: str, path: str | Path | None = None) -> ScoreTemplate:
    """The built-in template of ``kind``, or the file at ``path`` checked for that kind's placeholders."""
    if kind not in KINDS:
        raise SysbenchError(f"unknown MT-Eval judge kind {kind!r} (known: {', '.join(KINDS)})")
    if path is None:
        text = resources.files("sysbench_gpu").joinpath("templates", BUILTIN_TEMPLATES[kind]).read_text("utf-8")
        name = kind
    else:
        file = Path(path)
        if not file.is_file():
            raise SysbenchError(f"{file}: no such template file")
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise SysbenchError(f"{file}: template is not UTF-8 text") from None
        name = str(file)
    names = template_fields(text, name)
    unknown = sorted(set(names) - set(PLACEHOLDERS))
    if unknown:
        raise SysbenchError(
            f"{name}: unknown placeholder(s) {', '.join('{' + n + '}' for n in unknown)} "
            f"(known: {', '.join('{' + n + '}' for n in PLACEHOLDERS)})"
        )
    missing = [n for n in REQUIRED[kind] if n not in names]
    if missing:
        raise SysbenchError(f"{name}: a {kind} template needs {', '.join('{' + n + '}' for n in missing)}")
    return ScoreTemplate(name=name, kind=kind, text=text, sha256=template_hash(text))


# ------------------------------------------------------------------ what the judge is shown


def dialogue_document(session: Session) -> str:
    """The document of a refinement or expansion dialogue: its first ``Content: ...`` user message, minus the
    instruction.
    """
    for turn in session.turns:
        body = turn.user.lstrip()
        if body.startswith(_CONTENT_PREFIX):
            end = body.rfind(_INSTRUCTION_MARK)
            return body[len(_CONTENT_PREFIX) : end if end > 0 else len(body)].strip()
    raise SysbenchError(f"{where(None, session.system_id, field='conv')}: no user message starts with 'Content:'")


def turn_constraints(session: Session, turn_index: int) -> list[str]:
    """The constraints a refinement or expansion turn is judged against (see the module doc)."""
    turn = session.turn(turn_index)
    if not turn.answered or turn.mteval is None or not turn.mteval.inst:
        raise SysbenchError(f"{where(None, session.system_id, turn_index, 'inst')}: no instruction to judge against")
    if judge_kind(session) != "refinement":
        return [turn.mteval.inst]
    constraints: list[str] = []
    run_type: str | None = None
    for earlier in answered_turns(session):
        if earlier.index > turn_index:
            break
        assert earlier.mteval is not None
        kind = _task_type(earlier.mteval.turn_id)
        if kind != run_type:
            constraints, run_type = [], kind
        constraints.append(earlier.mteval.inst or "")
    return constraints


def _task_type(turn_id: str) -> str:
    """``"1_sum_3"`` -> ``"sum"``: the middle part of a refinement turn id."""
    parts = turn_id.split("_")
    return parts[1] if len(parts) >= 3 else turn_id


def follow_up_conversation(
    session: Session, turn_index: int, previous_reply: str | None = None
) -> list[HistoryMessage]:
    """The exchange before a follow-up turn and the user's message.

    The previous assistant message is ``previous_reply`` when given, else the previous turn's
    reference (upstream shows the reference, whichever history the model had).
    """
    turn = session.turn(turn_index)
    messages: list[HistoryMessage] = []
    if turn_index > 1:
        previous = session.turn(turn_index - 1)
        reply = previous_reply if previous_reply is not None else previous.reference
        if reply is None:
            raise SysbenchError(f"{where(None, session.system_id, turn_index - 1, 'sys')}: no reply to show the judge")
        messages += [HistoryMessage("user", previous.user.strip()), HistoryMessage("assistant", reply.strip())]
    messages.append(HistoryMessage("user", turn.user.strip()))
    return messages


def render_score_prompt(
    template: ScoreTemplate,
    session: Session,
    turn_index: int,
    response: str,
    *,
    previous_reply: str | None = None,
) -> str:
    """The judge prompt for one answered turn and the model's ``response``."""
    kind = judge_kind(session)
    if kind != template.kind:
        raise SysbenchError(f"session {session.system_id}: a {kind} dialogue, but the template is for {template.kind}")
    reply = response.strip()
    values = {
        "response": reply,
        "num_words": str(count_words(reply)),
        "num_sentences": str(count_sentences(reply)),
        "document": "",
        "constraints": "",
        "conversation": "",
    }
    if kind == "follow-up":
        values["conversation"] = format_history(follow_up_conversation(session, turn_index, previous_reply), "en")
    else:
        values["document"] = dialogue_document(session)
        values["constraints"] = "\n".join(
            f"{n}. {c.strip()}" for n, c in enumerate(turn_constraints(session, turn_index), 1)
        )
    return substitute(template.text, values, template.name)


# ------------------------------------------------------------------ reply


@dataclass(frozen=True)
class ScoreParse:
    ok: bool
    score: int | None = None
    rationale: str | None = None
    error: str | None = None  # why the reply is invalid
    repaired: bool = False  # the JSON needed the documented repair


def parse_score_reply(text: str | None) -> ScoreParse:
    """The score and rationale of a judge reply, or why it is invalid (see the module doc)."""
    if not text or not text.strip():
        return ScoreParse(ok=False, error="empty reply")
    first_error: str | None = None
    for candidate in _candidates(text):
        obj, repaired = _load(candidate)
        if obj is None:
            continue
        result = _read_score(obj)
        if result.ok:
            return ScoreParse(ok=True, score=result.score, rationale=result.rationale, repaired=repaired)
        first_error = first_error or result.error
    return ScoreParse(ok=False, error=first_error or "no JSON object found")


def _candidates(text: str) -> Iterator[str]:
    seen: set[str] = set()
    bodies = [m.group(1).strip() for m in _FENCE.finditer(text)]
    for body in [*bodies, *balanced_objects(text)]:
        if body and body not in seen:
            seen.add(body)
            yield body
            if len(seen) >= MAX_CANDIDATES:
                return


def _load(candidate: str) -> tuple[dict[str, Any] | None, bool]:
    for repaired, body in ((False, candidate), (True, repair(candidate))):
        if repaired and body == candidate:
            break
        try:
            value = json.loads(body, object_pairs_hook=_no_duplicates)
        except (ValueError, RecursionError):
            continue
        return (value, repaired) if isinstance(value, dict) else (None, False)
    return None, False


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {key!r}")
        obj[key] = value
    return obj


def _read_score(obj: Mapping[str, Any]) -> ScoreParse:
    by_name: dict[str, list[Any]] = {}
    for key, value in obj.items():
        by_name.setdefault(key.strip().lower(), []).append(value)
    scores = by_name.get(SCORE_KEY, [])
    if len(scores) != 1:
        return ScoreParse(ok=False, error="no 'score' key" if not scores else "'score' appears in two spellings")
    # The rationale is kept where it is one string; the authors read the score alone.
    rationales = [v for name in _RATIONALE_ALIASES for v in by_name.get(name, [])]
    rationale = rationales[0] if len(rationales) == 1 and isinstance(rationales[0], str) else None
    score = scores[0]
    if isinstance(score, bool) or not isinstance(score, int):
        shown = json.dumps(score, ensure_ascii=False)[:40]
        return ScoreParse(ok=False, error=f"score {shown} is not an integer")
    if not MIN_SCORE <= score <= MAX_SCORE:
        return ScoreParse(ok=False, error=f"score {score} is outside {MIN_SCORE}..{MAX_SCORE}")
    return ScoreParse(ok=True, score=score, rationale=rationale)


def score_schema(max_rationale_chars: int | None = 2000) -> dict[str, Any]:
    """JSON schema of a valid reply, for guided decoding: the rationale first, then an integer score 1-10.

    The score is an ``enum`` of the ten integers, which every guided-decoding backend
    enforces (``minimum``/``maximum`` are not supported everywhere).
    """
    rationale: dict[str, Any] = {"type": "string"}
    if max_rationale_chars is not None:
        rationale["maxLength"] = max_rationale_chars
    return {
        "type": "object",
        "properties": {
            RATIONALE_KEY: rationale,
            SCORE_KEY: {"type": "integer", "enum": list(range(MIN_SCORE, MAX_SCORE + 1))},
        },
        "required": [RATIONALE_KEY, SCORE_KEY],
        "additionalProperties": False,
    }


def score_prompts_needed(sessions: Sequence[Session]) -> list[tuple[int, int]]:
    """The (system_id, turn) keys the LLM judge scores: answered turns of judge-scored dialogues."""
    keys = []
    for session in sessions:
        info = TASKS.get(session.task or "")
        if info is not None and info.scorer == "judge":
            keys += [(session.system_id, t.index) for t in answered_turns(session)]
    return keys


@dataclass(frozen=True)
class ScoreReply:
    """An MT-Eval judge reply: a 1-10 score with its rationale (``ReplyFormat``)."""

    def schema(self, max_reasoning_chars: int | None) -> dict[str, Any]:
        return score_schema(max_reasoning_chars)

    def read(self, text: str | None) -> ReplyReading:
        scored = parse_score_reply(text)
        if scored.ok and scored.score is not None:
            return ReplyReading(
                ok=True, score=float(scored.score), reasoning=scored.rationale, repaired=scored.repaired
            )
        return ReplyReading(ok=False, error=scored.error or "unparsable")
