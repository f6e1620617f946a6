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

Every ratio is a ratio of per-session sums, so the bootstrap resamples sessions and
evaluates all metrics of all resamples with a few numpy reductions.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from sysbench_gpu.data import ALIGNMENT_ORDER, GROUP_ORDER, TYPE_ORDER, Session
from sysbench_gpu.errors import SysbenchError
from sysbench_gpu.metrics_load import LoadedRun, load_run
from sysbench_gpu.metrics_text import HEADLINE, format_comparison, format_metrics
from sysbench_gpu.runstore import JudgmentRecord
from sysbench_gpu.verdicts import NO, OTHER, YES

Key = tuple[int, int]
_NAMED = 5  # turns named in an error message before "... and N more"
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


@dataclass(frozen=True)
class SessionTable:
    """Per-session sufficient statistics: every metric is sum(num) / sum(den) over sessions."""

    system_ids: tuple[int, ...]
    groups: tuple[str, ...]
    leading: np.ndarray  # leading passing turns per session
    n_rounds: int  # T: the largest number of turns in a session
    ratios: dict[str, tuple[np.ndarray, np.ndarray]]  # metric name -> (num, den) per session

    def point(self, name: str, rows: np.ndarray | None = None) -> float | None:
        num, den = self.ratios[name]
        if rows is not None:
            num, den = num[rows], den[rows]
        total = float(den.sum())
        return float(num.sum()) / total if total else None

    def resampled(self, name: str, index: np.ndarray) -> np.ndarray:
        """The metric on each bootstrap resample (rows of ``index``); NaN where undefined."""
        num, den = self.ratios[name]
        top, bottom = num[index].sum(axis=1), den[index].sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(bottom > 0, top / np.where(bottom > 0, bottom, 1), np.nan)


def ratio_names() -> list[str]:
    return (
        list(HEADLINE)
        + [f"csr_by_type.{t}" for t in TYPE_ORDER]
        + [f"isr_by_alignment.{a}" for a in ALIGNMENT_ORDER]
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
            _add(columns, "csr_macro", row, score.satisfied / score.n_constraints if score.n_constraints else 0.0,
                 1 if score.n_constraints else 0)
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


def bootstrap_index(n_sessions: int, resamples: int, seed: int) -> np.ndarray:
    """Session indices of each resample (with replacement), from a seeded numpy Generator."""
    if resamples < 1:
        raise SysbenchError(f"--resamples must be at least 1, got {resamples}")
    rng = np.random.default_rng(seed)
    return rng.integers(0, n_sessions, size=(resamples, n_sessions))


def percentile_ci(values: np.ndarray) -> list[float] | None:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return None
    low, high = np.percentile(finite, [2.5, 97.5])
    return [float(low), float(high)]


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
            group: _isr_breakdown([s for s in turn_scores if group_of[s.system_id] == group])
            for group in GROUP_ORDER
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


def all_turns(session: Session) -> list[Key]:
    return [(session.system_id, t.index) for t in session.turns]


def split_turns(
    sessions: Sequence[Session],
    judgments: Mapping[Key, JudgmentRecord],
    expected: set[Key] | None,
    allow_partial: bool,
    exclude_unparsed: bool,
    exclude_skipped: bool = False,
    unfinished_stages: Sequence[str] = (),
    turns_of: Callable[[Session], list[Key]] = all_turns,
) -> tuple[dict[Key, JudgmentRecord], list[Session], Counter]:
    """The judgments that can be scored, the sessions that have expected turns, and what was left out.

    ``turns_of`` names the turns of a session that are scored (SysBench: all of them;
    MT-Eval: the answered ones). Ungenerated turns, a running stage and missing
    judgments are errors unless ``allow_partial``; unparsed and skipped turns are errors
    unless excluded. Every error names the turns briefly (``name_keys``).
    """
    counts: Counter = Counter()
    ungenerated: list[Key] = []
    missing: list[Key] = []
    unparsed: list[Key] = []
    skipped: list[Key] = []  # the model gave no reply (over-length): neither passed nor failed silently
    usable: dict[Key, JudgmentRecord] = {}
    kept: list[Session] = []
    for session in sessions:
        keys = turns_of(session)
        wanted = [k for k in keys if expected is None or k in expected]
        ungenerated += [k for k in keys if expected is not None and k not in expected]
        if not wanted:
            continue  # a session this run never generated
        kept.append(session)
        for key in wanted:
            judgment = judgments.get(key)
            if judgment is None:
                missing.append(key)
            elif judgment.parse_status == "unparsed":
                unparsed.append(key)
            elif judgment.parse_status == "skipped":
                skipped.append(key)
            else:
                usable[key] = judgment
    if not allow_partial and (ungenerated or unfinished_stages):
        stages = " and ".join(f"`{stage}`" for stage in unfinished_stages)
        parts = []
        if ungenerated:
            parts.append(f"{len(ungenerated)} turn(s) were never generated ({name_keys(ungenerated)})")
        if unfinished_stages:
            parts.append(f"the manifest says {stages} is still running (or was stopped part-way)")
        raise SysbenchError(
            f"unfinished run: {'; '.join(parts)}; finish it by rerunning the same command, "
            "or pass --allow-partial to score what is there"
        )
    if missing and not allow_partial:
        raise SysbenchError(
            f"{len(missing)} expected turn(s) have no judgment: {name_keys(missing)}; "
            "run judge to finish them, or pass --allow-partial to score the judged subset"
        )
    if unparsed and not exclude_unparsed:
        raise SysbenchError(
            f"{len(unparsed)} judgment(s) are unparsed (the judge's reply never parsed): {name_keys(unparsed)}; "
            "rerun judge to retry them, or pass --exclude-unparsed to leave them out (they are counted)"
        )
    if skipped and not exclude_skipped:
        raise SysbenchError(
            f"{len(skipped)} turn(s) were skipped at generation (no reply, e.g. over-length): {name_keys(skipped)}; "
            "regenerate with --on-overflow truncate-history, or pass --exclude-skipped to leave them out (they are counted)"
        )
    counts["ungenerated"] = len(ungenerated)
    counts["missing"] = len(missing)
    counts["unparsed"] = len(unparsed)
    counts["skipped"] = len(skipped)
    return usable, kept, counts


def name_keys(keys: Sequence[Key], sessions_named: int = _NAMED) -> str:
    """Turns briefly, by session: ``session 3, turns 2-5; session 4, turn 1; ... and 4 more``."""
    by_session: dict[int, list[int]] = {}
    for system_id, turn in sorted(keys):
        by_session.setdefault(system_id, []).append(turn)
    named = []
    for system_id, turns in list(by_session.items())[:sessions_named]:
        spans: list[list[int]] = []
        for turn in turns:
            if spans and turn == spans[-1][1] + 1:
                spans[-1][1] = turn
            else:
                spans.append([turn, turn])
        listed = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
        named.append(f"session {system_id}, turn{'s' if len(turns) > 1 else ''} {listed}")
    more = len(by_session) - sessions_named
    return "; ".join(named) + (f"; ... and {more} more session{'s' if more > 1 else ''}" if more > 0 else "")


def _isr_by_round(turns: Sequence[TurnScore], n_rounds: int) -> list[float | None]:
    return [
        _ratio(sum(t.passed for t in turns if t.turn == n), sum(1 for t in turns if t.turn == n))
        for n in range(1, n_rounds + 1)
    ]


def _isr_breakdown(turns: Sequence[TurnScore]) -> dict[str, float | None]:
    result = {
        alignment: _ratio(sum(t.passed for t in turns if t.alignment == alignment),
                          sum(1 for t in turns if t.alignment == alignment))
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


def run_metrics(
    run_dir: str | Path,
    *,
    allow_partial: bool = False,
    exclude_unparsed: bool = False,
    exclude_skipped: bool = False,
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Metrics of a run directory (sessions.json + generations + judgments + manifest).

    A SysBench run gets CSR / ISR / SSR; an MT-Eval run its 0-10 scores per task, category,
    answered turn and overall (``mteval.run_metrics``), with the same partial-run rules.
    """
    loaded = load_run(run_dir)
    try:
        if loaded.benchmark == "mteval":
            from sysbench_gpu.mteval.run_metrics import mteval_run_metrics

            return mteval_run_metrics(loaded, allow_partial=allow_partial, exclude_unparsed=exclude_unparsed,
                                      exclude_skipped=exclude_skipped, resamples=resamples, seed=seed)
        return compute_metrics(
            loaded.sessions,
            loaded.judgments,
            allow_partial=allow_partial,
            exclude_unparsed=exclude_unparsed,
            exclude_skipped=exclude_skipped,
            resamples=resamples,
            seed=seed,
            expected=loaded.expected,
            label=loaded.label,
            model=loaded.model,
            unfinished_stages=loaded.unfinished_stages,
        )
    except SysbenchError as error:
        raise SysbenchError(f"{loaded.path}: {error}") from None


# ---------------------------------------------------------------- comparison


def compare_runs(
    run_a: str | Path, run_b: str | Path, *, resamples: int = 1000, seed: int = 0, allow_partial: bool = False
) -> dict[str, Any]:
    """Paired difference B - A per headline metric, with a paired session bootstrap CI.

    Both runs must be finished (every turn generated and judged) unless ``allow_partial``.
    Two MT-Eval runs are compared by ``mteval.run_metrics.compare_mteval_runs``.
    """
    a, b = load_run(run_a), load_run(run_b)
    if "mteval" in (a.benchmark, b.benchmark):
        from sysbench_gpu.mteval.run_metrics import compare_mteval_runs

        return compare_mteval_runs([a, b], resamples=resamples, seed=seed, allow_partial=allow_partial)
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


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("metrics", help="CSR, ISR, SSR and breakdowns of a judged run (MT-Eval: scores by task, category and turn)")
    parser.add_argument("run_dir", help="run directory (generated and judged, or imported)")
    parser.add_argument("--json", action="store_true", help="print JSON (fractions in [0, 1])")
    parser.add_argument(
        "--allow-partial", action="store_true", help="score what is there of an unfinished run (ungenerated or unjudged turns)"
    )
    parser.add_argument("--exclude-unparsed", action="store_true", help="leave out (and count) unparsed judgments")
    parser.add_argument(
        "--exclude-skipped", action="store_true", help="leave out (and count) turns skipped at generation (no reply)"
    )
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.set_defaults(func=_cmd_metrics)

    compare = subparsers.add_parser("compare", help="difference of runs' metrics (B - A) with CIs, paired where they share sessions")
    compare.add_argument("run_a", help="baseline run directory")
    compare.add_argument("run_b", nargs="+",
                         help="run directory compared against it (MT-Eval: one or more, each against RUN_A)")
    compare.add_argument("--json", action="store_true", help="print JSON")
    compare.add_argument("--allow-partial", action="store_true", help="compare runs with ungenerated or unjudged turns")
    compare.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default 1000)")
    compare.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    compare.set_defaults(func=_cmd_compare)


def _cmd_metrics(args: argparse.Namespace) -> int:
    result = run_metrics(
        args.run_dir,
        allow_partial=args.allow_partial,
        exclude_unparsed=args.exclude_unparsed,
        exclude_skipped=args.exclude_skipped,
        resamples=args.resamples,
        seed=args.seed,
    )
    if result.get("benchmark") == "mteval":
        from sysbench_gpu.mteval.run_metrics import format_mteval_metrics

        _emit(result, args.json, format_mteval_metrics)
    else:
        _emit(result, args.json, format_metrics)
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    options = {"resamples": args.resamples, "seed": args.seed, "allow_partial": args.allow_partial}
    if len(args.run_b) == 1:
        result = compare_runs(args.run_a, args.run_b[0], **options)
    else:
        runs = [load_run(path) for path in (args.run_a, *args.run_b)]
        if any(run.benchmark != "mteval" for run in runs):
            raise SysbenchError("compare takes two SysBench runs (RUN_A RUN_B); several runs against RUN_A "
                                "are for MT-Eval runs")
        from sysbench_gpu.mteval.run_metrics import compare_mteval_runs

        result = compare_mteval_runs(runs, **options)
    if result.get("benchmark") == "mteval":
        from sysbench_gpu.mteval.run_metrics import format_mteval_comparison

        _emit(result, args.json, format_mteval_comparison)
    else:
        _emit(result, args.json, format_comparison)
    return 0


def _emit(result: Mapping[str, Any], as_json: bool, formatter: Any) -> None:
    if as_json:
        json.dump(result, sys.stdout, ensure_ascii=False, indent=2)
        print()
    else:
        print(formatter(result))
