"""A generate run checked and ready, then run: what the ``generate`` verb, ``generation.api.generate`` and a
plan's step share.

``prepare_generation`` reads the data and the run directory and makes every check that needs no model
(a mismatched run directory, missing references, an ablation the data cannot have); nothing is created
or loaded. ``run_generation_job`` resolves the model, takes the stage lock, loads the engine and
generates what is missing. ``GenerationJob.complete`` says from the run directory's own files whether
there is anything left to generate (a plan skips such a step).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.registry import load_dataset
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.locks import is_primary_rank, stage_lock
from sysbench_gpu.core.progress import DEFAULT_LOG_EVERY, quiet_library_bars
from sysbench_gpu.core.redact import Secrets
from sysbench_gpu.core.rundir import GENERATIONS, RunDir
from sysbench_gpu.core.sessions import Dataset, Session, SessionIds
from sysbench_gpu.engines import get_engine
from sysbench_gpu.engines.model_depth import config_depth
from sysbench_gpu.engines.models import resolve_model
from sysbench_gpu.engines.openai_engine import check_repetition_penalty
from sysbench_gpu.generation.plan import missing_references, select_for_reference_history
from sysbench_gpu.generation.run import run_generation
from sysbench_gpu.generation.settings import STAGE, GenerateSettings, GenerateSummary, check_compatible
from sysbench_gpu.modeling.steering import Steering

Key = tuple[int, int]


@dataclass(frozen=True)
class GenerationJob:
    """Everything one generate call needs, checked; nothing created or loaded yet."""

    settings: GenerateSettings
    engine_options: Mapping[str, Any]
    dataset: Dataset
    sessions: list[Session]
    run_dir: RunDir
    steering: Steering | None = None
    secrets: Secrets | None = field(default=None, repr=False)

    def wanted(self) -> set[Key]:
        """The (session, turn) records this call is to leave in the run directory."""
        sessions = self.sessions
        if self.settings.history == "reference":
            sessions, _ = select_for_reference_history(sessions, self.settings.skip_missing_reference)
        plan = self.settings.plan(self.dataset)
        return {(s.system_id, turn) for s in sessions for turn in plan.answered(s)}

    def stored(self) -> set[Key]:
        """The (session, turn) records in the run directory now."""
        generations = self.run_dir.generations
        return set(generations.read()) if generations.path.exists() else set()

    def complete(self, wanted: set[Key] | None = None, stored: set[Key] | None = None) -> bool:
        """Whether the stage finished here before and every wanted record is stored (a rerun would add none).

        ``wanted`` and ``stored``: :meth:`wanted` and :meth:`stored` where the caller has them already.
        """
        if not self.run_dir.manifest_path.is_file():
            return False
        if self.run_dir.stage_section(STAGE).get("status") != "complete":
            return False
        return (self.wanted() if wanted is None else wanted) <= (self.stored() if stored is None else stored)


def prepare_generation(
    settings: GenerateSettings,
    *,
    data: str,
    out: str,
    engine_options: Mapping[str, Any] | None = None,
    benchmark: str | None = None,
    system_message: str | None = None,
    task: str | None = None,
    system_ids: SessionIds | None = None,
    limit: int | None = None,
    steering: Steering | None = None,
    secrets: Secrets | None = None,
) -> GenerationJob:
    """Read the data and the run directory and check them against ``settings``; creates and loads nothing."""
    options = dict(engine_options or {})
    if settings.engine == "openai":
        check_repetition_penalty(options.get("base_url"), settings.sampling.repetition_penalty)
    dataset = load_dataset(data, system_message=system_message, task=task, benchmark=benchmark)
    sessions = dataset.select(system_ids, limit)
    run_dir = RunDir(out)
    check_before_writing(run_dir, settings, dataset, sessions)
    return GenerationJob(settings, options, dataset, sessions, run_dir, steering, secrets)


def check_before_writing(
    run_dir: RunDir, settings: GenerateSettings, dataset: Dataset, sessions: list[Session]
) -> None:
    """What the run directory and the data must allow, read without writing (again under the lock, for a race)."""
    if run_dir.path.exists() and not run_dir.path.is_dir():
        raise SysbenchError(f"{run_dir.path}: is a file, not a run directory; choose another --out")
    if not sessions:
        raise SysbenchError(f"{dataset.path}: no sessions selected")
    if run_dir.path.is_dir():
        check_folder_writable(run_dir.path)
        run_dir.ensure_writable([GENERATIONS])
        check_compatible(run_dir, settings, dataset)
    if settings.history == "reference":
        if not settings.skip_missing_reference:
            select_for_reference_history(sessions, skip_missing=False)
        elif all(s.system_id in missing_references(sessions) for s in sessions):
            select_for_reference_history(sessions, skip_missing=True)  # leaves none: its one line
    plan = settings.plan(dataset)
    for session in sessions:
        plan.distractors(session)


def check_folder_writable(folder: Path) -> None:
    """An existing --out that cannot take a file is one line before the model is even looked at.

    An unnamed temporary file (O_TMPFILE on Linux) leaves nothing behind; ``os.access`` would not do,
    since it answers yes to root for an immutable folder.
    """
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise SysbenchError(
            f"{folder}: --out is not writable ({error.strerror or error}); fix its permissions first"
        ) from None


def run_generation_job(
    job: GenerationJob, *, progress: bool = True, log_every: float = DEFAULT_LOG_EVERY
) -> tuple[GenerateSummary, bool]:
    """Load the engine and generate what is missing; returns the summary and whether this process wrote."""
    settings = job.settings
    model = resolve_model(settings.model) if settings.engine in ("hf", "vllm") else settings.model
    if job.steering is not None:
        depth = config_depth(model)  # the config alone: --steer-layers/--steer-heads against the model's depth
        if depth.n_layers is not None:
            job.steering.check_depth(depth.n_layers, depth.n_heads)
    # One writer per run directory; taking the lock also checks --out before a model loads.
    with stage_lock(job.run_dir.path, STAGE, enabled=is_primary_rank(job.engine_options)):
        return _generate_locked(job, model, progress, log_every)


def _generate_locked(job: GenerationJob, model: str, progress: bool, log_every: float) -> tuple[GenerateSummary, bool]:
    settings, run_dir, sessions = job.settings, job.run_dir, job.sessions
    run_dir.ensure_writable([GENERATIONS])
    # Fail on a mismatched run directory, missing references or an impossible ablation before loading a model.
    check_compatible(run_dir, settings, job.dataset)
    if settings.history == "reference" and not settings.skip_missing_reference:
        select_for_reference_history(sessions, skip_missing=False)
    plan = settings.plan(job.dataset)
    for session in sessions:
        plan.distractors(session)
    # The command's secrets go to the engine that talks to a server; they are not an option to record.
    extra: dict[str, Any] = {"secrets": job.secrets} if settings.engine == "openai" and job.secrets else {}
    if job.steering is not None:
        extra["steering"] = job.steering  # recorded as the manifest's `steering` (settings), not as an engine option
    quiet_library_bars(force=not progress)
    engine = get_engine(settings.engine, model=model, **job.engine_options, **extra)
    try:
        summary = run_generation(
            engine,
            job.dataset,
            sessions,
            run_dir,
            settings,
            engine_options=dict(job.engine_options),
            progress=progress,
            lock=False,
            secrets=job.secrets,
            log_every=log_every,
        )
    finally:
        engine.close()
    return summary, bool(getattr(engine, "is_primary", True))
