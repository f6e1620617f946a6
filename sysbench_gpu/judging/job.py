"""A judge call checked and ready, then run: what the ``judge`` verb, ``judging.api.judge`` and a plan's step share.

``judging.cli.job_from_args`` checks the flags, the run directory and the benchmark's template
flags, and builds a :class:`JudgeJob` (nothing written, no engine). Then
:func:`estimate_judging` is the dry run, :func:`judging_progress` says from the run
directory's own files whether anything is left to judge (refusing, as the judge itself would,
a run judged by another judge), and :func:`run_judge_job` takes the lock, makes a
``--rejudge`` copy and judges.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sysbench_gpu.benchmarks.base import Benchmark
from sysbench_gpu.benchmarks.registry import benchmark_of, load_run_sessions
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.locks import stage_lock
from sysbench_gpu.core.progress import DEFAULT_LOG_EVERY
from sysbench_gpu.core.rundir import MANIFEST, RunDir
from sysbench_gpu.core.sessions import SessionIds
from sysbench_gpu.judging.rejudge import prepare_rejudge
from sysbench_gpu.judging.rounds import JudgeSettings, JudgeSummary
from sysbench_gpu.judging.stage import STAGE, _check_consistent, dry_run_report, judge_run

REJUDGE_WAIT_S = 600.0  # how long a non-primary rank waits for the primary to copy a --rejudge run


@dataclass(frozen=True)
class JudgeJob:
    """One judge call, checked: where it reads and writes, with which judge (None: rules alone)."""

    source: RunDir
    run: RunDir  # where the judgments go: the run itself, or the --rejudge copy
    settings: JudgeSettings | None
    engine_factory: Callable[[], Any] | None = field(repr=False)
    benchmark: Benchmark
    benchmark_options: Mapping[str, Any]
    system_ids: SessionIds | None = None
    limit: int | None = None
    rejudge: bool = False
    retry_unparsed: bool = False
    primary: bool = True


def estimate_judging(job: JudgeJob) -> dict[str, Any]:
    """The dry run: requests, tokens and cost of what is left to judge; nothing built or sent."""
    run = job.source if job.rejudge else job.run
    return dry_run_report(
        run, job.settings, job.limit, fresh=job.rejudge, system_ids=job.system_ids, options=job.benchmark_options
    )


def judging_progress(job: JudgeJob) -> tuple[bool, dict[str, Any] | None]:
    """Whether a rerun would judge nothing, and the dry run of what is left (None before any judgment).

    Complete: every generated turn has its record and the stage finished here. A run judged by another
    judge or template is refused here as the judge itself refuses it.
    """
    run = job.run
    if not run.manifest_path.is_file() or not run.judgments.path.exists():
        return False, None
    if job.settings is not None:
        sessions = load_run_sessions(run)
        settings = benchmark_of(sessions).configured(job.benchmark_options).judge_settings(job.settings)
        _check_consistent(run.judgments.read(), settings, run)
    report = estimate_judging(job)
    pending = report["turns_to_judge"] + report["turns_scored_by_rule"] + report["turns_skipped_no_response"]
    finished = run.stage_section(STAGE).get("status") == "complete"
    return finished and pending == 0 and report["turns_not_generated"] == 0, report


def run_judge_job(job: JudgeJob, *, progress: bool = True, log_every: float = DEFAULT_LOG_EVERY) -> JudgeSummary:
    """Judge what is left (after making the ``--rejudge`` copy); resumable. Only the primary rank writes."""
    # One writer: the lock covers a --rejudge set-up and the judging that follows it.
    with stage_lock(job.run.path, STAGE, enabled=job.primary):
        if job.rejudge:
            if job.primary:
                prepare_rejudge(job.source, job.run.path, job.limit, job.system_ids)
            else:
                wait_for_rejudge_copy(job.run)
        # A rejudge copy holds only the chosen sessions.
        return judge_run(
            job.run,
            job.settings,
            job.engine_factory if job.settings is not None else None,
            limit=None if job.rejudge else job.limit,
            system_ids=None if job.rejudge else job.system_ids,
            retry_unparsed=job.retry_unparsed,
            primary=job.primary,
            lock=False,
            options=job.benchmark_options,
            show_progress=progress,
            log_every=log_every,
        )


def wait_for_rejudge_copy(run: RunDir, timeout_s: float = REJUDGE_WAIT_S) -> None:
    """A non-primary rank reads the --rejudge copy only once the primary has finished making it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (run.path / MANIFEST).is_file():
            rejudged = run.read_manifest().get("rejudged_from")
            if isinstance(rejudged, dict) and rejudged.get("setup", "complete") == "complete":
                return
        time.sleep(0.2)
    raise SysbenchError(f"{run.path}: the primary rank did not finish the --rejudge copy within {timeout_s:.0f} s")
