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
2. Each candidate goes to ``json.loads``; if that fails, to ``repair`` and then
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
   with ``verdicts.live_verdict``: yes and no forms (是, 不是, 未满足, "No, it
   does not", "NO.") -> yes / no, the not-applicable family (不适用, 无法判断,
   N/A) -> other. Any other value (部分是, "maybe", a line of code), a number,
   null, list, object or empty string makes the reply a failure, not a guess:
   it is retried, and recorded ``unparsed`` when every attempt fails.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from sysbench_gpu.data import Constraint
from sysbench_gpu.runstore import Verdict
from sysbench_gpu.verdicts import live_verdict

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


def balanced_objects(text: str) -> Iterator[str]:
    """Every outermost ``{...}`` span, skipping braces inside quoted strings."""
    start = -1
    depth = 0
    quote: str | None = None
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if quote is not None:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = None
            elif ch == "\n" and quote == "'":
                # An apostrophe in prose is not a string opener; forget it at line end.
                quote = None
        elif depth > 0 and ch in "\"'":
            quote = ch
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                yield text[start : i + 1]
        i += 1


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


def repair(text: str) -> str:
    """The documented token-level repair (see the module doc); returns new text."""
    out: list[str] = []
    last = ""  # the last non-blank character written, to recognise key positions
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            end = _string_end(text, i, '"')
            out.append(text[i:end])
            last = '"'
            i = end
            continue
        if ch == "'":
            end = _string_end(text, i, "'")
            body = text[i + 1 : end - 1] if end - 1 > i else ""
            out.append(json.dumps(_unescape_single(body), ensure_ascii=False))
            last = '"'
            i = end
            continue
        if ch == ",":
            j = i + 1
            while j < n and text[j] in " \t\r\n":
                j += 1
            if j < n and text[j] in "}]":
                i += 1  # trailing comma
                continue
        if ch.isdigit() or ch in "+-":
            # A bare integer key: previous significant char is { or , and next is ':'.
            j = i + 1
            while j < n and text[j].isdigit():
                j += 1
            k = j
            while k < n and text[k] in " \t":
                k += 1
            if k < n and text[k] == ":" and last in ("{", ",") and text[i:j].lstrip("+-").isdigit():
                out.append(f'"{text[i:j]}"')
                last = '"'
                i = j
                continue
        out.append(ch)
        if not ch.isspace():
            last = ch
        i += 1
    return "".join(out)


def _string_end(text: str, start: int, quote: str) -> int:
    """Index just past the closing quote (or the end of text when unterminated)."""
    i = start + 1
    n = len(text)
    while i < n:
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == quote:
            return i + 1
        i += 1
    return n


def _unescape_single(body: str) -> str:
    # Only the escapes a single-quoted string needs; anything else stays literal.
    return body.replace("\\'", "'").replace('\\"', '"').replace("\\\\", "\\")


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
