"""Battles to play again: those whose runs changed since they were stored, and those the judge never answered.

A stored battle is rated only while each side's fingerprint (``arena.fingerprint``) matches
what its run holds now. A verdict battle that no longer matches is replayed by itself (it
costs nothing); a judged one is refused in one line unless ``--replay-changed`` asks the
judge again. A record stored before fingerprints existed cannot be checked, so it counts
as changed. ``--retry-unparsed`` asks again the questions whose answer never parsed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sysbench_gpu.arena.battles import BATTLES, BattleKey, BattleRecord
from sysbench_gpu.arena.fingerprint import fingerprint
from sysbench_gpu.arena.runs import ArenaRun

Pair = tuple[ArenaRun, ArenaRun]


@dataclass
class Changed:
    """Stored battles of this call's pairs that no longer match their runs."""

    keys: set[BattleKey] = field(default_factory=set)
    by_run: dict[str, list[BattleRecord]] = field(default_factory=dict)  # run as given: its changed battles
    unchecked: int = 0  # of those, stored without a fingerprint

    def refusal(self, out: str) -> str:
        """One line: the first run whose battles changed, how many, where first, and what to do."""
        run, records = next(iter(self.by_run.items()))
        # In session order, not file order: judged battles are appended as their answers arrive.
        first = min(records, key=lambda record: (record.system_id, record.turn, record.order))
        why = (
            "were stored without a fingerprint, so what they were decided on cannot be checked"
            if first.fingerprint_a is None or first.fingerprint_b is None
            else "were judged on a conversation that differs from the run's generations.jsonl now"
        )
        return (
            f"{out}/{BATTLES}: run {run}: {len(records)} judged battle(s) {why} "
            f"(first: session {first.system_id}, turn {first.turn}); rerun with --replay-changed to ask the judge "
            "again, or use another --out"
        )


def changed_battles(records: Mapping[BattleKey, BattleRecord], chosen: Sequence[Pair], by: str) -> Changed:
    """The records of ``chosen`` pairs whose stored fingerprints differ from their runs' files now."""
    runs = {(a.key, b.key): (a, b) for a, b in chosen}
    memo: dict[tuple[str, int, int], str] = {}

    def now(run: ArenaRun, record: BattleRecord) -> str:
        key = (run.key, record.system_id, record.turn)
        if key not in memo:
            memo[key] = fingerprint(run, record.system_id, record.turn, by)
        return memo[key]

    changed = Changed()
    for key, record in records.items():
        pair = runs.get((record.a, record.b))
        if pair is None:
            continue  # not rated in this call
        a, b = pair
        stale = [
            run
            for run, stored in ((a, record.fingerprint_a), (b, record.fingerprint_b))
            if stored is None or stored != now(run, record)
        ]
        if stale:
            changed.keys.add(key)
            changed.by_run.setdefault(stale[0].given, []).append(record)
            changed.unchecked += int(record.fingerprint_a is None or record.fingerprint_b is None)
    return changed


def unparsed_battles(records: Mapping[BattleKey, BattleRecord], chosen: Sequence[Pair]) -> set[BattleKey]:
    """The records of ``chosen`` pairs whose judge answer never parsed."""
    pairs = {(a.key, b.key) for a, b in chosen}
    return {key for key, record in records.items() if record.status == "unparsed" and (record.a, record.b) in pairs}
