"""Import of upstream's published result workbooks into run directories.

Upstream publishes, per model, ``<model>_analysis.xlsx`` whose sheet ``详情`` has one
row per (session, turn): the session metadata, the user turn, the model's answer and
the GPT-4o verifier's reasoning and verdicts. ``import-upstream`` turns one workbook
into a run directory (sessions snapshot, generations, judgments, manifest) so that
``metrics``, ``compare`` and ``report`` work on published runs exactly as on ours.
Reading the sheet's rows is ``upstream_workbook.py``; this module builds the run from them.

Facts about the workbook that the import relies on (checked on all 21 workbooks):

- ``评判细则`` (checklist) is ``N. content | type`` per constraint, joined by newlines;
  a constraint's content could itself hold ``|`` or newlines, so an item ends at the
  *last* ``|`` and a new item starts only at a line ``M. `` (M > N) after an item that
  already ended with a known constraint type.
- ``评判结果`` (verdicts) is ``N. type | verdict`` per line.
- ``referrence`` is shifted by upstream's analysis step: the row of round ``i`` holds
  the ``i``-th message of ``[user1, assistant1, user2, assistant2, ...]``. So turn
  ``k``'s reference sits on the row of round ``2k`` (turns 1 and 2 of 5), the other
  turns have none, and rows of odd rounds hold a user prompt (used as a check).

Verdict rule (documented in docs/metrics.md): every verdict line is kept. A line is
matched to the checklist item with its number; its value is normalized with
:func:`normalize_verdict` and its type is the checklist's. A line whose number is not
in the checklist, repeats an earlier number, or does not parse is kept under the key
``extra-<line number>``: it can fail the turn (as upstream's ``是否可用`` column does)
but does not count towards CSR. A checklist item without a verdict line gets no
verdict (metrics count it as not satisfied, not failing). Each such case, and any row
where the resulting pass/fail disagrees with ``是否可用``, is counted in the manifest.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from sysbench_gpu.data import (
    CONSTRAINT_TYPES,
    Constraint,
    Dataset,
    Session,
    Turn,
    file_sha256,
    load_dataset,
    parse_sessions,
)
from sysbench_gpu.errors import SysbenchError, where
from sysbench_gpu.locks import stage_lock
from sysbench_gpu.runstore import GenerationRecord, JudgmentRecord, RunDir, Verdict, session_to_upstream
from sysbench_gpu.upstream_workbook import REQUIRED_COLUMNS, Workbook, WorkbookRow, read_workbook
from sysbench_gpu.verdicts import NO, normalize_verdict

UPSTREAM_JUDGE = "gpt-4o (upstream)"
GT_HISTORY_FOLDER = "with_gt_history_output"
_EXAMPLES_KEPT = 5  # per anomaly kind, in the manifest

_ITEM_START = re.compile(r"^(\d+)\.[ ]?")
_VERDICT_LINE = re.compile(r"^\s*(\d+)\s*\.\s*(.*?)\s*\|\s*(.*?)\s*$")


# ---------------------------------------------------------------- checklist and verdicts


def parse_checklist(text: str, loc: str) -> tuple[Constraint, ...]:
    """Parse ``N. content | type`` items; content may hold ``|`` and newlines."""
    items: list[tuple[int, list[str]]] = []
    for line in text.replace("\r\n", "\n").split("\n"):
        match = _ITEM_START.match(line)
        starts_item = match is not None and (
            not items or (int(match.group(1)) > items[-1][0] and _ends_with_type("\n".join(items[-1][1])))
        )
        if starts_item:
            items.append((int(match.group(1)), [line[match.end():]]))
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
    """Apply the module's verdict rule to one ``评判结果`` cell."""
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


# ---------------------------------------------------------------- sessions


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
    """Turn ``turn``'s reference: the ``referrence`` cell of round ``2*turn`` (see module doc)."""
    source = 2 * turn
    return rows[source - 1].shifted_reference if source <= len(rows) else None


def _check_round_trip(sessions: Sequence[Session], source: Path) -> None:
    # The snapshot is written in upstream's schema (prompt_infos keyed by user text):
    # make sure it reads back to the very same sessions, e.g. no two turns share a text.
    reread = parse_sessions([session_to_upstream(s) for s in sessions], source=source)
    for before, after in zip(sessions, reread):
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
    for ours, other in zip(mine.turns, theirs.turns):
        for name in ("user", "alignment"):
            if getattr(ours, name) != getattr(other, name):
                raise differs(ours.index, name, getattr(ours, name), getattr(other, name))
        if ours.constraints != other.constraints:
            mismatched = next(
                (a.id for a, b in zip(ours.constraints, other.constraints) if a != b), len(other.constraints)
            )
            raise differs(ours.index, f"criteria {mismatched}", ours.constraints, other.constraints)
        if ours.reference is not None and other.reference is not None and ours.reference != other.reference:
            raise differs(ours.index, "reference", ours.reference, other.reference)


def _preview(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else repr(value)
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= width else flat[:width] + "…")


# ---------------------------------------------------------------- records


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


# ---------------------------------------------------------------- import


@dataclass(frozen=True)
class ImportResult:
    run_dir: Path
    label: str
    model: str
    history: str
    rows: int
    sessions: int
    anomalies: dict[str, int]
    seconds: float
    already_present: bool = False


def default_label(workbook: Path) -> str:
    """The model folder's name; ``<name>-gt-history`` for with_gt_history_output workbooks."""
    name = workbook.parent.name or workbook.stem.removesuffix("_analysis")
    return f"{name}-gt-history" if _is_gt_history(workbook) else name


def _is_gt_history(workbook: Path) -> bool:
    return GT_HISTORY_FOLDER in workbook.resolve().parts


def import_workbook(
    workbook: str | Path,
    out: str | Path,
    *,
    data: str | Path | None = None,
    label: str | None = None,
    history: str | None = None,
) -> ImportResult:
    """Turn one upstream workbook into the run directory ``out`` (atomically, one importer at a time)."""
    workbook, out = Path(workbook), Path(out)
    # The run directory is built beside ``out`` and renamed, so the lock lives in the parent folder.
    with stage_lock(out, "import-upstream", lock_file=out.parent / f".{out.name}.import.lock"):
        return _import_locked(workbook, out, data, label, history)


def _import_locked(
    workbook: Path, out: Path, data: str | Path | None, label: str | None, history: str | None
) -> ImportResult:
    started = time.perf_counter()
    sha256 = file_sha256(workbook) if workbook.is_file() else None
    if out.exists():
        existing = _existing_import(out, sha256)
        if existing is not None:
            return existing
    book = read_workbook(workbook)
    sessions = sessions_from_rows(book)
    dataset = None
    if data is not None:
        dataset = load_dataset(data)
        sessions = check_against_data(sessions, dataset, workbook)
    anomalies = Anomalies()
    generations, judgments = build_records(book, sessions, anomalies)
    models = Counter(record.model for record in generations)
    model = models.most_common(1)[0][0]
    if len(models) > 1:
        anomalies.counts["mixed_infer_model"] = len(models)
    label = label or default_label(workbook)
    history = history or ("reference" if _is_gt_history(workbook) else "model")

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.import-", dir=out.parent))
    try:
        os.chmod(staging, 0o755)  # mkdtemp makes it private; a run directory is an ordinary shared folder
        run = RunDir(staging)
        run.update_manifest(label=label, model=model, source="upstream-workbook")
        if dataset is not None:
            run.write_sessions(sessions, dataset)
        else:
            run.write_sessions(sessions)
            run.update_manifest(
                dataset={
                    "path": str(book.path.resolve()),
                    "sha256": book.sha256,
                    "official": False,
                    "n_sessions": len(sessions),
                    "rebuilt_from": "workbook",
                }
            )
        run.generations.append(generations, existing=set())
        run.judgments.append(judgments, existing=set())
        seconds = round(time.perf_counter() - started, 3)
        run.update_manifest(
            stage="import",
            workbook=str(book.path.resolve()),
            workbook_sha256=book.sha256,
            sheet=book.sheet,
            rows=len(book.rows),
            sessions=len(sessions),
            model=model,
            label=label,
            history=history,
            judge_model=UPSTREAM_JUDGE,
            sessions_from=str(dataset.path) if dataset is not None else "workbook",
            reference_rule="turn k's reference is the 'referrence' cell of round 2k (upstream shifts the column)",
            verdict_rule="matched by checklist number; unmatched lines kept as extra-<line> (fail the turn on 否, "
            "no CSR credit); checklist items without a line have no verdict (not satisfied, not failing)",
            anomalies=anomalies.as_manifest(),
            seconds=seconds,
        )
        _move_into_place(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ImportResult(
        run_dir=out,
        label=label,
        model=model,
        history=history,
        rows=len(book.rows),
        sessions=len(sessions),
        anomalies=dict(anomalies.counts),
        seconds=seconds,
    )


def _existing_import(out: Path, sha256: str | None) -> ImportResult | None:
    """None when ``out`` is free to use; the earlier result when it holds this very import."""
    if not out.is_dir():
        raise SysbenchError(f"{out}: exists and is not a directory")
    if not any(out.iterdir()):
        return None
    section = RunDir(out).read_manifest().get("stages", {}).get("import", {}) if (out / "manifest.json").is_file() else {}
    if sha256 is not None and section.get("workbook_sha256") == sha256:
        return ImportResult(
            run_dir=out,
            label=section.get("label", ""),
            model=section.get("model", ""),
            history=section.get("history", ""),
            rows=section.get("rows", 0),
            sessions=section.get("sessions", 0),
            anomalies=section.get("anomalies", {}).get("counts", {}),
            seconds=0.0,
            already_present=True,
        )
    raise SysbenchError(f"{out}: directory exists and is not empty; import into a new or empty directory")


def _move_into_place(staging: Path, out: Path) -> None:
    if out.exists():
        out.rmdir()  # empty (checked before); a concurrent writer makes this fail loudly
    os.replace(staging, out)


# ---------------------------------------------------------------- CLI


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "import-upstream",
        help="turn a published upstream workbook into a run directory",
        description="Import upstream's <model>_analysis.xlsx (sheet 详情) as a run directory: sessions.json, "
        "generations.jsonl, judgments.jsonl (verdicts of upstream's GPT-4o verifier) and manifest.json.",
    )
    parser.add_argument("workbook", help="upstream-results/<model>/<model>_analysis.xlsx")
    parser.add_argument("--out", required=True, help="new (or empty) run directory")
    parser.add_argument("--data", help="take session metadata from this data file and check the workbook agrees")
    parser.add_argument("--label", help="run label (default: the model folder; <folder>-gt-history for gt history)")
    parser.add_argument(
        "--history",
        choices=("model", "reference"),
        help="how earlier turns were shown to the model (default: reference under with_gt_history_output, else model)",
    )
    parser.set_defaults(func=_cmd_import)


def _cmd_import(args: argparse.Namespace) -> int:
    result = import_workbook(args.workbook, args.out, data=args.data, label=args.label, history=args.history)
    if result.already_present:
        print(f"{result.run_dir}: already holds this workbook's import ({result.label}); nothing to do")
        return 0
    anomalies = ", ".join(f"{k} {v}" for k, v in sorted(result.anomalies.items())) or "none"
    print(
        f"imported {result.rows} rows ({result.sessions} sessions) of {result.model} as {result.label!r} "
        f"(history {result.history}) into {result.run_dir} in {result.seconds:.2f}s; anomalies: {anomalies}"
    )
    return 0


__all__ = [
    "REQUIRED_COLUMNS",
    "WorkbookRow",
    "Workbook",
    "read_workbook",
    "parse_checklist",
    "match_verdicts",
    "sessions_from_rows",
    "unshifted_reference",
    "check_against_data",
    "build_records",
    "default_label",
    "import_workbook",
    "ImportResult",
]
