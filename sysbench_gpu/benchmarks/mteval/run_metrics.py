"""``metrics`` and ``compare`` on MT-Eval run directories.

A run's answered turns that were generated must each have a scored judgment; turns never
generated, a stage still running and missing judgments are refused unless
``--allow-partial``, unparsed and skipped turns unless excluded, exactly as for SysBench
(``benchmarks.turn_scoring.split_turns`` names the turns). The scores themselves are
``benchmarks.mteval.metrics.mteval_metrics``: per task, per category (recollection pools cls and
global-inst), per answered-turn index and overall (the mean of the category means), with
bootstrap CIs over dialogues.

``compare`` puts runs of one model side by side (multi, single, gold history): each run
against the first, **paired** when both cover the same dialogues and turns (model against
gold history), otherwise unpaired (multi against single) and said so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sysbench_gpu.benchmarks.mteval.data import answered_turns
from sysbench_gpu.benchmarks.mteval.metrics import (
    TurnScore,
    build_turn_scores,
    compare_mteval,
    mteval_metrics,
)
from sysbench_gpu.benchmarks.mteval.tables import side_by_side_markdown
from sysbench_gpu.benchmarks.turn_scoring import name_keys, split_turns
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.loaded_run import LoadedRun
from sysbench_gpu.core.sessions import Session

Key = tuple[int, int]


def answered_keys(session: Session) -> list[Key]:
    return [(session.system_id, t.index) for t in answered_turns(session)]


def run_kind(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """How the run was generated, from its manifest (older runs: model history, no distractors)."""
    section = (manifest.get("stages") or {}).get("generate") or {}
    if not isinstance(section, dict):
        section = {}
    return {
        "history": section.get("history") or "model",
        "system_message": section.get("system_message"),
    }


def scored_turns(
    run: LoadedRun,
    *,
    allow_partial: bool = False,
    exclude_unparsed: bool = False,
    exclude_skipped: bool = False,
) -> tuple[list[TurnScore], dict[str, Any]]:
    """The run's scored answered turns, and the bookkeeping of what was left out."""
    usable, kept, counts = split_turns(
        run.sessions,
        run.judgments,
        run.expected,
        allow_partial,
        exclude_unparsed,
        exclude_skipped,
        run.unfinished_stages,
        turns_of=answered_keys,
    )
    unscored = sorted(key for key, record in usable.items() if record.score is None)
    if unscored:
        raise SysbenchError(
            f"{len(unscored)} judgment(s) have no score (judged as SysBench checklists?): {name_keys(unscored)}; "
            "judge this MT-Eval run with `sysbench-gpu judge` (rules need no judge options)"
        )
    if not kept:
        raise SysbenchError("no dialogues to score")
    scores = {key: float(record.score) for key, record in usable.items() if record.score is not None}
    turns = build_turn_scores(kept, scores, allow_missing=True)
    bookkeeping = {
        "n_unparsed_turns": counts["unparsed"],
        "n_skipped_turns": counts["skipped"],
        "n_missing_turns": counts["missing"],
        "n_ungenerated_turns": counts["ungenerated"],
        "unfinished_stages": list(run.unfinished_stages),
        "partial": counts["missing"] > 0 or counts["ungenerated"] > 0 or bool(run.unfinished_stages),
        "excluded_unparsed": counts["unparsed"] > 0 and exclude_unparsed,
        "scorers": sorted({record.scorer for record in usable.values() if record.scorer}),
        "judge_models": sorted({record.judge_model for record in usable.values() if record.judge_model}),
    }
    if not turns:
        raise SysbenchError("no scored turns")
    return turns, bookkeeping


def mteval_run_metrics(
    run: LoadedRun,
    *,
    allow_partial: bool = False,
    exclude_unparsed: bool = False,
    exclude_skipped: bool = False,
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Every MT-Eval score of one run directory, with how the run was made and what was left out."""
    turns, bookkeeping = scored_turns(
        run, allow_partial=allow_partial, exclude_unparsed=exclude_unparsed, exclude_skipped=exclude_skipped
    )
    result = mteval_metrics(turns, resamples=resamples, seed=seed, label=run.label, model=run.model)
    return {**result, **run_kind(run.manifest), "settings": _settings(run), **bookkeeping}


def _settings(run: LoadedRun) -> list[str]:
    """multi / single / ablation: the settings of the run's dialogues."""
    return sorted({s.mteval.setting for s in run.sessions if s.mteval is not None})


# ---------------------------------------------------------------- comparison


def _same_dialogues(a: LoadedRun, b: LoadedRun) -> bool:
    """Whether two runs hold the same dialogues (ids, tasks and user messages), so their turns can be paired."""

    def shape(run: LoadedRun) -> dict[int, tuple]:
        return {
            s.system_id: (s.task, s.mteval.dialogue_id if s.mteval else None, tuple(t.user for t in s.turns))
            for s in run.sessions
        }

    return shape(a) == shape(b)


def compare_mteval_runs(
    runs: Sequence[LoadedRun], *, resamples: int = 1000, seed: int = 0, allow_partial: bool = False
) -> dict[str, Any]:
    """Each run against the first (B - A) with a bootstrap CI of the difference, and every run's scores.

    Runs must be finished unless ``allow_partial``; unparsed and skipped turns are refused
    (compare needs complete runs).
    """
    if len(runs) < 2:
        raise SysbenchError("compare needs at least two runs")
    not_mteval = [str(run.path) for run in runs if run.benchmark != "mteval"]
    if not_mteval:
        raise SysbenchError(f"cannot compare MT-Eval runs with SysBench runs ({', '.join(not_mteval)})")
    scored: list[list[TurnScore]] = []
    for run in runs:
        try:
            turns, _ = scored_turns(run, allow_partial=allow_partial)
        except SysbenchError as error:
            raise SysbenchError(f"{run.path}: {error} (compare needs complete runs)") from None
        scored.append(turns)
    base = runs[0]
    columns = []
    for run, turns in zip(runs, scored, strict=False):
        metrics = mteval_metrics(turns, resamples=resamples, seed=seed, label=run.label, model=run.model)
        columns.append(
            {
                "path": str(run.path),
                "label": run.label,
                "model": run.model,
                **run_kind(run.manifest),
                "settings": _settings(run),
                "metrics": metrics,
            }
        )
    comparisons = []
    for run, turns in zip(runs[1:], scored[1:], strict=False):
        paired = _same_dialogues(base, run) and _turn_keys(scored[0]) == _turn_keys(turns)
        result = compare_mteval(scored[0], turns, resamples=resamples, seed=seed, paired=paired)
        reason = (
            "same dialogues and turns: the same dialogue resamples for both runs"
            if paired
            else "different dialogues or turns (e.g. multi against single): each run resampled on its own"
        )
        comparisons.append({"run_a": _describe(base), "run_b": _describe(run), "pairing": reason, **result})
    return {"benchmark": "mteval", "runs": columns, "comparisons": comparisons}


def _turn_keys(turns: Sequence[TurnScore]) -> set[tuple[str, int, int]]:
    return {(t.task, t.system_id, t.turn) for t in turns}


def _describe(run: LoadedRun) -> dict[str, Any]:
    return {"path": str(run.path), "label": run.label, "model": run.model, **run_kind(run.manifest)}


# ---------------------------------------------------------------- text


def _score(value: float | None) -> str:
    return "   -" if value is None else f"{value:5.2f}"


def _ci(pair: Sequence[float] | None, signed: bool = False) -> str:
    if not pair:
        return ""
    return f"  [{pair[0]:+.2f}, {pair[1]:+.2f}]" if signed else f"  [{pair[0]:.2f}, {pair[1]:.2f}]"


def _by_turn(values: Sequence[float | None]) -> str:
    return ", ".join(f"{k}: {'-' if v is None else f'{v:.2f}'}" for k, v in enumerate(values, start=1))


def format_mteval_metrics(result: Mapping[str, Any]) -> str:
    """The text table of ``metrics`` on an MT-Eval run (scores 0-10, two decimals)."""
    partial = ""
    if result["partial"]:
        running = f", {' and '.join(result['unfinished_stages'])} still running" if result["unfinished_stages"] else ""
        partial = (
            f"  (PARTIAL: {result['n_ungenerated_turns']} turns not generated, "
            f"{result['n_missing_turns']} not judged{running})"
        )
    excluded = f"  ({result['n_unparsed_turns']} unparsed turns excluded)" if result["excluded_unparsed"] else ""
    skipped = f"  ({result['n_skipped_turns']} skipped turns excluded)" if result["n_skipped_turns"] else ""
    lines = [
        f"run {result['label']}  model {result['model']}  (MT-Eval, {result['history']} history, "
        f"{'/'.join(result['settings']) or '?'})",
        f"{result['n_sessions']} dialogues, {result['n_turns']} answered turns; scores "
        f"0-10{partial}{excluded}{skipped}",
        "",
        f"{'':<34}{'score':>6}  95% CI (dialogue bootstrap, {result['bootstrap']['resamples']} resamples)",
    ]
    categories = result["overall_of"]
    mark = "" if result["leaderboard_complete"] else " *"
    lines.append(f"{'overall (mean of categories)' + mark:<34}{_score(result['overall'])}{_ci(result['overall_ci95'])}")
    for name, block in result["categories"].items():
        lines.append(
            f"{'category ' + name:<34}{_score(block['score'])}{_ci(block['ci95'])}"
            f"   {block['n_sessions']} dialogues, {block['n_turns']} turns"
        )
    for name, block in result["tasks"].items():
        lines.append(f"{'task ' + name:<34}{_score(block['score'])}{_ci(block['ci95'])}   scorer {block['scorer']}")
    lines += ["", "by answered turn"]
    for name, block in result["tasks"].items():
        lines.append(f"  {name:<32}{_by_turn(block['by_turn'])}")
    if mark:
        lines += ["", f"* over the categories present ({', '.join(categories)}), not all four of the leaderboard"]
    if any(block["scorer"] == "judge" for block in result["tasks"].values()):
        lines += [
            "",
            "judge replies are read strictly (a JSON integer 1-10, else asked again); "
            f"{result['n_unparsed_turns']} turn(s) stayed unparsed; the authors' parser drops what it cannot read, "
            "as --exclude-unparsed does",
        ]
    return "\n".join(lines)


def format_mteval_comparison(result: Mapping[str, Any]) -> str:
    """Runs side by side (scores), then each run minus the first with its CI and whether it is paired."""
    columns = [(run["label"], run["metrics"]) for run in result["runs"]]
    comparisons = [(f"{c['run_b']['label']} - {c['run_a']['label']}", c) for c in result["comparisons"]]
    lines = [
        f"{chr(65 + i)} = {run['label']} ({run['path']}; {run['history']} history, {'/'.join(run['settings'])})"
        for i, run in enumerate(result["runs"])
    ]
    for comparison in result["comparisons"]:
        kind = "paired" if comparison["paired"] else "UNPAIRED"
        lines.append(
            f"{comparison['run_b']['label']} against {comparison['run_a']['label']}: {kind} ({comparison['pairing']})"
        )
    return "\n".join(lines + ["", side_by_side_markdown(columns, comparisons)])
