"""Judge prompts and replies as text, shared by every benchmark's judge: templates with named fields, the conversation
shown, and JSON objects found and repaired in a reply without ever evaluating it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from sysbench_gpu.core.errors import SysbenchError

_NO_HISTORY = {"zh": "（无，这是第一轮）", "en": "(none: this is the first round)"}


_FIELD = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class HistoryMessage:
    role: str  # user | assistant
    content: str


def template_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def template_fields(text: str, source: str = "<template>") -> list[str]:
    """Placeholder names in order of appearance; malformed fields are errors."""
    names: list[str] = []
    for match in _FIELD.finditer(text):
        token = match.group(0)
        if token in ("{{", "}}"):
            continue
        if match.group(1) is None:
            line = text.count("\n", 0, match.start()) + 1
            raise SysbenchError(f"{source}: line {line}: single {token!r}; write {token * 2!r} for a literal brace")
        name = match.group(1).strip()
        if not _NAME.match(name):
            line = text.count("\n", 0, match.start()) + 1
            raise SysbenchError(f"{source}: line {line}: placeholder {{{match.group(1)}}} is not a plain name")
        names.append(name)
    return names


def substitute(text: str, values: Mapping[str, str], source: str = "<template>") -> str:
    """One pass over ``text``: ``{name}`` -> ``values[name]``, ``{{``/``}}`` -> a brace."""

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "{{":
            return "{"
        if token == "}}":
            return "}"
        name = (match.group(1) or "").strip()
        if match.group(1) is None or name not in values:
            raise SysbenchError(f"{source}: unknown placeholder {token}")
        return values[name]

    return _FIELD.sub(replace, text)


def format_history(history: Sequence[HistoryMessage], language: str) -> str:
    if not history:
        return _NO_HISTORY[language]
    blocks = [f"<role: {m.role}>\n<content>\n{m.content}\n</content>" for m in history]
    return "\n".join(blocks)


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


def repair(text: str) -> str:
    """The token-level repair documented in ``benchmarks.sysbench.judge_parse`` (step 2); returns new text."""
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
