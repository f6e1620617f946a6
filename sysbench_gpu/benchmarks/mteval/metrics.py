"""MT-Eval scores: per task, per category, per answered-turn index and overall, with bootstrap CIs.

As upstream computes them (docs/mteval.md): a turn's score is 1-10 (judge) or 0/10 (rules);
a task's or a category's score is the mean over all its answered turns (recollection pools
cls and global-inst turns); the overall score is the mean of the category means.

CIs resample dialogues with replacement within each task (the tasks are fixed, their
dialogues a sample), so a resample always has every task; every score is a ratio of
per-dialogue sums, evaluated on all resamples at once. A paired comparison of two runs over
the same turns (model vs gold history) uses the same resamples for both; runs over different
dialogues (multi vs single) are compared with independent resamples and say so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sysbench_gpu.benchmarks.mteval.data import answered_turns
from sysbench_gpu.benchmarks.mteval.tasks import CATEGORIES, TASKS
from sysbench_gpu.benchmarks.turn_scoring import SessionTable
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.sessions import Session
from sysbench_gpu.core.stats import bootstrap_index, percentile_ci

Key = tuple[int, int]
_NAMED = 5


@dataclass(frozen=True)
class TurnScore:
    """One scored answered turn."""

    task: str
    system_id: int
    turn: int  # position in the dialogue
    ordinal: int  # 1-based index among the dialogue's answered turns
    score: float  # 1-10 (judge) or 0/10 (rules)
    setting: str = ""  # multi | single | ablation

    @property
    def category(self) -> str:
        return TASKS[self.task].category


def build_turn_scores(
    sessions: Sequence[Session], scores: Mapping[Key, float], *, allow_missing: bool = False
) -> list[TurnScore]:
    """A TurnScore per answered turn of ``sessions`` from ``scores[(system_id, turn)]``.

    Every answered turn needs a score unless ``allow_missing``; a score for a context turn or
    an unknown turn is an error.
    """
    answered = {(s.system_id, t.index) for s in sessions for t in answered_turns(s)}
    stray = sorted(set(scores) - answered)
    if stray:
        raise SysbenchError(f"{len(stray)} score(s) for turns that are not answered turns: {_name(stray)}")
    missing = sorted(answered - set(scores))
    if missing and not allow_missing:
        raise SysbenchError(f"{len(missing)} answered turn(s) have no score: {_name(missing)}")
    out: list[TurnScore] = []
    for session in sessions:
        if session.task not in TASKS:
            raise SysbenchError(f"session {session.system_id}: unknown MT-Eval task {session.task!r}")
        for ordinal, turn in enumerate(answered_turns(session), start=1):
            value = scores.get((session.system_id, turn.index))
            if value is None:
                continue
            if not 0 <= value <= 10:
                raise SysbenchError(f"session {session.system_id}, turn {turn.index}: score {value} is outside 0..10")
            setting = session.mteval.setting if session.mteval else ""
            out.append(TurnScore(session.task, session.system_id, turn.index, ordinal, float(value), setting))
    return out


def _name(keys: Sequence[Key]) -> str:
    named = ", ".join(f"session {s} turn {t}" for s, t in keys[:_NAMED])
    return named + (f" and {len(keys) - _NAMED} more" if len(keys) > _NAMED else "")


# ---------------------------------------------------------------- per-dialogue sums


@dataclass(frozen=True)
class DialogueTable(SessionTable):
    """Per-dialogue sums: every score is sum(num) / sum(den) over dialogues.

    The SysBench session table's ratio arithmetic (``point``, ``resampled``) serves as is: its
    rows are dialogues here (``system_ids``), its ``groups`` their tasks; ``leading`` and
    ``n_rounds`` (SSR streaks) are unused.
    """

    units: tuple[tuple[str, int], ...]  # (task, system_id) of each row, grouped by task
    categories: tuple[str, ...]  # in leaderboard order, then the others

    def overall_point(self) -> float | None:
        means = [self.point(f"category.{c}") for c in self.categories]
        present = [m for m in means if m is not None]
        return float(np.mean(present)) if present else None

    def overall_resampled(self, index: np.ndarray) -> np.ndarray:
        stacked = np.stack([self.resampled(f"category.{c}", index) for c in self.categories])
        return stacked.mean(axis=0)

    def strata(self) -> dict[str, np.ndarray]:
        tasks: dict[str, list[int]] = {}
        for position, (task, _) in enumerate(self.units):
            tasks.setdefault(task, []).append(position)
        return {task: np.array(rows) for task, rows in tasks.items()}


def build_table(turns: Sequence[TurnScore]) -> DialogueTable:
    if not turns:
        raise SysbenchError("no scored turns")
    units = sorted({(t.task, t.system_id) for t in turns})
    row_of = {unit: row for row, unit in enumerate(units)}
    width = len(units)
    ratios: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def add(name: str, row: int, value: float) -> None:
        if name not in ratios:
            ratios[name] = (np.zeros(width), np.zeros(width))
        ratios[name][0][row] += value
        ratios[name][1][row] += 1

    for t in turns:
        row = row_of[(t.task, t.system_id)]
        for name in (f"task.{t.task}", f"category.{t.category}"):
            add(name, row, t.score)
            add(f"{name}.turn.{t.ordinal}", row, t.score)
    present = {t.category for t in turns}
    categories = tuple(c for c in CATEGORIES if c in present) + tuple(sorted(present - set(CATEGORIES)))
    return DialogueTable(
        system_ids=tuple(sid for _, sid in units),
        groups=tuple(task for task, _ in units),
        leading=np.zeros(width, dtype=np.int64),
        n_rounds=0,
        ratios=ratios,
        units=tuple(units),
        categories=categories,
    )


def stratified_index(table: DialogueTable, resamples: int, seed: int) -> np.ndarray:
    """Resamples of dialogue rows, each task's dialogues drawn from that task only."""
    columns = []
    for offset, rows in enumerate(table.strata().values()):
        columns.append(rows[bootstrap_index(len(rows), resamples, seed + offset)])
    return np.concatenate(columns, axis=1)


# ---------------------------------------------------------------- metrics


def mteval_metrics(
    turns: Sequence[TurnScore],
    *,
    resamples: int = 1000,
    seed: int = 0,
    label: str | None = None,
    model: str | None = None,
) -> dict[str, Any]:
    """All MT-Eval scores of a set of scored turns (one run, or several runs of one model)."""
    table = build_table(turns)
    index = stratified_index(table, resamples, seed)

    def block(prefix: str, members: Sequence[TurnScore]) -> dict[str, Any]:
        max_turn = max(t.ordinal for t in members)
        return {
            "score": table.point(prefix),
            "ci95": percentile_ci(table.resampled(prefix, index)),
            "n_sessions": len({(t.task, t.system_id) for t in members}),
            "n_turns": len(members),
            "by_turn": [
                table.point(f"{prefix}.turn.{k}") if f"{prefix}.turn.{k}" in table.ratios else None
                for k in range(1, max_turn + 1)
            ],
        }

    tasks = {}
    for task in sorted({t.task for t in turns}):
        members = [t for t in turns if t.task == task]
        tasks[task] = {
            "category": TASKS[task].category,
            "scorer": TASKS[task].scorer,
            "settings": sorted({t.setting for t in members}),
            **block(f"task.{task}", members),
        }
    categories = {c: block(f"category.{c}", [t for t in turns if t.category == c]) for c in table.categories}
    return {
        "benchmark": "mteval",
        "label": label,
        "model": model,
        "scale": "1-10 (rule-scored turns: 0 or 10)",
        "n_sessions": len(table.units),
        "n_turns": len(turns),
        "overall": table.overall_point(),
        "overall_ci95": percentile_ci(table.overall_resampled(index)),
        "overall_of": list(table.categories),
        "leaderboard_complete": set(table.categories) == set(CATEGORIES),
        "categories": categories,
        "tasks": tasks,
        "bootstrap": {"resamples": resamples, "seed": seed, "unit": "dialogue", "stratified_by": "task"},
    }


def compare_mteval(
    turns_a: Sequence[TurnScore],
    turns_b: Sequence[TurnScore],
    *,
    resamples: int = 1000,
    seed: int = 0,
    paired: bool | None = None,
) -> dict[str, Any]:
    """B - A for the overall, category and task scores both runs have, with a bootstrap CI of the difference.

    Paired (the same resamples for both) when the runs cover exactly the same turns, e.g. model
    against gold history; otherwise (multi against single) each run is resampled on its own.
    ``paired`` False forces independent resamples (the caller knows the dialogues differ even
    where the keys agree); True is honoured only when the turns agree.
    """
    table_a, table_b = build_table(turns_a), build_table(turns_b)
    keys_a = {(t.task, t.system_id, t.turn) for t in turns_a}
    keys_b = {(t.task, t.system_id, t.turn) for t in turns_b}
    paired = keys_a == keys_b and paired is not False
    index_a = stratified_index(table_a, resamples, seed)
    index_b = index_a if paired else stratified_index(table_b, resamples, seed + 1000)
    rows: dict[str, dict[str, Any]] = {}
    shared_categories = [c for c in table_a.categories if c in table_b.categories]
    if shared_categories == list(table_a.categories) == list(table_b.categories):
        rows["overall"] = _diff(
            table_a.overall_point(),
            table_b.overall_point(),
            table_a.overall_resampled(index_a),
            table_b.overall_resampled(index_b),
        )
    names = [f"category.{c}" for c in shared_categories]
    names += sorted(n for n in table_a.ratios if n.startswith("task.") and ".turn." not in n and n in table_b.ratios)
    for name in names:
        rows[name] = _diff(
            table_a.point(name), table_b.point(name), table_a.resampled(name, index_a), table_b.resampled(name, index_b)
        )
    if not rows:
        raise SysbenchError("the two runs share no task or category to compare")
    return {
        "paired": paired,
        "n_sessions": {"a": len(table_a.units), "b": len(table_b.units)},
        "n_turns": {"a": len(turns_a), "b": len(turns_b)},
        "bootstrap": {
            "resamples": resamples,
            "seed": seed,
            "unit": "dialogue",
            "stratified_by": "task",
            "paired": paired,
        },
        "metrics": rows,
    }


def _diff(a: float | None, b: float | None, resampled_a: np.ndarray, resampled_b: np.ndarray) -> dict[str, Any]:
    diff = None if a is None or b is None else b - a
    return {
        "a": a,
        "b": b,
        "diff": diff,
        "ci95": percentile_ci(resampled_b - resampled_a) if diff is not None else None,
    }
