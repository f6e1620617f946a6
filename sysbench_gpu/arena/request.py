"""What an arena call asks (``ArenaRequest``) and what it will play (``Plan``): shared by the stage and its checks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sysbench_gpu.arena.battles import (
    BattleKey,
    BattleRecord,
)
from sysbench_gpu.arena.prompt import ArenaTemplate
from sysbench_gpu.arena.replays import Changed, Pair
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.progress import DEFAULT_LOG_EVERY
from sysbench_gpu.judging.rounds import JudgeSettings

STAGE = "arena"


@dataclass(frozen=True)
class ArenaRequest:
    runs: Sequence[str]
    out: Path
    by: str = "verdicts"  # verdicts | judge
    baseline: str | None = None
    resamples: int = 1000
    seed: int = 0
    length_control: bool = False
    formats: Sequence[str] = ("png",)
    figures: bool = True
    show_progress: bool = True
    log_every: float = DEFAULT_LOG_EVERY  # judged battles, without a terminal: a progress line every so many seconds
    judge: JudgeSettings | None = None
    template: ArenaTemplate | None = None
    retry_unparsed: bool = False  # ask again the judged battles whose answer never parsed
    replay_changed: bool = False  # ask again the judged battles whose runs' conversations changed since

    @property
    def mode(self) -> str:
        return "baseline" if self.baseline is not None else "all-pairs"


def given_runs(request: ArenaRequest) -> list[str]:
    """The runs, with the baseline first among them (added if it was not listed)."""
    runs = list(request.runs)
    if request.baseline is not None:
        same = [r for r in runs if Path(r).resolve() == Path(request.baseline).resolve()]
        runs = [request.baseline] + [r for r in runs if r not in same]
    if len(runs) < 2:
        raise SysbenchError("arena needs at least two runs (or one run and --baseline RUN)")
    return runs


@dataclass(frozen=True)
class Plan:
    """What is stored, the pairs of this call, and the stored battles to take out and play again."""

    records: dict[BattleKey, BattleRecord]
    chosen: list[Pair]
    changed: Changed
    retry: set[BattleKey]

    @property
    def to_replace(self) -> set[BattleKey]:
        return self.changed.keys | self.retry


def baseline_path(baseline: str | None) -> str | None:
    """The baseline run as the manifest records it (resolved), so a rerun naming it another way is the same."""
    return str(Path(baseline).resolve()) if baseline is not None else None
