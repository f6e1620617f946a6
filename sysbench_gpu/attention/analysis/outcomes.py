"""Each turn's outcome as the run's benchmark sees it (``turn_view``): what the share correlation,
the head table and the knockout summary join.

Shared code never reads verdicts itself: a benchmark decides whether a turn is judged at
all (an unparsed judgment is not) and whether it passes, fails or only carries a score.
"""

from __future__ import annotations

from pathlib import Path

from sysbench_gpu.benchmarks.explorer import TurnView
from sysbench_gpu.benchmarks.registry import benchmark_of, load_run_sessions
from sysbench_gpu.core.rundir import RunDir


def turn_views(run_dir: Path) -> dict[tuple[int, int], TurnView]:
    """The benchmark's view of every turn of the run's sessions, judged or not, by (system_id, turn)."""
    run = RunDir(run_dir).require()
    sessions = load_run_sessions(run)
    benchmark = benchmark_of(sessions)
    judgments = run.judgments.read()
    return {
        (session.system_id, turn.index): benchmark.turn_view(
            session, turn.index, judgments.get((session.system_id, turn.index))
        )
        for session in sessions
        for turn in session.turns
    }


def pass_fail(views: dict[tuple[int, int], TurnView]) -> dict[tuple[int, int], float]:
    """1.0 (passed) or 0.0 (failed) for the judged turns that have a pass or fail; scored-only turns are left out."""
    return {key: float(view.passed) for key, view in views.items() if view.judged and view.passed is not None}


def turn_outcomes(run_dir: Path) -> dict[tuple[int, int], float]:
    """1.0 or 0.0 for every judged turn with a pass or fail, read through the run's benchmark (``turn_view``)."""
    return pass_fail(turn_views(run_dir))
