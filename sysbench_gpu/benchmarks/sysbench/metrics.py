"""Exact SysBench metrics of a judged run, bootstrap CIs, and paired comparison of two runs.

Semantics (they reproduce every cell of the paper's tables from upstream's workbooks;
formulas in docs/metrics.md):

- a constraint is satisfied only when its verdict is ``yes``; ``other`` (不适用 ...)
  and a missing verdict neither satisfy it nor fail the turn;
- CSR is pooled over constraints; ``csr_macro`` is the paper's Eq. 1 (mean over turns
  of the per-turn satisfied ratio);
- a turn passes when none of its verdicts is ``no``; ISR = passing turns / turns;
- R_n = share of sessions whose turns 1..n all pass; SSR = mean of R_1..R_T. A turn
  that is not scored (missing judgment under ``allow_partial``, unparsed and
  excluded, or never generated) ends a session's streak like a failing turn.

Every ratio is a ratio of per-session sums, so the bootstrap (``core.stats``) resamples sessions and
evaluates all metrics of all resamples with a few numpy reductions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sysbench_gpu.benchmarks.sysbench.data import (
    ALIGNMENT_ORDER,
    GROUP_ORDER,
    TYPE_ORDER,
)
from sysbench_gpu.benchmarks.sysbench.metrics_text import HEADLINE
from sysbench_gpu.benchmarks.turn_scoring import SessionTable, name_keys, split_turns
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.loaded_run import LoadedRun
from sysbench_gpu.core.records import JudgmentRecord
from sysbench_gpu.core.sessions import Session
from sysbench_gpu.core.stats import bootstrap_index, percentile_ci
from sysbench_gpu.core.verdicts import NO, OTHER, YES

Key = tuple[int, int]
CI_METRICS = ("csr", "isr", "ssr")


# ---------------------------------------------------------------- per-turn scoring


@dataclass(frozen=True)
class TurnScore:
    """One scored turn: what its judgment says about its checklist."""

    system_id: int
    turn: int
    alignment: str
    satisfied: int
    n_constraints: int
    satisfied_by_type: Mapping[str, int]
    constraints_by_type: Mapping[str, int]
    passed: bool
    verdicts: Mapping[str, int]  # yes / no / other counts over checklist items
    missing_verdicts: int


def score_turn(session: Session, turn_index: int, judgment: JudgmentRecord) -> TurnScore:
    turn = session.turn(turn_index)
    satisfied_by_type: Counter = Counter()
    constraints_by_type: Counter = Counter()
    counts: Counter = Counter()
    missing = 0
    for constraint in turn.constraints:
        constraints_by_type[constraint.type] += 1
        verdict = judgment.verdicts.get(str(constraint.id))
        if verdict is None:
            missing += 1
            continue
        value = verdict.value if verdict.value in (YES, NO) else OTHER
        counts[value] += 1
        if value == YES:
            satisfied_by_type[constraint.type] += 1
    # Any verdict of the record can fail the turn, also lines kept outside the checklist.
    passed = all(v.value != NO for v in judgment.verdicts.values())
    return TurnScore(
        system_id=session.system_id,
        turn=turn_index,
        alignment=turn.alignment,
        satisfied=sum(satisfied_by_type.values()),
        n_constraints=len(turn.constraints),
        satisfied_by_type=dict(satisfied_by_type),
        constraints_by_type=dict(constraints_by_type),
        passed=passed,
        verdicts={k: counts.get(k, 0) for k in (YES, NO, OTHER)},
        missing_verdicts=missing,
    )


# ---------------------------------------------------------------- per-session sums


def ratio_names() -> list[str]:
    return (
        list(HEADLINE) + [f"csr_by_type.{t}" for t in TYPE_ORDER] + [f"isr_by_alignment.{a}" for a in ALIGNMENT_ORDER]
    )


def build_table(sessions: Sequence[Session], scores: Mapping[Key, TurnScore]) -> SessionTable:
    n_rounds = max((len(s.turns) for s in sessions), default=0)
    width = len(sessions)
    columns = {name: (np.zeros(width), np.zeros(width)) for name in ratio_names()}
    leading = np.zeros(width, dtype=np.int64)
    for row, session in enumerate(sessions):
        streak_open = True
        for turn in session.turns:
            score = scores.get((session.system_id, turn.index))
            if score is None or not score.passed:
                streak_open = False
            elif streak_open:
                leading[row] += 1
            if score is None:
                continue
            _add(columns, "csr", row, score.satisfied, score.n_constraints)
            _add(
                columns,
                "csr_macro",
                row,
                score.satisfied / score.n_constraints if score.n_constraints else 0.0,
                1 if score.n_constraints else 0,
            )
            _add(columns, "isr", row, score.passed, 1)
            _add(columns, f"isr_by_alignment.{score.alignment}", row, score.passed, 1)
            for kind, count in score.constraints_by_type.items():
                _add(columns, f"csr_by_type.{kind}", row, score.satisfied_by_type.get(kind, 0), count)
        _add(columns, "ssr", row, leading[row], n_rounds)
    return SessionTable(
        system_ids=tuple(s.system_id for s in sessions),
        groups=tuple(s.group for s in sessions),
        leading=leading,
        n_rounds=n_rounds,
        ratios=columns,
    )


def _add(columns: dict[str, tuple[np.ndarray, np.ndarray]], name: str, row: int, num: float, den: float) -> None:
    if name not in columns:  # a constraint type or alignment outside the known ones
        columns[name] = (np.zeros_like(columns["csr"][0]), np.zeros_like(columns["csr"][0]))
    columns[name][0][row] += num
    columns[name][1][row] += den


# ---------------------------------------------------------------- metrics


def compute_metrics(
    sessions: Sequence[Session],
    judgments: Mapping[Key, JudgmentRecord],
    *,
    allow_partial: bool = False,
    exclude_unparsed: bool = False,
    exclude_skipped: bool = False,
    resamples: int = 1000,
    seed: int = 0,
    expected: set[Key] | None = None,
    label: str | None = None,
    model: str | None = None,
    unfinished_stages: Sequence[str] = (),
) -> dict[str, Any]:
    """All metrics of a judged run.

    ``expected``: turns that were generated and must be judged (default: all turns);
    the others are ungenerated. Ungenerated turns, missing judgments and
    ``unfinished_stages`` (stages whose manifest status is ``running``) are errors
    unless ``allow_partial``; the result's ``partial`` says whether any was there.
    """
    scores, sessions, counts = _score_turns(
        sessions, judgments, expected, allow_partial, exclude_unparsed, exclude_skipped, unfinished_stages
    )
    if not sessions:
        raise SysbenchError("no sessions to score")
    table = build_table(sessions, scores)
    index = bootstrap_index(len(sessions), resamples, seed)
    turn_scores = list(scores.values())
    verdict_counts = {k: sum(s.verdicts[k] for s in turn_scores) for k in (YES, NO, OTHER)}
    by_type_n = {t: sum(s.constraints_by_type.get(t, 0) for s in turn_scores) for t in TYPE_ORDER}
    group_of = {s.system_id: s.group for s in sessions}

    return {
        "label": label,
        "model": model,
        "n_sessions": len(sessions),
        "n_turns": len(turn_scores),
        "n_constraints": sum(s.n_constraints for s in turn_scores),
        "csr": table.point("csr"),
        "csr_macro": table.point("csr_macro"),
        "isr": table.point("isr"),
        "ssr": table.point("ssr"),
        "csr_by_type": {t: table.point(f"csr_by_type.{t}") for t in TYPE_ORDER},
        "n_constraints_by_type": by_type_n,
        "isr_by_alignment": {a: table.point(f"isr_by_alignment.{a}") for a in ALIGNMENT_ORDER},
        "isr_by_group": {
            group: _isr_breakdown([s for s in turn_scores if group_of[s.system_id] == group]) for group in GROUP_ORDER
        },
        "rounds": {
            **{group: _rounds(table, np.array([g == group for g in table.groups])) for group in GROUP_ORDER},
            "all": _rounds(table, np.ones(len(sessions), dtype=bool)),
        },
        "ssr_by_group": {
            group: table.point("ssr", np.array([g == group for g in table.groups])) for group in GROUP_ORDER
        },
        "isr_by_round": _isr_by_round(turn_scores, table.n_rounds),
        "isr_by_round_by_group": {
            group: _isr_by_round([s for s in turn_scores if group_of[s.system_id] == group], table.n_rounds)
            for group in GROUP_ORDER
        },
        "ci95": {name: percentile_ci(table.resampled(name, index)) for name in CI_METRICS},
        "bootstrap": {"resamples": resamples, "seed": seed, "unit": "session"},
        "verdict_counts": verdict_counts,
        "n_other_verdicts": verdict_counts[OTHER],
        "n_missing_verdicts": sum(s.missing_verdicts for s in turn_scores),
        "n_unparsed_turns": counts["unparsed"],
        "n_skipped_turns": counts["skipped"],
        "n_missing_turns": counts["missing"],
        "n_ungenerated_turns": counts["ungenerated"],
        "unfinished_stages": list(unfinished_stages),
        "partial": counts["missing"] > 0 or counts["ungenerated"] > 0 or bool(unfinished_stages),
        "excluded_unparsed": counts["unparsed"] > 0 and exclude_unparsed,
    }


def _score_turns(
    sessions: Sequence[Session],
    judgments: Mapping[Key, JudgmentRecord],
    expected: set[Key] | None,
    allow_partial: bool,
    exclude_unparsed: bool,
    exclude_skipped: bool = False,
    unfinished_stages: Sequence[str] = (),
) -> tuple[dict[Key, TurnScore], list[Session], Counter]:
    usable, kept, counts = split_turns(
        sessions, judgments, expected, allow_partial, exclude_unparsed, exclude_skipped, unfinished_stages
    )
    by_id = {s.system_id: s for s in kept}
    scores = {key: score_turn(by_id[key[0]], key[1], judgment) for key, judgment in usable.items()}
    return scores, kept, counts


def _isr_by_round(turns: Sequence[TurnScore], n_rounds: int) -> list[float | None]:
    return [
        _ratio(sum(t.passed for t in turns if t.turn == n), sum(1 for t in turns if t.turn == n))
        for n in range(1, n_rounds + 1)
    ]


def _isr_breakdown(turns: Sequence[TurnScore]) -> dict[str, float | None]:
    result = {
        alignment: _ratio(
            sum(t.passed for t in turns if t.alignment == alignment), sum(1 for t in turns if t.alignment == alignment)
        )
        for alignment in ALIGNMENT_ORDER
    }
    result["all"] = _ratio(sum(t.passed for t in turns), len(turns))
    return result


def _rounds(table: SessionTable, rows: np.ndarray) -> list[float] | None:
    if not rows.any():
        return None
    chosen = table.leading[rows]
    return [float((chosen >= n).mean()) for n in range(1, table.n_rounds + 1)]


def _ratio(num: float, den: float) -> float | None:
    return float(num) / den if den else None


# ---------------------------------------------------------------- run directories


# ---------------------------------------------------------------- comparison


def _check_same_coverage(a: LoadedRun, b: LoadedRun) -> None:
    only_a, only_b = sorted(a.expected - b.expected), sorted(b.expected - a.expected)
    if only_a or only_b:
        parts = []
        if only_a:
            parts.append(f"{len(only_a)} turn(s) only in {a.path}: {name_keys(only_a)}")
        if only_b:
            parts.append(f"{len(only_b)} turn(s) only in {b.path}: {name_keys(only_b)}")
        raise SysbenchError("runs do not cover the same turns: " + "; ".join(parts))
    sessions_a = {s.system_id: s for s in a.sessions}
    sessions_b = {s.system_id: s for s in b.sessions}
    differing = []
    for system_id, turn in sorted(a.expected):
        sa, sb = sessions_a[system_id], sessions_b[system_id]
        ta, tb = sa.turn(turn), sb.turn(turn)
        shape_a = (sa.dependent, ta.alignment, tuple((c.id, c.type) for c in ta.constraints))
        shape_b = (sb.dependent, tb.alignment, tuple((c.id, c.type) for c in tb.constraints))
        if shape_a != shape_b:
            differing.append((system_id, turn))
    if differing:
        raise SysbenchError(
            f"runs {a.path} and {b.path} have different checklists, alignment or dependency on "
            f"{len(differing)} turn(s): {name_keys(differing)}"
        )


# ---------------------------------------------------------------- CLI


def sysbench_run_metrics(loaded: LoadedRun, **options: Any) -> dict[str, Any]:
    """CSR / ISR / SSR and breakdowns of a loaded run (``options``: the metrics verb's settings)."""
    return compute_metrics(
        loaded.sessions,
        loaded.judgments,
        expected=loaded.expected,
        label=loaded.label,
        model=loaded.model,
        unfinished_stages=loaded.unfinished_stages,
        **options,
    )


def compare_sysbench(
    runs: Sequence[LoadedRun], *, resamples: int = 1000, seed: int = 0, allow_partial: bool = False
) -> dict[str, Any]:
    """Paired difference B - A per headline metric, with a paired session bootstrap CI."""
    a, b = runs
    _check_same_coverage(a, b)
    tables = []
    for run in (a, b):
        try:
            scores, sessions, _ = _score_turns(
                run.sessions, run.judgments, run.expected, allow_partial, False, False, run.unfinished_stages
            )
        except SysbenchError as error:
            raise SysbenchError(f"{run.path}: {error} (compare needs two complete runs)") from None
        tables.append(build_table(sorted(sessions, key=lambda s: s.system_id), scores))
    table_a, table_b = tables
    index = bootstrap_index(len(table_a.system_ids), resamples, seed)
    metrics = {}
    for name in ratio_names():
        point_a, point_b = table_a.point(name), table_b.point(name)
        diff = None if point_a is None or point_b is None else point_b - point_a
        ci = percentile_ci(table_b.resampled(name, index) - table_a.resampled(name, index))
        metrics[name] = {"a": point_a, "b": point_b, "diff": diff, "ci95": ci if diff is not None else None}
    return {
        "run_a": {"path": str(a.path), "label": a.label, "model": a.model},
        "run_b": {"path": str(b.path), "label": b.label, "model": b.model},
        "n_sessions": len(table_a.system_ids),
        "n_turns": len(a.expected),
        "bootstrap": {"resamples": resamples, "seed": seed, "unit": "session", "paired": True},
        "metrics": metrics,
    }
