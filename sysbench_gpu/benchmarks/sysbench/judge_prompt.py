"""Judge prompt templates: loading, safe rendering, hashing, and the verdict JSON schema.

A template is plain text with ``{placeholder}`` fields (see ``PLACEHOLDERS``);
``{{`` and ``}}`` stand for literal braces. Rendering is one regex pass (shared:
``benchmarks.judge_text``) that looks each name up in a dict of strings: nothing is evaluated, attribute or index
syntax (``{a.b}``, ``{a[0]}``) is rejected, and text substituted in (system
prompts full of braces) is never scanned again. An unknown placeholder is an
error that names the template file.

The structure of the default templates follows the verifier prompt the SysBench
paper describes (Appendix A.2): background and goal, the system prompt inside
``<system prompt>`` tags, earlier rounds with ``<role:>``/``<content>`` tags, the
current round, the numbered checklist with types, and a request for JSON with a
reasoning field and one verdict per checklist number. The wording is our own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.judge_text import (
    HistoryMessage,
    format_history,
    substitute,
    template_fields,
    template_hash,
)
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.sessions import Constraint, Session

BUILTIN_TEMPLATES = {"zh": "judge_zh.txt", "en": "judge_en.txt"}

# name -> what it becomes (documented in docs/judge.md)
PLACEHOLDERS: Mapping[str, str] = {
    "system_prompt": "the session's system message",
    "history": "earlier rounds, each message as <role: ...> then <content>...</content>",
    "user": "the current user instruction",
    "answer": "the answer under evaluation",
    "checklist": "one line per constraint: 'N. content | type'",
    "checklist_numbers": "the checklist numbers, e.g. '1, 2, 3'",
    "verdict_example": "a JSON object with every checklist number mapped to the allowed values",
    "round": "the current round number (1-based)",
}

# Keys and values of the reply the templates ask for, by language.
REASONING_KEYS = {"zh": "评判理由", "en": "reasoning"}
VERDICT_KEYS = {"zh": "评判结果", "en": "verdicts"}
VERDICT_VALUES = {"zh": ("是", "否"), "en": ("yes", "no")}
_TYPE_NAMES_EN = {
    "action": "action constraint",
    "content": "content constraint",
    "background": "background constraint",
    "role": "role constraint",
    "format": "format constraint",
    "style": "style constraint",
}


@dataclass(frozen=True)
class JudgeTemplate:
    name: str  # "zh", "en" or the file path
    text: str
    language: str  # "zh" | "en": checklist type names, history placeholder, JSON schema keys
    sha256: str


def load_template(spec: str = "zh", language: str | None = None) -> JudgeTemplate:
    """``zh``/``en`` pick a built-in template; anything else is a file path.

    A file template's language (``language``, default zh) decides how the checklist
    types are written and which keys the verdict schema uses.
    """
    if spec in BUILTIN_TEMPLATES:
        text = resources.files("sysbench_gpu").joinpath("templates", BUILTIN_TEMPLATES[spec]).read_text("utf-8")
        lang = language or spec
        name = spec
    else:
        path = Path(spec)
        if not path.is_file():
            raise SysbenchError(f"{path}: no such template file (use zh, en or a file path)")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise SysbenchError(f"{path}: template is not UTF-8 text") from None
        lang = language or "zh"
        name = str(path)
    if lang not in REASONING_KEYS:
        raise SysbenchError(f"template language {lang!r} unknown (use zh or en)")
    check_template(text, name)
    return JudgeTemplate(name=name, text=text, language=lang, sha256=template_hash(text))


def format_checklist(constraints: Sequence[Constraint], language: str) -> str:
    lines = []
    for c in constraints:
        type_name = c.type_raw if language == "zh" else _TYPE_NAMES_EN.get(c.type, c.type)
        content = " ".join(c.content.split())
        lines.append(f"{c.id}. {content} | {type_name}")
    return "\n".join(lines)


def verdict_example(numbers: Sequence[int], language: str) -> str:
    yes, no = VERDICT_VALUES[language]
    return json.dumps({str(n): f"{yes}/{no}" for n in numbers}, ensure_ascii=False)


def render_prompt(
    template: JudgeTemplate,
    session: Session,
    turn_index: int,
    history: Sequence[HistoryMessage],
    answer: str,
) -> str:
    turn = session.turn(turn_index)
    numbers = [c.id for c in turn.constraints]
    values = {
        "system_prompt": session.system_prompt,
        "history": format_history(history, template.language),
        "user": turn.user,
        "answer": answer,
        "checklist": format_checklist(turn.constraints, template.language),
        "checklist_numbers": ", ".join(str(n) for n in numbers),
        "verdict_example": verdict_example(numbers, template.language),
        "round": str(turn_index),
    }
    return substitute(template.text, values, template.name)


def verdict_schema(numbers: Sequence[int], language: str, max_reasoning_chars: int | None = 2000) -> dict[str, Any]:
    """JSON schema of a valid reply for these checklist numbers (for guided decoding).

    The reasoning comes first, as the templates ask; its length is capped so that a
    small local judge cannot spend all its tokens inside the string.
    """
    reasoning: dict[str, Any] = {"type": "string"}
    if max_reasoning_chars is not None:
        reasoning["maxLength"] = max_reasoning_chars
    keys = [str(n) for n in numbers]
    verdict_key, reasoning_key = VERDICT_KEYS[language], REASONING_KEYS[language]
    return {
        "type": "object",
        "properties": {
            reasoning_key: reasoning,
            verdict_key: {
                "type": "object",
                "properties": {k: {"type": "string", "enum": list(VERDICT_VALUES[language])} for k in keys},
                "required": keys,
                "additionalProperties": False,
            },
        },
        "required": [reasoning_key, verdict_key],
        "additionalProperties": False,
    }


def check_template(text: str, source: str = "<template>") -> None:
    names = template_fields(text, source)
    unknown = sorted(set(names) - set(PLACEHOLDERS))
    if unknown:
        raise SysbenchError(
            f"{source}: unknown placeholder(s) {', '.join('{' + n + '}' for n in unknown)} "
            f"(known: {', '.join('{' + n + '}' for n in PLACEHOLDERS)})"
        )
    for required in ("answer", "checklist"):
        if required not in names:
            raise SysbenchError(f"{source}: template lacks the {{{required}}} placeholder")
