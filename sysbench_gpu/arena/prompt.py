"""The pairwise judge's prompt and how its reply is read (never evaluated).

The judge sees the system message, the user turns and each assistant's conversation up to
the turn, and answers which final reply better follows the system message and the user:
``{"reason": "...", "winner": "A" | "B" | "tie"}``. Under vLLM and hf, guided decoding holds
the reply to that schema; other judges may also answer a bare ``A``, ``B`` or ``tie`` first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.judge_tasks import ReplyReading
from sysbench_gpu.benchmarks.judge_text import balanced_objects, substitute, template_fields, template_hash
from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError

CHOICES = ("A", "B", "tie")
MAX_REASON_CHARS = 600
FIELDS = ("system", "conversation_a", "conversation_b")

DEFAULT_TEMPLATE = """You compare two AI assistants. Both were given the same system message and the same user \
turns; each conversation below shows its own earlier replies. Judge only the final reply of each conversation.

Decide which final reply better follows the system message and the user's last message: every instruction and \
constraint of the system message (role, format, style, content, actions), and what the user asked. Length is not \
a merit in itself. Do not prefer a reply for being shown first.

[System message]
{system}

[Conversation with assistant A]
{conversation_a}

[Conversation with assistant B]
{conversation_b}

Answer with one JSON object and nothing else: {{"reason": "<one or two sentences>", "winner": "A"}} where winner is \
"A", "B" or "tie".
"""


@dataclass(frozen=True)
class ArenaTemplate:
    text: str
    source: str  # "built-in" or the file's path

    @property
    def sha256(self) -> str:
        return template_hash(self.text)


def load_template(path: str | None) -> ArenaTemplate:
    if path is None:
        return ArenaTemplate(DEFAULT_TEMPLATE, "built-in")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise SysbenchError(f"--template {path}: cannot read ({error})") from None
    found = template_fields(text, source=f"--template {path}")
    missing = [name for name in FIELDS if name not in found]
    if missing:
        raise SysbenchError(f"--template {path}: field {{{missing[0]}}} is missing (needs {', '.join(FIELDS)})")
    # Checked here, not when the first question is rendered: a template refused later would already be recorded.
    unknown = [name for name in found if name not in FIELDS]
    if unknown:
        raise SysbenchError(
            f"--template {path}: field {{{unknown[0]}}} is not one of {', '.join(FIELDS)} "
            "(write {{ and }} for a literal brace)"
        )
    return ArenaTemplate(text, path)


def transcript(messages: Sequence[ChatMessage], reply: str) -> str:
    """A conversation as the judge reads it: user and assistant turns, then the reply judged (the system apart)."""
    lines = []
    for message in messages:
        if message["role"] == "system":
            continue
        speaker = "User" if message["role"] == "user" else "Assistant"
        lines.append(f"<{speaker}>\n{message['content']}\n</{speaker}>")
    lines.append(f"<Assistant final reply>\n{reply}\n</Assistant final reply>")
    return "\n".join(lines)


def render(template: ArenaTemplate, system: str, first: str, second: str) -> str:
    return substitute(
        template.text,
        {"system": system, "conversation_a": first, "conversation_b": second},
        source=template.source,
    )


_BARE = re.compile(r"^\W*(A|B|tie)\b\W*(.*)$", re.IGNORECASE | re.DOTALL)
SCORE_OF = {"A": 1.0, "B": 0.0, "tie": 0.5}  # A's score: how the choice travels through the judge's records


class ArenaReply:
    """The reply format of a pairwise task (``benchmarks.judge_tasks.ReplyFormat``)."""

    def schema(self, max_reasoning_chars: int | None) -> dict[str, Any]:
        limit = min(max_reasoning_chars or MAX_REASON_CHARS, MAX_REASON_CHARS)
        return {
            "type": "object",
            "properties": {
                "reason": {"type": "string", "maxLength": limit},
                "winner": {"type": "string", "enum": list(CHOICES)},
            },
            "required": ["reason", "winner"],
            "additionalProperties": False,
        }

    def read(self, text: str | None) -> ReplyReading:
        if not text or not text.strip():
            return ReplyReading(ok=False, error="empty reply")
        for candidate in balanced_objects(text):
            try:
                obj = json.loads(candidate)
            except (json.JSONDecodeError, RecursionError):
                continue
            if isinstance(obj, dict) and "winner" in obj:
                return _reading(obj.get("winner"), obj.get("reason"))
        bare = _BARE.match(text.strip())
        if bare:
            return _reading(bare.group(1), bare.group(2).strip() or None)
        return ReplyReading(ok=False, error="no winner (A, B or tie) found")


def _reading(choice: object, reason: object) -> ReplyReading:
    if not isinstance(choice, str):
        return ReplyReading(ok=False, error=f"winner is not a string: {choice!r}")
    name = {"a": "A", "b": "B", "tie": "tie"}.get(choice.strip().lower())
    if name is None:
        return ReplyReading(ok=False, error=f"winner {choice!r} is not A, B or tie")
    text = reason if isinstance(reason, str) else None
    return ReplyReading(ok=True, reasoning=text, score=SCORE_OF[name])
