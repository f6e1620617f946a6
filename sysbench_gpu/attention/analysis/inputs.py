"""What ``attention-analyze`` reads, checked whole before it computes or writes anything.

For each attention output directory: its manifest, the merged table (``turn_shares.jsonl``: every
line a turn-share row, the file not cut off) and every session file it names. A session whose
rows are in the table must have its ``.npz``, and every ``.npz`` must be readable to its last
byte and have its rows in the table: otherwise the decay fits would silently rest on fewer
sessions than the table (a missing file once became "no fit"). Every failure is one line naming
the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sysbench_gpu.attention.files.store import TURN_TABLE, load_session, read_manifest, session_path
from sysbench_gpu.attention.files.turn_table import TurnShare, read_turn_table
from sysbench_gpu.core.errors import SysbenchError

# What the heads map, the probe and the decay fits read from every stored session.
SESSION_KEYS = ("meta", "layers", "shares", "system", "turns", "turn_numbers", "replies")


@dataclass(frozen=True)
class CheckedDir:
    """One attention output directory whose inputs all read: its manifest, table rows and session files."""

    path: Path
    manifest: dict[str, Any]
    rows: list[TurnShare]
    sessions: dict[tuple[int, str], Path]  # (system_id, condition) -> its .npz


def check_table_file(path: Path) -> list[TurnShare]:
    """The rows of a merged table, which is written whole: a missing file or a cut-off last line is one line."""
    if not path.is_file():
        raise SysbenchError(f"{path}: missing (rerun `attention` on this folder to merge the table)")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SysbenchError(f"{path}: cannot read ({error.strerror or error})") from None
    if data and not data.endswith(b"\n"):
        raise SysbenchError(
            f"{path}: the last line is cut off (the file looks truncated); rerun `attention` on this folder"
        )
    rows = read_turn_table(path)
    if not rows:
        raise SysbenchError(f"{path}: no per-turn rows (rerun `attention` to merge the table)")
    return rows


def check_session_file(path: Path) -> tuple[int, str, int]:
    """(system_id, condition, turns) of a stored session, read to its last byte; one line naming the file."""
    stored = load_session(path)  # every member: a truncated or damaged file fails here
    missing = [key for key in SESSION_KEYS if key not in stored]
    if missing:
        raise SysbenchError(f"{path}: field {missing[0]!r} is missing (not a session file the attention stage wrote)")
    try:
        meta = json.loads(str(stored["meta"]))
        system_id, condition = int(meta["system_id"]), str(meta["condition"])
    except (ValueError, KeyError, TypeError) as error:
        raise SysbenchError(f"{path}: field 'meta' is not the attention stage's ({error})") from None
    if path.name != session_path(path.parent.parent, system_id, condition).name:
        raise SysbenchError(f"{path}: field 'meta' names session {system_id}, condition {condition!r}: not this file")
    return system_id, condition, int(stored["turn_numbers"].size)


def check_attention_dir(out: Path) -> CheckedDir:
    """Every input of one directory, read and cross-checked (module doc)."""
    manifest = read_manifest(out)
    table = out / TURN_TABLE
    rows = check_table_file(table)
    sessions: dict[tuple[int, str], Path] = {}
    for path in sorted((out / "sessions").glob("*.npz")):
        system_id, condition, turns = check_session_file(path)
        if turns:
            sessions[(system_id, condition)] = path
    in_table = {(row.system_id, row.condition) for row in rows}
    for system_id, condition in sorted(in_table - sessions.keys()):
        raise SysbenchError(
            f"{session_path(out, system_id, condition)}: missing, though {table.name} has rows of session "
            f"{system_id} ({condition}); restore it, or rerun `attention` on this folder"
        )
    for key in sorted(sessions.keys() - in_table):
        raise SysbenchError(
            f"{sessions[key]}: its session has no rows in {table.name} (the table predates it); "
            "rerun `attention` on this folder to merge the table"
        )
    return CheckedDir(out, manifest, rows, sessions)
