"""A published workbook's rows as sessions and records: checklists parsed from text, verdict lines matched to them, the
shifted-reference anomaly, and the check against the benchmark file.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.sysbench.data import BENCHMARK, CONSTRAINT_TYPES, parse_sessions
from sysbench_gpu.benchmarks.sysbench.schema import session_to_upstream
from sysbench_gpu.benchmarks.sysbench.upstream_workbook import (
    Workbook,
    WorkbookRow,
)
from sysbench_gpu.core.errors import SysbenchError, where
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord, Verdict
from sysbench_gpu.core.sessions import Constraint, Dataset, Session, Turn
from sysbench_gpu.core.verdicts import NO, normalize_verdict

UPSTREAM_JUDGE = "gpt-4o (upstream)"


_EXAMPLES_KEPT = 5  # per anomaly kind, in the manifest


_ITEM_START = re.compile(r"^(\d+)\.[ ]?")


_VERDICT_LINE = re.compile(r"^\s*(\d+)\s*\.\s*(.*?)\s*\|\s*(.*?)\s*$")


def parse_checklist(text: str, loc: str) -> tuple[Constraint, ...]:
    """Parse ``N. content | type`` items; content may hold ``|`` and newlines."""
    items: list[tuple[int, list[str]]] = []
    for line in text.replace("\r\n", "\n").split("\n"):
        match = _ITEM_START.match(line)
        starts_item = match is not None and (
            not items or (int(match.group(1)) > items[-1][0] and _ends_with_type("\n".join(items[-1][1])))
        )
        if starts_item:
            items.append((int(match.group(1)), [line[match.end() :]]))
        elif items:
            items[-1][1].append(line)
        elif line.strip():
            raise SysbenchError(f"{loc}, column '评判细则': does not start with an item '1. content | type'")
    if not items:
        raise SysbenchError(f"{loc}, column '评判细则': empty checklist")
    constraints = []
    for number, lines in items:
        body = "\n".join(lines).rstrip()
        content, bar, type_raw = body.rpartition("|")
        type_raw = type_raw.strip()
        if not bar or type_raw not in CONSTRAINT_TYPES:
            raise SysbenchError(
                f"{loc}, column '评判细则', constraint {number}: expected 'content | type' with a type among "
                f"{', '.join(CONSTRAINT_TYPES)}, found {_preview(body)}"
            )
        content = content[:-1] if content.endswith(" ") else content  # undo upstream's "content | type"
        constraints.append(Constraint(id=number, content=content, type=CONSTRAINT_TYPES[type_raw], type_raw=type_raw))
    return tuple(constraints)


def _ends_with_type(body: str) -> bool:
    _, bar, tail = body.rstrip().rpartition("|")
    return bool(bar) and tail.strip() in CONSTRAINT_TYPES


@dataclass
class VerdictMatch:
    """Verdicts of one row matched to its checklist, with what did not line up."""

    verdicts: dict[str, Verdict]
    missing: list[int] = field(default_factory=list)  # checklist ids without a verdict line
    extra: list[str] = field(default_factory=list)  # keys of lines kept as extra-<line>
    type_mismatch: list[int] = field(default_factory=list)  # ids whose line names another type


def match_verdicts(text: str | None, constraints: Sequence[Constraint]) -> VerdictMatch:
    """Apply the verdict rule (``upstream``'s module doc) to one ``评判结果`` cell."""
    by_id = {c.id: c for c in constraints}
    result = VerdictMatch(verdicts={})
    lines = (text or "").replace("\r\n", "\n").split("\n")
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        match = _VERDICT_LINE.match(line)
        number = int(match.group(1)) if match else None
        if match and number in by_id and str(number) not in result.verdicts:
            constraint = by_id[number]
            raw = match.group(3)
            if match.group(2) != constraint.type_raw and CONSTRAINT_TYPES.get(match.group(2)) != constraint.type:
                result.type_mismatch.append(number)
            result.verdicts[str(number)] = Verdict(raw=raw, value=normalize_verdict(raw), type=constraint.type)
            continue
        key = f"extra-{line_no}"
        if match:
            raw, type_name = match.group(3), CONSTRAINT_TYPES.get(match.group(2), match.group(2) or "unknown")
        else:
            raw, type_name = line.strip(), "unknown"
        result.verdicts[key] = Verdict(raw=raw, value=normalize_verdict(raw), type=type_name)
        result.extra.append(key)
    result.missing = [c.id for c in constraints if str(c.id) not in result.verdicts]
    return result


def sessions_from_rows(workbook: Workbook) -> list[Session]:
    """Rebuild the sessions (with shifted references put back on their turns)."""
    sessions = []
    for system_id, rows in _rows_by_session(workbook).items():
        first = rows[0]
        for row in rows[1:]:
            for attribute, column in (
                ("system_prompt", "system_prompt"),
                ("dependent", "multi_rounds_related"),
                ("domain", "领域"),
                ("scene", "场景"),
            ):
                if getattr(row, attribute) != getattr(first, attribute):
                    raise SysbenchError(
                        f"{workbook.path}: row {row.excel_row}, {where(None, system_id, row.round_index)}, "
                        f"column {column!r}: differs from the session's first row (row {first.excel_row})"
                    )
        turns = []
        for row in rows:
            loc = f"{workbook.path}: row {row.excel_row}, {where(None, system_id, row.round_index)}"
            turns.append(
                Turn(
                    index=row.round_index,
                    user=row.prompt,
                    reference=unshifted_reference(rows, row.round_index),
                    alignment=row.alignment,
                    constraints=parse_checklist(row.checklist, loc),
                )
            )
        sessions.append(
            Session(
                system_id=system_id,
                system_prompt=first.system_prompt,
                turns=tuple(turns),
                dependent=first.dependent,
                domain=first.domain,
                scene=first.scene,
                benchmark=BENCHMARK,
            )
        )
    _check_round_trip(sessions, workbook.path)
    return sessions


def _rows_by_session(workbook: Workbook) -> dict[int, list[WorkbookRow]]:
    grouped: dict[int, list[WorkbookRow]] = {}
    for row in workbook.rows:
        grouped.setdefault(row.system_id, []).append(row)
    for system_id, rows in grouped.items():
        rows.sort(key=lambda r: r.round_index)
        rounds = [r.round_index for r in rows]
        if rounds != list(range(1, len(rows) + 1)):
            raise SysbenchError(
                f"{workbook.path}: {where(None, system_id)}: rows hold rounds {rounds}, expected 1..{len(rows)} "
                "once each (one row per turn)"
            )
    return grouped


def unshifted_reference(rows: Sequence[WorkbookRow], turn: int) -> str | None:
    """Turn ``turn``'s reference: the ``referrence`` cell of round ``2*turn`` (see ``upstream``'s module doc)."""
    source = 2 * turn
    return rows[source - 1].shifted_reference if source <= len(rows) else None


def _check_round_trip(sessions: Sequence[Session], source: Path) -> None:
    # The snapshot is written in upstream's schema (prompt_infos keyed by user text):
    # make sure it reads back to the very same sessions, e.g. no two turns share a text.
    reread = parse_sessions([session_to_upstream(s) for s in sessions], source=source)
    for before, after in zip(sessions, reread, strict=False):
        if before != after:
            raise SysbenchError(
                f"{source}: {where(None, before.system_id)}: cannot be written in upstream's schema "
                "(two turns with the same user text but different checklists?)"
            )


def check_against_data(workbook_sessions: Sequence[Session], dataset: Dataset, workbook: Path) -> list[Session]:
    """The data file's sessions for the workbook's ids, after checking that both agree."""
    known = dataset.by_id()
    chosen = []
    for mine in workbook_sessions:
        theirs = known.get(mine.system_id)
        if theirs is None:
            raise SysbenchError(f"{workbook}: {where(None, mine.system_id)}: not in {dataset.path}")
        _compare_session(mine, theirs, workbook, dataset.path)
        chosen.append(theirs)
    return chosen


def _compare_session(mine: Session, theirs: Session, workbook: Path, data: Path) -> None:
    def differs(turn: int | None, name: str, ours: Any, other: Any) -> SysbenchError:
        return SysbenchError(
            f"{workbook}: {where(None, mine.system_id, turn, name)}: workbook has {_preview(ours)}, "
            f"{data} has {_preview(other)}"
        )

    for name in ("system_prompt", "dependent", "domain", "scene"):
        if getattr(mine, name) != getattr(theirs, name):
            raise differs(None, name, getattr(mine, name), getattr(theirs, name))
    if len(mine.turns) != len(theirs.turns):
        raise differs(None, "turns", len(mine.turns), len(theirs.turns))
    for ours, other in zip(mine.turns, theirs.turns, strict=False):
        for name in ("user", "alignment"):
            if getattr(ours, name) != getattr(other, name):
                raise differs(ours.index, name, getattr(ours, name), getattr(other, name))
        if ours.constraints != other.constraints:
            mismatched = next(
                (a.id for a, b in zip(ours.constraints, other.constraints, strict=False) if a != b),
                len(other.constraints),
            )
            raise differs(ours.index, f"criteria {mismatched}", ours.constraints, other.constraints)
        if ours.reference is not None and other.reference is not None and ours.reference != other.reference:
            raise differs(ours.index, "reference", ours.reference, other.reference)


def _preview(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else repr(value)
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= width else flat[:width] + "…")


@dataclass
class Anomalies:
    """What did not line up, counted per kind with a few examples (``session S turn T``)."""

    counts: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, kind: str, system_id: int, turn: int, amount: int = 1) -> None:
        self.counts[kind] += amount
        bucket = self.examples.setdefault(kind, [])
        if len(bucket) < _EXAMPLES_KEPT:
            bucket.append(f"session {system_id} turn {turn}")

    def as_manifest(self) -> dict[str, Any]:
        return {"counts": dict(sorted(self.counts.items())), "examples": self.examples}


def build_records(
    workbook: Workbook, sessions: Sequence[Session], anomalies: Anomalies
) -> tuple[list[GenerationRecord], list[JudgmentRecord]]:
    by_id = {s.system_id: s for s in sessions}
    rows_by_session = _rows_by_session(workbook)
    generations, judgments = [], []
    for system_id, rows in rows_by_session.items():
        session = by_id[system_id]
        for row in rows:
            turn = session.turn(row.round_index)
            _check_shift(rows, row, anomalies)
            if row.answer is None or not row.answer.strip():
                anomalies.add("empty_answer", system_id, turn.index)
            generations.append(
                GenerationRecord(
                    system_id=system_id,
                    turn=turn.index,
                    user=turn.user,
                    response=row.answer or "",
                    history="upstream",
                    model=row.infer_model,
                    extra={"workbook_row": row.excel_row},
                )
            )
            matched = match_verdicts(row.verdicts, turn.constraints)
            for kind, found in (
                ("missing_verdict", matched.missing),
                ("extra_verdict_line", matched.extra),
                ("verdict_type_mismatch", matched.type_mismatch),
            ):
                if found:
                    anomalies.add(kind, system_id, turn.index, len(found))
            fails = any(v.value == NO for v in matched.verdicts.values())
            if row.usable is not None and row.usable != int(not fails):
                anomalies.add("usable_disagrees", system_id, turn.index)
            judgments.append(
                JudgmentRecord(
                    system_id=system_id,
                    turn=turn.index,
                    verdicts=matched.verdicts,
                    parse_status="imported",
                    reasoning=row.reasoning,
                    judge_model=UPSTREAM_JUDGE,
                    raw_reply=row.verdicts,
                    attempts=0,
                    extra={"workbook_row": row.excel_row, "usable": row.usable},
                )
            )
    return generations, judgments


def _check_shift(rows: Sequence[WorkbookRow], row: WorkbookRow, anomalies: Anomalies) -> None:
    # Odd rounds 2j-1 hold user prompt j: the evidence that the column is shifted as assumed.
    if row.round_index % 2 == 1:
        expected = rows[(row.round_index + 1) // 2 - 1].prompt
        if row.shifted_reference != expected:
            anomalies.add("reference_shift_unconfirmed", row.system_id, row.round_index)
