"""The plan file's tables and keys, and the type check of each (docs/plans.md).

A spec is a mapping key -> :class:`Key`; :func:`check_table` refuses an unknown key, a
value of the wrong type or a missing required key in one line naming the file, the table
and the key, before anything else looks at the plan. The keys whose type only a verb
knows (a model's engine options) are typed from that verb's own parser
(``plans.verbs``), so the plan cannot drift from the flags it stands for.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sysbench_gpu.core.errors import SysbenchError

# A model, ablation or run name becomes a folder name.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

# Python type -> how an error names it.
_TYPE_WORDS: dict[type, str] = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    dict: "a table",
    list: "an array",
}


@dataclass(frozen=True)
class Key:
    """One key of a table: its accepted types, whether it must be there, and its allowed values."""

    types: tuple[type, ...]
    required: bool = False
    choices: tuple[Any, ...] | None = None
    minimum: int | None = None  # integers only
    help: str = ""

    def describe(self) -> str:
        return " or ".join(_TYPE_WORDS.get(kind, kind.__name__) for kind in self.types)


def key(*types: type, required: bool = False, choices: Any = None, minimum: int | None = None) -> Key:
    return Key(types, required, tuple(choices) if choices is not None else None, minimum)


class PlanError(SysbenchError):
    """A plan file that cannot run: one line naming the file, the table and the key."""


def where(path: Path, table: str, name: str | None = None) -> str:
    shown = f"[{table}]" if table else "the top level"
    return f"{path}: {shown}" + (f" key {name!r}" if name is not None else "")


def type_name(value: Any) -> str:
    for kind, word in _TYPE_WORDS.items():
        if type(value) is kind:
            return word
    return type(value).__name__


def matches(value: Any, types: tuple[type, ...]) -> bool:
    """TOML types as a plan reads them: an integer is a number too, but true and false are never numbers."""
    if isinstance(value, bool):
        return bool in types
    if isinstance(value, int) and float in types:
        return True
    return any(type(value) is kind for kind in types)


def check_value(path: Path, table: str, name: str, spec: Key, value: Any) -> Any:
    if not matches(value, spec.types):
        raise PlanError(f"{where(path, table, name)}: expected {spec.describe()}, got {type_name(value)} {value!r}")
    if spec.choices is not None and value not in spec.choices:
        raise PlanError(
            f"{where(path, table, name)}: {value!r} is not one of {', '.join(repr(c) for c in spec.choices)}"
        )
    if spec.minimum is not None and isinstance(value, int) and not isinstance(value, bool) and value < spec.minimum:
        raise PlanError(f"{where(path, table, name)}: must be at least {spec.minimum}, got {value}")
    if isinstance(value, float) and value != value:  # NaN: no flag takes it
        raise PlanError(f"{where(path, table, name)}: nan is not a number a flag takes")
    return float(value) if float in spec.types and int not in spec.types and isinstance(value, int) else value


def check_table(path: Path, table: str, value: Any, spec: Mapping[str, Key]) -> dict[str, Any]:
    """``value`` as a checked table: every key known, of its type, the required ones present."""
    if not isinstance(value, dict):
        raise PlanError(f"{where(path, table)}: expected a table, got {type_name(value)}")
    for name in value:
        if name not in spec:
            known = ", ".join(sorted(spec)) or "none"
            raise PlanError(f"{where(path, table, name)}: unknown key (known keys: {known})")
    checked: dict[str, Any] = {}
    for name, item in spec.items():
        if name not in value:
            if item.required:
                raise PlanError(f"{where(path, table)}: missing key {name!r} ({item.describe()})")
            continue
        checked[name] = check_value(path, table, name, item, value[name])
    return checked


def check_name(path: Path, table: str, name: str, value: str) -> str:
    if not NAME_PATTERN.match(value):
        raise PlanError(
            f"{where(path, table, name)}: {value!r} names a folder: letters, digits, '.', '_' and '-' only, "
            "starting with a letter or digit"
        )
    return value


# ------------------------------------------------------------------ the tables

TOP = {
    "name": key(str),
    "out": key(str),
    "data": key(dict, required=True),
    "sampling": key(dict),
    "judge": key(dict),
    "models": key(list, required=True),
    "outputs": key(dict),
}

DATA = {
    "path": key(str, required=True),
    "benchmark": key(str),
    "limit": key(int, minimum=1),
    "sessions": key(str),
    "system_message": key(str),
    "task": key(str),
}

SAMPLING = {
    "max_tokens": key(int, minimum=1),
    "temperature": key(float),
    "top_p": key(float),
    "top_k": key(int, minimum=0),
    "repetition_penalty": key(float),
    "seed": key(int, minimum=0),
    "ignore_eos": key(bool),
    "preset": key(str),
}

JUDGE = {
    "backend": key(str),
    "model": key(str),
    "template": key(str),
    "template_lang": key(str, choices=("zh", "en")),
    "mteval_templates": key(dict),
    "max_retries": key(int, minimum=1),
    "max_tokens": key(int, minimum=1),
    "max_reasoning_chars": key(int, minimum=1),
    "seed": key(int, minimum=0),
    "concurrency": key(int, minimum=1),
    "timeout": key(float),
    "api_retries": key(int, minimum=0),
    "base_url": key(str),
    "api_key_env": key(str),
    "options": key(dict),
}

MODEL = {
    "name": key(str, required=True),
    "model": key(str, required=True),
    "engine": key(str, required=True),
    "options": key(dict),
    "sampling": key(dict),
    "judge": key(dict),
    "on_overflow": key(str),
    "plain": key(bool),
    "ablations": key(list),
    "attention": key(dict, bool),
    "env": key(dict),
}

ABLATION = {
    "name": key(str),
    "history": key(str),
    "distractor_turns": key(int, minimum=0),
    "distractor_seed": key(int, minimum=0),
    "skip_missing_reference": key(bool),
    "data": key(str),
}

OUTPUTS = {
    "metrics": key(bool),
    "report": key(bool, dict),
    "arena": key(bool, dict),
    "explore": key(bool, dict),
    "attention": key(bool, dict),
}

REPORT = {
    "formats": key(str),
    "sort": key(str),
    "figures": key(bool),
    "gt_pairs": key(bool),
    "resamples": key(int, minimum=1),
    "seed": key(int, minimum=0),
    "allow_partial": key(bool),
    "exclude_unparsed": key(bool),
    "exclude_skipped": key(bool),
    "device_spec": key(str),
}

ARENA = {
    "by": key(str, choices=("verdicts", "judge")),
    "baseline": key(str),
    "runs": key(str, choices=("all", "plain")),
    "length_control": key(bool),
    "resamples": key(int, minimum=0),
    "seed": key(int, minimum=0),
    "formats": key(str),
    "figures": key(bool),
    "max_tokens": key(int, minimum=1),
    "template": key(str),
}

EXPLORE = {
    "title": key(str),
    "resamples": key(int, minimum=1),
    "seed": key(int, minimum=0),
}

ATTENTION = {
    "runs": key(str, choices=("plain", "all")),
    "layers": key(str),
    "control": key(bool),
    "limit": key(int, minimum=1),
    "sessions": key(str),
    "replies": key(str, choices=("auto", "generations", "reference")),
    "dtype": key(str),
    "device": key(str),
    "device_map": key(str),
    "tensor_parallel": key(bool),
    "per_head": key(bool),
    "knockout": key(str, choices=("system",)),
    "knockout_layers": key(str),
    "store_dtype": key(str, choices=("float16", "float32")),
    "max_tokens": key(int, minimum=1),
    "chunk_mib": key(int, minimum=1),
    "figures": key(bool),
    "bootstrap": key(int, minimum=1),
    # torchrun --nproc-per-node: one process per GPU (data parallel over sessions, or --tensor-parallel)
    "nproc": key(int, minimum=1),
}
