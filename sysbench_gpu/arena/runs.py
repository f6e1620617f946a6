"""The runs of an arena: read through the Benchmark protocol, and refused unless their sessions are the same.

Runs are matched on the sessions themselves (each run's ``sessions.json`` as its benchmark
reads it), never on the manifest's dataset checksum: an imported run records its
workbook's checksum, which differs per model although every workbook holds the same 500
sessions.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.base import Benchmark
from sysbench_gpu.benchmarks.registry import get_benchmark
from sysbench_gpu.benchmarks.runs import load_run
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.core.sessions import Session

Key = tuple[int, int]


@dataclass(frozen=True)
class ArenaRun:
    given: str  # the run directory as given on the command line
    key: str  # its resolved path: the same run however it is written
    label: str
    model: str | None
    benchmark: Benchmark
    sessions: tuple[Session, ...]
    generations: dict[Key, GenerationRecord]
    judgments: dict[Key, JudgmentRecord]
    points: dict[Key, float | None]  # what each reply earned on its turn (``Benchmark.arena_points``)

    @property
    def name(self) -> str:
        return self.model or self.label

    @cached_property
    def _sessions_by_id(self) -> dict[int, Session]:
        return {session.system_id: session for session in self.sessions}

    def session(self, system_id: int) -> Session:
        return self._sessions_by_id[system_id]

    def has_session(self, system_id: int) -> bool:
        return system_id in self._sessions_by_id

    def reply(self, key: Key) -> str | None:
        record = self.generations.get(key)
        return record.response if record is not None and record.status == "ok" else None

    def history(self, key: Key) -> str:
        """How the run showed earlier turns; an imported run's own replies count as model history."""
        record = self.generations.get(key)
        modes = self.benchmark.history_modes
        if record is not None and record.history in modes:
            return record.history
        return "model" if "model" in modes else modes[0]


def run_labels(runs: Sequence[tuple[str, str]]) -> list[str]:
    """Each (model, run) as shown in a leaderboard: the model, and the run beside it where the model repeats."""
    counts = Counter(model for model, _ in runs)
    return [model if counts[model] == 1 else f"{model} ({run})" for model, run in runs]


def load_arena_run(given: str) -> ArenaRun:
    loaded = load_run(given)
    generations = RunDir(given).generations.read()
    benchmark = get_benchmark(loaded.benchmark)
    points = {
        (s.system_id, t.index): benchmark.arena_points(s, t.index, loaded.judgments.get((s.system_id, t.index)))
        for s in loaded.sessions
        for t in s.turns
    }
    return ArenaRun(
        given=given,
        key=str(Path(given).resolve()),
        label=loaded.label,
        model=loaded.model,
        benchmark=benchmark,
        sessions=tuple(loaded.sessions),
        generations=generations,
        judgments=loaded.judgments,
        points=points,
    )


def load_runs(given: Sequence[str], progress: Any = None) -> list[ArenaRun]:
    """Every run, checked against the first: same benchmark, same sessions; duplicates refused."""
    runs: list[ArenaRun] = []
    seen: dict[str, str] = {}
    for path in given:
        run = load_arena_run(path)
        if run.key in seen:
            raise SysbenchError(f"arena: {path} is the same run as {seen[run.key]}; give each run once")
        seen[run.key] = path
        if runs:
            check_same_sessions(runs[0], run)
        runs.append(run)
        if progress is not None:
            progress.update(1)
    return runs


def check_same_sessions(first: ArenaRun, other: ArenaRun) -> None:
    """One line naming the run, session, turn and field where ``other``'s sessions differ from ``first``'s."""
    where = f"arena: {other.given}/sessions.json"
    if other.benchmark.name != first.benchmark.name:
        raise SysbenchError(
            f"{where}: field benchmark is {other.benchmark.name!r}, {first.given} has {first.benchmark.name!r}; "
            "an arena compares runs of one benchmark"
        )
    ids_first = [s.system_id for s in first.sessions]
    ids_other = [s.system_id for s in other.sessions]
    if ids_first != ids_other:
        missing = sorted(set(ids_first) - set(ids_other))[:3]
        extra = sorted(set(ids_other) - set(ids_first))[:3]
        raise SysbenchError(
            f"{where}: field system_id: its sessions are not those of {first.given} "
            f"({len(ids_other)} vs {len(ids_first)} sessions; missing {missing}, extra {extra})"
        )
    for mine, theirs in zip(first.sessions, other.sessions, strict=True):
        field = _first_difference(mine, theirs)
        if field is not None:
            raise SysbenchError(
                f"{where}: session {theirs.system_id}, {field} differs from {first.given}; "
                "an arena compares runs of the same sessions"
            )


def _first_difference(mine: Session, theirs: Session) -> str | None:
    for item in dataclasses.fields(Session):
        if item.name == "turns":
            continue
        if getattr(mine, item.name) != getattr(theirs, item.name):
            return f"field {item.name}"
    if len(mine.turns) != len(theirs.turns):
        return f"field turns ({len(theirs.turns)} vs {len(mine.turns)})"
    for left, right in zip(mine.turns, theirs.turns, strict=True):
        for item in dataclasses.fields(left):
            if getattr(left, item.name) != getattr(right, item.name):
                return f"turn {right.index}, field {item.name}"
    return None
