"""A run directory as the metrics of every benchmark read it (``benchmarks.runs.load_run`` makes one)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sysbench_gpu.core.records import JudgmentRecord
from sysbench_gpu.core.sessions import Session

Key = tuple[int, int]


@dataclass(frozen=True)
class LoadedRun:
    path: Path
    label: str
    model: str | None
    sessions: list[Session]
    judgments: dict[Key, JudgmentRecord]
    expected: set[Key]
    unfinished_stages: tuple[str, ...] = ()
    manifest: Mapping[str, Any] = field(default_factory=dict)

    @property
    def benchmark(self) -> str:
        """The name of the benchmark the run's sessions belong to."""
        return self.sessions[0].benchmark if self.sessions else ""
