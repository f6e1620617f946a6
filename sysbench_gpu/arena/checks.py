"""What the arena checks before its folder is made: ``--out``, the arena already there, and whether any battle
can have an outcome (``arena.stage`` calls these before it writes anything)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sysbench_gpu.arena.battles import (
    BATTLES,
    REPLACED,
    BattleStore,
    battle_turns,
)
from sysbench_gpu.arena.judged import questions
from sysbench_gpu.arena.outputs import LEADERBOARD_MD, LEADERBOARD_TEX, RATINGS
from sysbench_gpu.arena.ratings import outcomes
from sysbench_gpu.arena.replays import Pair
from sysbench_gpu.arena.request import STAGE, ArenaRequest, Plan, baseline_path
from sysbench_gpu.arena.runs import ArenaRun
from sysbench_gpu.core.arguments import check_out_folder
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.locks import lock_path
from sysbench_gpu.core.rundir import GENERATIONS, JUDGMENTS, RunDir
from sysbench_gpu.judging.cache import CACHE_DIRNAME
from sysbench_gpu.judging.ledger import LEDGER, LEDGER_JOURNAL

# What an arena writes into its folder (besides manifest.json): a folder holding only these is an arena's
# (one stopped before its first battle), as is one whose manifest has a stages.arena section.
ARENA_FILES = frozenset(
    {
        lock_path(Path(), STAGE).name,
        BATTLES,
        REPLACED,
        RATINGS,
        LEADERBOARD_MD,
        LEADERBOARD_TEX,
        "figures",
        LEDGER,
        LEDGER_JOURNAL,
        CACHE_DIRNAME,
    }
)


def is_arena_folder(path: Path) -> bool:
    """An earlier arena's folder: its manifest has a stages.arena section, or it holds only what an arena writes."""
    run = RunDir(path)
    if run.manifest_path.is_file():
        return bool(run.stage_section(STAGE))
    return all(entry.name in ARENA_FILES for entry in path.iterdir())


def check_arena_out(request: ArenaRequest) -> None:
    """``--out``: not a file, not one of the runs (nor inside one), and empty or an earlier arena; nothing made."""
    inputs = [*request.runs, *([request.baseline] if request.baseline is not None else [])]
    check_out_folder(request.out, inputs=inputs, kind="arena", is_own=is_arena_folder)


def check_same_arena(out: RunDir, request: ArenaRequest) -> None:
    """Refuse to mix ways of deciding battles in one arena directory."""
    section = out.stage_section(STAGE) if out.manifest_path.is_file() else {}
    if not section:
        return
    if section.get("by") != request.by:
        raise SysbenchError(
            f"{out.manifest_path}: field by: this arena's battles were decided by {section.get('by')}; "
            f"this call asks --by {request.by}; use another --out"
        )
    if request.by == "judge" and request.judge is not None and request.template is not None:
        judge = section.get("judge") or {}
        if judge.get("model") != request.judge.model or section.get("template", {}).get("sha256") != (
            request.template.sha256
        ):
            raise SysbenchError(
                f"{out.manifest_path}: field judge: battles here were judged by {judge.get('model')!r} with template "
                f"{str(section.get('template', {}).get('sha256'))[:12]}; this call asks {request.judge.model!r} "
                f"with template {request.template.sha256[:12]}; use another --out"
            )
    _check_same_mode(out, section, request)


def _check_same_mode(out: RunDir, section: Mapping[str, Any], request: ArenaRequest) -> None:
    """Refuse a mode (or baseline) other than the one the stored battles were played in."""
    store = BattleStore(out.path)
    if "mode" not in section or not store.path.is_file() or store.path.stat().st_size == 0:
        return  # nothing played yet: any mode may start here
    mode, baseline = section.get("mode"), section.get("baseline")
    stored_path = section.get("baseline_path") or baseline_path(baseline)
    if mode == request.mode and stored_path == baseline_path(request.baseline):
        return
    had = f"against the baseline {baseline}" if mode == "baseline" else str(mode)
    asks = f"against the baseline {request.baseline}" if request.baseline is not None else "all-pairs"
    again = f"--baseline {baseline}" if mode == "baseline" else "no --baseline"
    raise SysbenchError(
        f"{out.manifest_path}: field mode: the battles in {request.out} were played {had}; this call asks {asks}; "
        f"rerun with {again}, or use another --out"
    )


def check_outcomes_possible(request: ArenaRequest, runs: Sequence[ArenaRun], plan: Plan) -> None:
    """Refuse, before anything is written, a call after which no battle could have an outcome."""
    kept = {key: record for key, record in plan.records.items() if key not in plan.to_replace}
    if outcomes(kept, {(a.key, b.key) for a, b in plan.chosen})[0]:
        return
    if request.by == "judge":
        if questions(plan.chosen, set(kept)):
            return  # the judge decides; a call whose every answer fails to parse keeps them and says so
        if kept:
            raise SysbenchError(
                f"{request.out / BATTLES}: no battle has an outcome ({len(kept)} battle records, none parsed in "
                "both orders); rerun with --retry-unparsed to ask the judge again"
            )
    elif any(_judged_in_both(a, b) for a, b in plan.chosen):
        return
    raise SysbenchError(_no_battle_reason(request, runs, plan.chosen))


def _judged_in_both(a: ArenaRun, b: ArenaRun) -> bool:
    return any(a.points.get(key) is not None and b.points.get(key) is not None for key in battle_turns(a, b))


def _no_battle_reason(request: ArenaRequest, runs: Sequence[ArenaRun], chosen: Sequence[Pair]) -> str:
    """Why no pair has a battle: a run (and its file) with no reply or no verdict, or a pair with no turn shared."""
    playing = {run.key for pair in chosen for run in pair}
    for run in runs:
        if run.key in playing and not any(run.reply(key) is not None for key in run.generations):
            return (
                f"arena: {Path(run.given) / GENERATIONS}: run {run.given} has no reply to battle with; "
                "generate it first"
            )
    if request.by == "verdicts":
        for run in runs:
            if run.key in playing and all(points is None for points in run.points.values()):
                return (
                    f"arena: {Path(run.given) / JUDGMENTS}: run {run.given} has no judged turn, so no verdict "
                    f"battle; judge it first (sysbench-gpu judge {run.given} ...), or use --by judge"
                )
    a, b = chosen[0]
    what = "answered and judged" if request.by == "verdicts" else "answered"
    return (
        f"arena: no turn is {what} in both {a.given} and {b.given} ({GENERATIONS}, {JUDGMENTS}); "
        "no battle can be played"
    )
