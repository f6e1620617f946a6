"""Battles: their records in ``battles.jsonl``, the pairs an arena plays, and battles decided by verdicts.

A battle is two runs' replies to one turn of one session. Its record names the two runs by
resolved path with ``a`` before ``b`` in sort order, so a pair is the same pair whatever
order the runs are given in, and a rerun (or a run added later) finds what was played.
``order`` is which reply the judge saw first (``ab``: a's reply as "A"); ``winner`` is
always a run (``a``, ``b`` or ``tie``), never a position. ``fingerprint_a`` and
``fingerprint_b`` digest what the battle depended on in each run (``arena.fingerprint``).
Records taken out of ``battles.jsonl`` (to be played again) are kept in
``battles.replaced.jsonl``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from sysbench_gpu.arena.fingerprint import of_verdicts
from sysbench_gpu.arena.runs import ArenaRun
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.jsonl import append_lines, complete_lines
from sysbench_gpu.core.rundir import write_bytes_atomic

BATTLES = "battles.jsonl"
REPLACED = "battles.replaced.jsonl"
WINNERS = ("a", "b", "tie")
ORDERS = ("ab", "ba")

BattleKey = tuple[str, str, int, int, str]


@dataclass
class BattleRecord:
    a: str  # resolved path of run a (sorts before b)
    b: str
    system_id: int
    turn: int
    order: str  # ab | ba: which run's reply was shown first
    winner: str  # a | b | tie; "" when the judge's reply never parsed
    by: str  # verdicts | judge
    model_a: str
    model_b: str
    reason: str | None = None
    answer: str | None = None  # the judge's choice as given (A, B or tie), by position
    status: str = "ok"  # ok | unparsed
    len_a: int = 0  # reply lengths in characters (the length-control covariate)
    len_b: int = 0
    judge_model: str | None = None
    template_sha256: str | None = None
    raw_reply: str | None = None
    attempts: int = 0
    fingerprint_a: str | None = None  # what the battle depended on in run a (None: stored before fingerprints)
    fingerprint_b: str | None = None

    @property
    def key(self) -> BattleKey:
        return (self.a, self.b, self.system_id, self.turn, self.order)


_TYPES = {f.name: f.type for f in fields(BattleRecord)}


def _from_json(obj: Any, path: Path, number: int) -> BattleRecord:
    where = f"{path}: line {number}"
    if not isinstance(obj, dict):
        raise SysbenchError(f"{where}: expected a JSON object")
    unknown = sorted(set(obj) - set(_TYPES))
    if unknown:
        raise SysbenchError(f"{where}: unknown field {unknown[0]!r}")
    try:
        record = BattleRecord(**obj)
    except TypeError as error:
        raise SysbenchError(f"{where}: {error}") from None
    checks = (
        ("order", record.order in ORDERS),
        ("winner", record.winner in (*WINNERS, "")),
        ("system_id", isinstance(record.system_id, int)),
        ("turn", isinstance(record.turn, int)),
        ("a", isinstance(record.a, str) and isinstance(record.b, str) and record.a < record.b),
    )
    for name, ok in checks:
        if not ok:
            raise SysbenchError(
                f"{where}: session {record.system_id}, turn {record.turn}: field {name} is invalid ({obj.get(name)!r})"
            )
    return record


class BattleStore:
    """``battles.jsonl``: append-only, one record per (pair, session, turn, order)."""

    def __init__(self, out: Path) -> None:
        self.path = Path(out) / BATTLES

    def read(self) -> dict[BattleKey, BattleRecord]:
        if not self.path.is_file():
            return {}
        records: dict[BattleKey, BattleRecord] = {}
        for number, line in complete_lines(self.path.read_bytes()):
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, RecursionError, UnicodeDecodeError):
                raise SysbenchError(f"{self.path}: line {number}: not valid JSON") from None
            record = _from_json(obj, self.path, number)
            if record.key in records:
                raise SysbenchError(
                    f"{self.path}: line {number}: session {record.system_id}, turn {record.turn}: "
                    f"battle {record.order} of this pair appears twice"
                )
            records[record.key] = record
        return records

    def append(self, records: Iterable[BattleRecord]) -> int:
        # vars(), not asdict(): the fields are plain values, and asdict's deep copy is the slow part here.
        # Null fields are left out (they read back as their defaults): verdict battles have no judge fields.
        lines = [
            (json.dumps({k: v for k, v in vars(r).items() if v is not None}, ensure_ascii=False) + "\n").encode()
            for r in records
        ]
        return append_lines(self.path, lines) if lines else 0

    def set_aside(self, keys: set[BattleKey]) -> int:
        """Move these battles to ``battles.replaced.jsonl``: appended there first, then this file replaced
        atomically, so a crash in between loses nothing (at worst a record is in both files)."""
        if not keys or not self.path.is_file():
            return 0
        kept: list[bytes] = []
        moved: list[bytes] = []
        for _, line in complete_lines(self.path.read_bytes()):
            obj = json.loads(line)  # validated by the caller's read()
            key = (obj.get("a"), obj.get("b"), obj.get("system_id"), obj.get("turn"), obj.get("order"))
            (moved if key in keys else kept).append(line + b"\n")
        if not moved:
            return 0
        append_lines(self.path.parent / REPLACED, moved)
        write_bytes_atomic(self.path, b"".join(kept))
        return len(moved)


def pairs(runs: Sequence[ArenaRun], baseline: ArenaRun | None) -> list[tuple[ArenaRun, ArenaRun]]:
    """The pairs to play, each as (a, b) in path order: every pair, or every run against the baseline."""
    chosen: list[tuple[ArenaRun, ArenaRun]] = []
    for i, left in enumerate(runs):
        for right in runs[i + 1 :]:
            if baseline is not None and baseline.key not in (left.key, right.key):
                continue
            chosen.append((left, right) if left.key < right.key else (right, left))
    return chosen


def battle_turns(a: ArenaRun, b: ArenaRun) -> Iterator[tuple[int, int]]:
    """(session, turn) of every turn both runs answered, in session order."""
    for session in a.sessions:
        for turn in session.turns:
            key = (session.system_id, turn.index)
            if turn.answered and a.reply(key) is not None and b.reply(key) is not None:
                yield key


def verdict_battles(a: ArenaRun, b: ArenaRun, done: set[BattleKey]) -> list[BattleRecord]:
    """No judge: the reply that earned more on its turn (satisfied constraints, or the score) wins; equal is a tie."""
    records = []
    for system_id, turn in battle_turns(a, b):
        if (a.key, b.key, system_id, turn, "ab") in done:
            continue
        points_a, points_b = a.points.get((system_id, turn)), b.points.get((system_id, turn))
        if points_a is None or points_b is None:
            continue  # a turn not judged in one run has no winner
        winner = "a" if points_a > points_b else "b" if points_b > points_a else "tie"
        records.append(
            BattleRecord(
                a=a.key,
                b=b.key,
                system_id=system_id,
                turn=turn,
                order="ab",
                winner=winner,
                by="verdicts",
                model_a=a.name,
                model_b=b.name,
                reason=f"points (satisfied constraints or score): {a.name} {points_a:g}, {b.name} {points_b:g}",
                len_a=len(a.reply((system_id, turn)) or ""),
                len_b=len(b.reply((system_id, turn)) or ""),
                fingerprint_a=of_verdicts(a, system_id, turn),
                fingerprint_b=of_verdicts(b, system_id, turn),
            )
        )
    return records
