"""What a plan run did: each step's outcome, the runs, the outputs, and the models that failed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.runs import run_metrics


@dataclass(frozen=True)
class StepOutcome:
    kind: str
    model: str | None
    run: str | None
    command: str  # the equivalent single command
    status: str  # "done before" | "ran" | "failed" | "not run"
    seconds: float = 0.0
    error: str | None = None


@dataclass
class PlanResult:
    """The result of ``run_plan``: ``runs`` maps each run's name to its run directory."""

    plan: Path
    sha256: str
    out: Path
    runs: dict[str, Path] = field(default_factory=dict)
    steps: list[StepOutcome] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # model -> its error line
    left_out: list[str] = field(default_factory=list)  # runs the report, arena and explorer do not cover
    report: Path | None = None
    arena: Path | None = None
    explore: Path | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed

    def metrics(self, run: str, **options: Any) -> dict[str, Any]:
        """``metrics RUN --json`` of one of the plan's runs, by its name."""
        return run_metrics(self.runs[run], **options)

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for outcome in self.steps:
            counts[outcome.status] = counts.get(outcome.status, 0) + 1
        return counts
