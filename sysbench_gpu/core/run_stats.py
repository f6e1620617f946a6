"""Reading ``stats.json``: one checked list of engine calls for every reader.

``generate`` writes the file (``generation.scheduler``) and reads it back to resume;
``profile`` bounds each call. Both read it here, so a hand-edited or damaged file
gives one error naming the file and the field (``calls[2].wall_s``), never a
traceback or a silently wrong number.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.jsonio import json_type, read_json

# Counts that a call records; each is a non-negative integer where present.
COUNT_FIELDS = ("requests", "skipped", "truncated", "prompt_tokens", "output_tokens")
WHOLE_RUN_TURN = "all"  # a call that answered every turn at once (history modes without turns)


def read_stats(path: str | Path) -> dict[str, Any]:
    """``stats.json`` as an object whose ``calls`` are checked (see :func:`check_call`)."""
    path = Path(path)
    stats = read_json(path, expect=dict)
    calls = stats.get("calls")
    if not isinstance(calls, list):
        found = "missing" if "calls" not in stats else f"{json_type(calls)}"
        raise SysbenchError(f"{path}: field 'calls' should be an array, found {found}")
    for index, call in enumerate(calls):
        check_call(path, index, call)
    return stats


def check_call(path: Path, index: int, call: Any) -> None:
    """One error naming ``calls[index].<field>`` where a call's field has the wrong type or range."""
    where = f"{path}: field 'calls[{index}]"
    if not isinstance(call, dict):
        raise SysbenchError(f"{where}' should be an object, found {json_type(call)}")
    turn = call.get("turn")
    if not (_is_count(turn) or turn == WHOLE_RUN_TURN):
        raise SysbenchError(f"{where}.turn' is {turn!r}, expected a turn number or {WHOLE_RUN_TURN!r}")
    if "requests" not in call:
        raise SysbenchError(f"{where}.requests' is missing")
    for name in COUNT_FIELDS:
        if name in call and not _is_count(call[name]):
            raise SysbenchError(f"{where}.{name}' is {call[name]!r}, expected a whole number >= 0")
    cached = call.get("cached_prompt_tokens")
    if cached is not None and not _is_count(cached):
        raise SysbenchError(f"{where}.cached_prompt_tokens' is {cached!r}, expected a whole number >= 0 or null")
    wall = call.get("wall_s")
    if wall is not None and not (_is_number(wall) and wall >= 0):
        raise SysbenchError(f"{where}.wall_s' is {wall!r}, expected a number of seconds >= 0 or null")
    reasons = call.get("finish_reasons", {})
    if not isinstance(reasons, dict) or not all(_is_count(n) for n in reasons.values()):
        raise SysbenchError(f"{where}.finish_reasons' should map reasons to whole numbers >= 0")
    for name in ("history", "started"):
        if call.get(name) is not None and not isinstance(call[name], str):
            raise SysbenchError(f"{where}.{name}' should be a string, found {json_type(call[name])}")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
