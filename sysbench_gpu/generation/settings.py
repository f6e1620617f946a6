"""A generate run's settings and the checks that a rerun into the same run directory asks for the same records."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sysbench_gpu.benchmarks.registry import benchmark_of, load_run_sessions
from sysbench_gpu.core.ablation_files import (
    ablation_settings,
    check_ablation_compatible,
)
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.redact import redact_settings
from sysbench_gpu.core.run_stats import read_stats
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.core.sessions import Dataset, Session
from sysbench_gpu.engines.base import Completion, SamplingSpec
from sysbench_gpu.generation.plan import (
    HISTORY_MODES,
    GenerationPlan,
)

STAGE = "generate"


OVERFLOW_POLICIES = ("error", "truncate-history", "skip")


# Manifest fields that must not change within one run directory (besides the ablation fields,
# core.ablation_files.ABLATION_FIELDS, checked first).
LOCKED_FIELDS = ("model", "engine", "sampling", "data_sha256", "system_message", "steering")


@dataclass(frozen=True)
class GenerateSettings:
    """What decides the content of the records; everything here goes into the manifest."""

    model: str  # as the user named it (e.g. "smollm2"), not the resolved path
    engine: str
    history: str = "model"  # model | reference | single-turn
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    on_overflow: str = "error"
    skip_missing_reference: bool = False
    distractor_turns: int = 0  # unrelated exchanges before user turn 1 (SysBench ablation)
    distractor_seed: int = 0
    preset: str | None = None  # ``--preset``: the benchmark's published decoding the flags were filled from
    steering: dict[str, Any] | None = None  # ``--steer-system``: modeling.steering.Steering.describe()
    # ``--extra-body`` (openai engine) as the manifest stores it (``engine_options.extra_body``, secrets
    # redacted): fields a server reads from every request, so they decide the records as the sampling does.
    extra_body: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.history not in HISTORY_MODES:
            raise SysbenchError(f"--history must be one of {', '.join(HISTORY_MODES)}, got {self.history!r}")
        if self.on_overflow not in OVERFLOW_POLICIES:
            raise SysbenchError(
                f"--on-overflow must be one of {', '.join(OVERFLOW_POLICIES)}, got {self.on_overflow!r}"
            )
        if self.distractor_turns < 0:
            raise SysbenchError(f"--distractor-turns must be 0 or more, got {self.distractor_turns}")

    def ablation(self) -> dict[str, Any]:
        """The manifest's ablation fields: history, distractor_turns, distractor_seed (null without distractors)."""
        return ablation_settings(self.history, self.distractor_turns, self.distractor_seed)

    def plan(self, dataset: Dataset) -> GenerationPlan:
        return GenerationPlan.for_dataset(dataset, self.history, self.distractor_turns, self.distractor_seed)


@dataclass
class GenerateSummary:
    new_records: int
    skipped_records: int
    total_records: int
    calls: list[CallStats]
    skipped_sessions: list[int]


def sampling_json(sampling: SamplingSpec) -> dict[str, Any]:
    return sampling.explicit()


def system_message_of(sessions: list[Session]) -> str | list[str] | None:
    """The system message a run sends, where its benchmark sets one (MT-Eval); None where sessions carry their own."""
    return benchmark_of(sessions).generation_manifest(sessions).get("system_message") if sessions else None


def check_compatible(run_dir: RunDir, settings: GenerateSettings, dataset: Dataset) -> None:
    """A rerun into an existing run directory must ask for the same records; name the field that differs."""
    stored = run_dir.generations.read()
    section = run_dir.read_manifest().get("stages", {}).get(STAGE)
    if section is None:
        if stored:
            raise SysbenchError(
                f"{run_dir.generations.path}: holds {len(stored)} records that `generate` did not make "
                f"(no '{STAGE}' stage in {run_dir.manifest_path.name}); use a new --out"
            )
        return
    if run_dir.stats_path.exists():
        read_stats(run_dir.stats_path)  # a damaged stats.json stops the resume now, not after the model loads
    # One ablation per run directory: history, distractor turns and seed first.
    check_ablation_compatible(section, settings.ablation(), str(run_dir.manifest_path))
    # The stored section went through redact_settings when written; the wanted one gets the same treatment.
    wanted = redact_settings(
        {
            "model": settings.model,
            "engine": settings.engine,
            "sampling": sampling_json(settings.sampling),
            "data_sha256": dataset.sha256,
            "system_message": system_message_of(list(dataset.sessions)),
            "steering": settings.steering,
        }
    )
    for name in LOCKED_FIELDS:
        old, new = section.get(name), wanted[name]
        if name == "sampling" and isinstance(old, dict):
            for key in sorted(set(old) | set(new)):
                if old.get(key) != new.get(key):
                    raise SysbenchError(
                        f"{run_dir.manifest_path}: field 'sampling.{key}' was {old.get(key)!r} in this run, "
                        f"this command asks for {new.get(key)!r}; rerun with the same flags or use a new --out"
                    )
        elif old != new:
            raise SysbenchError(
                f"{run_dir.manifest_path}: field '{name}' was {old!r} in this run, this command asks for {new!r}; "
                "rerun with the same settings or use a new --out"
            )
    # --extra-body is compared like the sampling flags: a server reads its fields as it reads theirs.
    stored_options = section.get("engine_options")
    stored_body = (stored_options.get("extra_body") if isinstance(stored_options, dict) else None) or None
    wanted_body = redact_settings(settings.extra_body) if settings.extra_body else None
    if stored_body != wanted_body:
        raise SysbenchError(
            f"{run_dir.manifest_path}: field 'engine_options.extra_body' was {stored_body!r} in this run, "
            f"this command asks for {wanted_body!r} (--extra-body); rerun with the same flags or use a new --out"
        )


def merged_snapshot(run_dir: RunDir, dataset: Dataset, selected: list[Session]) -> list[Session]:
    """The run's sessions: those of an earlier invocation plus the newly selected ones, in file order."""
    wanted = {s.system_id for s in selected}
    if run_dir.sessions_path.exists():
        wanted |= {s.system_id for s in load_run_sessions(run_dir)}
    return [s for s in dataset.sessions if s.system_id in wanted]


@dataclass
class CallStats:
    """Statistics of one engine call (one turn in model-history mode)."""

    turn: int | str  # the turn number (MT-Eval: answered-turn index), or "all" for a run's single call
    history: str
    requests: int
    wall_s: float
    prompt_tokens: int
    cached_prompt_tokens: int | None
    output_tokens: int
    finish_reasons: dict[str, int]
    skipped: int
    truncated: int
    started: str
    # Data-parallel replicas: requests each served in this call ("0": 12, "1": 13); None without replicas.
    replica_requests: dict[str, int] | None = None

    @property
    def output_tokens_per_s(self) -> float:
        return round(self.output_tokens / self.wall_s, 2) if self.wall_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["wall_s"] = round(self.wall_s, 3)
        out["output_tokens_per_s"] = self.output_tokens_per_s
        if out["replica_requests"] is None:
            del out["replica_requests"]  # a run without replicas keeps the fields it always had
        return out


def replica_requests(completions: Sequence[Completion]) -> dict[str, int] | None:
    """Requests per data-parallel replica (``Completion.extra["replica"]``), or None where no replica is named."""
    counts = Counter(str(c.extra["replica"]) for c in completions if "replica" in c.extra)
    return dict(sorted(counts.items(), key=lambda item: int(item[0]))) if counts else None
