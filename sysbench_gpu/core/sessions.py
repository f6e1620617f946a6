"""The shared session model: sessions, turns and constraints, datasets, and session-id selections."""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sysbench_gpu.core.errors import SysbenchError

NO_ALIGNMENT = "none"  # MT-Eval turns: the SysBench alignment does not apply


@dataclass(frozen=True)
class Constraint:
    """One checklist item of a turn."""

    id: int  # checklist number, 1-based, as the judge sees it
    content: str
    type: str  # English: one of TYPE_ORDER
    type_raw: str  # as written in the data, e.g. "内容约束"


@dataclass(frozen=True)
class MTEvalTurn:
    """What an MT-Eval turn carries beyond the shared fields (see docs/mteval.md)."""

    turn_id: str  # the turn's ``id`` in the file
    inst: str | None = None  # the instruction the answer is judged against (refinement, expansion)


@dataclass(frozen=True)
class MTEvalDialogue:
    """What an MT-Eval dialogue carries beyond the shared fields (see docs/mteval.md)."""

    dialogue_id: str  # the dialogue's ``id`` in the file (not unique in the cls_ablation files)
    setting: str  # "multi" | "single" | "ablation"
    inst_name: str | None = None  # global-inst: the verifiable instruction of every answered turn
    inst_args: Mapping[str, Any] = field(default_factory=dict, hash=False)
    n_distracts: int | None = None  # irrelevant-context ablation: unrelated turns in front


@dataclass(frozen=True)
class Turn:
    """One user turn with its checklist; ``reference`` is None when known missing.

    MT-Eval turns have no checklist; ``answered`` is False for a context turn, whose
    ``reference`` goes into the history as given and is never generated.
    """

    index: int  # 1-based
    user: str
    reference: str | None
    alignment: str  # "aligned" | "misaligned" (MT-Eval: NO_ALIGNMENT)
    constraints: tuple[Constraint, ...]
    answered: bool = True
    mteval: MTEvalTurn | None = None


@dataclass(frozen=True)
class Session:
    system_id: int
    system_prompt: str
    turns: tuple[Turn, ...]
    dependent: bool  # rounds_related: True = multi-turn dependent
    domain: str | None
    scene: str | None
    benchmark: str = ""  # the registered name of the benchmark the session belongs to (its loader sets it)
    task: str | None = None  # MT-Eval task, e.g. "refinement", "recollection-cls" (benchmarks.mteval.tasks.TASKS)
    mteval: MTEvalDialogue | None = None

    @property
    def group(self) -> str:
        return "dependent" if self.dependent else "parallel"

    def turn(self, index: int) -> Turn:
        return self.turns[index - 1]


@dataclass(frozen=True)
class Dataset:
    path: Path
    sha256: str
    sessions: tuple[Session, ...]
    is_official: bool = False  # the benchmark's published file (by checksum), as its loader says

    @property
    def benchmark(self) -> str:
        """The name of the benchmark the sessions belong to ("" for none)."""
        return self.sessions[0].benchmark if self.sessions else ""

    def by_id(self) -> dict[int, Session]:
        return {session.system_id: session for session in self.sessions}

    def select(self, system_ids: Iterable[int] | None = None, limit: int | None = None) -> list[Session]:
        """Sessions in file order, restricted to ``system_ids`` and then to the first ``limit``."""
        return select_sessions(self.sessions, system_ids, limit, source=self.path)


def select_sessions(
    sessions: Sequence[Session],
    system_ids: SessionIds | Iterable[int] | None = None,
    limit: int | None = None,
    source: Path | str = "<data>",
) -> list[Session]:
    """Sessions in their order, restricted to ``system_ids`` (unknown ids are an error), then to the first ``limit``."""
    chosen = list(sessions)
    if system_ids is not None:
        wanted = system_ids if isinstance(system_ids, SessionIds) else SessionIds.of(system_ids)
        missing = wanted.missing_from({s.system_id for s in chosen})
        if missing:
            raise SysbenchError(f"{source}: no session with system_id {missing}")
        chosen = [s for s in chosen if s.system_id in wanted]
    if limit is not None:
        chosen = chosen[:limit]
    return chosen


_NAMED_MISSING = 5


@dataclass(frozen=True)
class SessionIds:
    """Session ids as the user wrote them (``1,2,5-9``): inclusive ranges, never expanded into a list.

    ``--sessions 1-400000000`` costs two integers; membership and the ids missing
    from a dataset are computed against the dataset's ids, so the work is bounded
    by the data, not by the range.
    """

    ranges: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, ids: Iterable[int]) -> SessionIds:
        return cls(tuple((i, i) for i in ids))

    def __contains__(self, system_id: object) -> bool:
        return isinstance(system_id, int) and any(low <= system_id <= high for low, high in self.ranges)

    def __iter__(self) -> Iterator[int]:
        """Every id in the order written, repeats dropped (use only after checking against a dataset)."""
        seen: set[int] = set()
        for low, high in self.ranges:
            for system_id in range(low, high + 1):
                if system_id not in seen:
                    seen.add(system_id)
                    yield system_id

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SessionIds):
            return self.ranges == other.ranges
        if isinstance(other, (list, tuple)):
            return self.size() == len(other) and list(self) == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.ranges)

    def size(self) -> int:
        """How many distinct ids (ranges merged, nothing expanded)."""
        total, end = 0, None
        for low, high in sorted(self.ranges):
            if end is not None and low <= end:
                low = end + 1
            if high >= low:
                total += high - low + 1
            end = high if end is None else max(end, high)
        return total

    def missing_from(self, available: set[int]) -> str:
        """The requested ids absent from ``available``, as ``501-400000000`` or ``7, 9``; "" when none."""
        present = sorted(available)
        gaps: list[tuple[int, int]] = []
        for low, high in self.ranges:
            cursor = low
            start = bisect_left(present, low)
            for system_id in present[start:]:
                if system_id > high:
                    break
                if system_id > cursor:
                    gaps.append((cursor, system_id - 1))
                cursor = system_id + 1
            if cursor <= high:
                gaps.append((cursor, high))
        gaps = sorted(set(gaps))
        named = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in gaps[:_NAMED_MISSING])
        return named + (f" and {len(gaps) - _NAMED_MISSING} more" if len(gaps) > _NAMED_MISSING else "")

    def __str__(self) -> str:
        return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in self.ranges)


def parse_session_ids(text: str | None) -> SessionIds | None:
    """``"1,2,5-9"`` -> ids 1, 2, 5..9 (ranges stay ranges); None or empty -> None."""
    if not text:
        return None
    ranges: list[tuple[int, int]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part[1:]:
                cut = part.index("-", 1)
                low, high = int(part[:cut]), int(part[cut + 1 :])
                if high < low:
                    raise ValueError
            else:
                low = high = int(part)
        except ValueError:
            raise SysbenchError(f"--sessions: {part!r} is not a number or a range like 3-7") from None
        ranges.append((low, high))
    return SessionIds(tuple(ranges)) if ranges else None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
