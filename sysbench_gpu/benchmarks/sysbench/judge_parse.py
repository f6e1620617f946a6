"""Safe parsing of a judge's reply into verdicts.

Judge text is data, never code: this module only scans characters and calls
``json.loads``. There is no eval, exec or ``ast.literal_eval`` anywhere, so a
reply such as ``{"评判结果": __import__('os').system(...)}`` is simply not JSON
and fails to parse.

Steps:

1. Candidates: the bodies of fenced code blocks (```json ... ```), then every
   balanced ``{...}`` object in the text, found by a scan that knows about
   double- and single-quoted strings and escapes (braces inside strings do not
   count).
2. Each candidate goes to ``json.loads``; if that fails, to ``repair`` (``benchmarks.judge_text``) and then
   ``json.loads`` once more. The repair is small and only rewrites tokens, it
   never guesses content: (a) a single-quoted string becomes a double-quoted
   one, (b) a bare integer key (``{1: "是"}``) is quoted, (c) a comma right
   before ``}`` or ``]`` is dropped. Text inside double-quoted strings is never
   touched.
3. The first candidate that is an object holding a verdict map wins. Verdict
   maps are found under ``评判结果`` / ``verdicts`` (or ``verdict``,
   ``conclusion``, ``结论``); an object whose keys are all integers is taken as
   the verdict map itself. Reasoning is read from ``评判理由`` / ``reasoning``.
4. Keys are integers written as JSON strings (``"1"``, ``" 2 "``) or, after the
   repair, bare integers; they must equal the checklist numbers exactly.
   Values must be non-empty strings or booleans; they are kept raw and read
   with ``core.verdicts.live_verdict``: yes and no forms (是, 不是, 未满足, "No, it
   does not", "NO.") -> yes / no, the not-applicable family (不适用, 无法判断,
   N/A) -> other. Any other value (部分是, "maybe", a line of code), a number,
   null, list, object or empty string makes the reply a failure, not a guess:
   it is retried, and recorded ``unparsed`` when every attempt fails.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sysbench_gpu.benchmarks.judge_tasks import ReplyReading
from sysbench_gpu.benchmarks.judge_text import balanced_objects, repair
from sysbench_gpu.benchmarks.sysbench.judge_prompt import verdict_schema
from sysbench_gpu.core.records import Verdict
from sysbench_gpu.core.sessions import Constraint
from sysbench_gpu.core.verdicts import live_verdict

VERDICT_KEYS = ("评判结果", "verdicts", "verdict", "conclusion", "结论")
REASONING_KEYS = ("评判理由", "reasoning", "reason", "理由")

_FENCE = re.compile(r"```[ \t]*(?:json|JSON|json5)?[ \t]*\n?(.*?)```", re.DOTALL)
_INT_KEY = re.compile(r"\s*[+-]?\d+\s*\Z")
MAX_CANDIDATES = 50  # a reply with thousands of braces is not worth scanning further


@dataclass
class ParseResult:
    ok: bool
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    reasoning: str | None = None
    error: str | None = None  # why it failed, for logs and the unparsed record
    repaired: bool = False  # the JSON needed the documented repair


def parse_reply(text: str | None, constraints: Sequence[Constraint]) -> ParseResult:
    """Verdicts for ``constraints`` from a judge's reply, or a failure reason."""
    if not text or not text.strip():
        return ParseResult(ok=False, error="empty reply")
    expected = {c.id: c for c in constraints}
    first_error: str | None = None
    found_object = False
    for candidate in _candidates(text):
        obj, repaired = _load_object(candidate)
        if obj is None:
            continue
        found_object = True
        verdict_map, reasoning = _locate(obj)
        if verdict_map is None:
            first_error = first_error or "JSON object has no verdict map (评判结果 / verdicts)"
            continue
        result = _check_verdicts(verdict_map, expected)
        if result.ok:
            result.reasoning = reasoning
            result.repaired = repaired
            return result
        first_error = first_error or result.error
    if first_error:
        return ParseResult(ok=False, error=first_error)
    return ParseResult(ok=False, error="no JSON object found" if not found_object else "no usable JSON object")


# ------------------------------------------------------------------ candidates


def _candidates(text: str) -> Iterator[str]:
    seen: set[str] = set()
    count = 0
    for match in _FENCE.finditer(text):
        body = match.group(1).strip()
        if body and body not in seen:
            seen.add(body)
            count += 1
            yield body
    for block in balanced_objects(text):
        if block not in seen:
            seen.add(block)
            count += 1
            yield block
        if count >= MAX_CANDIDATES:
            return


# ------------------------------------------------------------------ JSON + repair


def _load_object(candidate: str) -> tuple[dict[str, Any] | None, bool]:
    for repaired, body in ((False, candidate), (True, None)):
        if body is None:
            body = repair(candidate)
            if body == candidate:
                return None, False
        try:
            value = json.loads(body, object_pairs_hook=_reject_duplicates)
        except (json.JSONDecodeError, _DuplicateKey, RecursionError):
            continue
        if isinstance(value, dict):
            return value, repaired
        return None, False
    return None, False


class _DuplicateKey(ValueError):
    pass


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


# ------------------------------------------------------------------ verdicts


def _locate(obj: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    reasoning = None
    for key in REASONING_KEYS:
        value = obj.get(key)
        if isinstance(value, str):
            reasoning = value
            break
        if value is not None:
            reasoning = json.dumps(value, ensure_ascii=False)
            break
    for key in VERDICT_KEYS:
        if key in obj:
            value = obj[key]
            return (value if isinstance(value, dict) else None), reasoning
    if obj and all(_INT_KEY.match(k) for k in obj):
        return obj, reasoning
    return None, reasoning


def _check_verdicts(verdict_map: dict[str, Any], expected: dict[int, Constraint]) -> ParseResult:
    by_number: dict[int, Any] = {}
    for key, value in verdict_map.items():
        if not _INT_KEY.match(key):
            return ParseResult(ok=False, error=f"verdict key {key!r} is not a checklist number")
        number = int(key)
        if number in by_number:
            return ParseResult(ok=False, error=f"verdict key {number} appears twice")
        by_number[number] = value
    if set(by_number) != set(expected):
        missing = sorted(set(expected) - set(by_number))
        extra = sorted(set(by_number) - set(expected))
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if extra:
            parts.append(f"unexpected {extra}")
        return ParseResult(ok=False, error=f"verdict keys differ from the checklist: {', '.join(parts)}")
    verdicts: dict[str, Verdict] = {}
    for number in sorted(expected):
        value = by_number[number]
        if isinstance(value, bool):
            raw = "true" if value else "false"
        elif isinstance(value, str) and value.strip():
            raw = value
        else:
            shown = json.dumps(value, ensure_ascii=False)[:40]
            return ParseResult(ok=False, error=f"verdict {number} is {shown}, not a verdict string")
        normalized = live_verdict(value)
        if normalized is None:
            shown = json.dumps(value, ensure_ascii=False)[:40]
            return ParseResult(ok=False, error=f"verdict {number} is {shown}, not yes, no or not applicable")
        verdicts[str(number)] = Verdict(raw=raw, value=normalized, type=expected[number].type)
    return ParseResult(ok=True, verdicts=verdicts)


@dataclass(frozen=True)
class ChecklistReply:
    """A SysBench judge reply: a verdict for each checklist item, with reasoning (``ReplyFormat``)."""

    constraints: tuple[Constraint, ...]
    language: str

    def schema(self, max_reasoning_chars: int | None) -> dict[str, Any]:
        return verdict_schema(tuple(c.id for c in self.constraints), self.language, max_reasoning_chars)

    def read(self, text: str | None) -> ReplyReading:
        parsed = parse_reply(text, self.constraints)
        return ReplyReading(
            ok=parsed.ok,
            verdicts=parsed.verdicts,
            reasoning=parsed.reasoning,
            error=parsed.error,
            repaired=parsed.repaired,
        )
