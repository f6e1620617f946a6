"""A generate run: the stage lock, the run directory's checks, sessions snapshot and manifest around the turn-
synchronous scheduler, and stats.json.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sysbench_gpu.benchmarks.registry import save_run_sessions
from sysbench_gpu.core.ablation_files import (
    DISTRACTORS_FILE,
    write_distractors,
)
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.locks import stage_lock
from sysbench_gpu.core.messages import (
    SYSTEM_FOLD_SEPARATOR,
)
from sysbench_gpu.core.progress import DEFAULT_LOG_EVERY
from sysbench_gpu.core.redact import Secrets, redact_settings
from sysbench_gpu.core.rundir import RunDir, utc_now
from sysbench_gpu.core.sessions import Dataset, Session
from sysbench_gpu.engines.base import Engine
from sysbench_gpu.generation.plan import (
    select_for_reference_history,
)
from sysbench_gpu.generation.scheduler import TurnScheduler
from sysbench_gpu.generation.settings import (
    STAGE,
    GenerateSettings,
    GenerateSummary,
    check_compatible,
    merged_snapshot,
    sampling_json,
    system_message_of,
)


def run_generation(
    engine: Engine,
    dataset: Dataset,
    sessions: list[Session],
    run_dir: RunDir | str,
    settings: GenerateSettings,
    *,
    engine_options: Mapping[str, Any] | None = None,
    progress: bool = True,
    lock: bool = True,
    secrets: Secrets | None = None,
    log_every: float = DEFAULT_LOG_EVERY,
) -> GenerateSummary:
    """Generate every missing (session, turn) of ``sessions`` into ``run_dir``; resumable.

    ``lock``: hold the stage lock of ``run_dir`` (primary only) for the call; False when the caller holds it.
    ``secrets``: the command's known secret values, removed from the recorded ``engine_options``.
    ``progress``: a bar on a terminal, else a line every ``log_every`` seconds (``core.progress``).
    """
    run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    with stage_lock(run_dir.path, STAGE, enabled=lock and bool(getattr(engine, "is_primary", True))):
        return _run_generation_locked(
            engine, dataset, sessions, run_dir, settings, engine_options, progress, secrets, log_every
        )


def _run_generation_locked(
    engine: Engine,
    dataset: Dataset,
    sessions: list[Session],
    run_dir: RunDir,
    settings: GenerateSettings,
    engine_options: Mapping[str, Any] | None,
    progress: bool,
    secrets: Secrets | None = None,
    log_every: float = DEFAULT_LOG_EVERY,
) -> GenerateSummary:
    check_compatible(run_dir, settings, dataset)
    plan = settings.plan(dataset)
    skipped_sessions: list[int] = []
    if settings.history == "reference":
        sessions, skipped_sessions = select_for_reference_history(sessions, settings.skip_missing_reference)
    if not sessions:
        raise SysbenchError(f"{dataset.path}: no sessions selected")
    scheduler = TurnScheduler(engine, run_dir, settings, sessions, progress=progress, plan=plan, log_every=log_every)
    writes = scheduler.writes
    if writes:
        run_dir.path.mkdir(parents=True, exist_ok=True)
        snapshot = merged_snapshot(run_dir, dataset, sessions)
        save_run_sessions(run_dir, snapshot, dataset)
        if settings.distractor_turns:
            write_distractors(
                run_dir.path / DISTRACTORS_FILE,
                {s.system_id: plan.distractors(s) for s in snapshot},
                settings.distractor_turns,
                settings.distractor_seed,
            )
        described = engine.describe()
        # The benchmark's own fields (generation_manifest): task and system message first, as always, then any others.
        benchmark_fields = dict(plan.protocol.generation_manifest(sessions))
        run_dir.update_manifest(
            STAGE,
            status="running",
            model=settings.model,
            engine=settings.engine,
            benchmark=dataset.benchmark,
            task=benchmark_fields.pop("task", None),
            system_message=system_message_of(list(dataset.sessions)),
            **{name: value for name, value in benchmark_fields.items() if name != "system_message"},
            **settings.ablation(),
            distractors_file=DISTRACTORS_FILE if settings.distractor_turns else None,
            sampling=sampling_json(settings.sampling),
            preset=settings.preset,
            steering=settings.steering,
            data_sha256=dataset.sha256,
            # --extra-body is stored as given, less any known secret value it holds literally.
            engine_options=redact_settings(dict(engine_options or {}), secrets),
            engine_describe=described,
            sampling_defaults=described.get("defaults"),
            max_tokens_reserved=scheduler.reserve,
            context_length=scheduler.context_length,
            on_overflow=settings.on_overflow,
            skip_missing_reference=settings.skip_missing_reference,
            skipped_sessions_missing_reference=skipped_sessions,
            system_folded=scheduler.fold_system,
            system_fold_separator=SYSTEM_FOLD_SEPARATOR if scheduler.fold_system else None,
            started=utc_now(),
        )
    try:
        scheduler.run()
    finally:
        if writes:
            # Refreshed at the end, stopped or not: retries and secrets redacted so far are counted in it.
            run_dir.update_manifest(STAGE, engine_describe=engine.describe())
    wanted = {(s.system_id, turn) for s in sessions for turn in plan.answered(s)}
    done = [r for k, r in scheduler.records.items() if k in wanted]
    summary = GenerateSummary(
        new_records=scheduler.new_records,
        skipped_records=sum(r.status != "ok" for r in done),
        total_records=len(done),
        calls=scheduler.calls,
        skipped_sessions=skipped_sessions,
    )
    if writes:
        if not run_dir.stats_path.exists():
            scheduler.write_stats()
        run_dir.update_manifest(
            STAGE,
            status="complete",
            finished=utc_now(),
            n_sessions=len(sessions),
            n_records=summary.total_records,
            n_skipped_records=summary.skipped_records,
        )
    return summary
