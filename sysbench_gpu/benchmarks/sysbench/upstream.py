"""Import of upstream's published result workbooks into run directories.

Upstream publishes, per model, ``<model>_analysis.xlsx`` whose sheet ``详情`` has one
row per (session, turn): the session metadata, the user turn, the model's answer and
the GPT-4o verifier's reasoning and verdicts. ``import-upstream`` turns one workbook
into a run directory (sessions snapshot, generations, judgments, manifest) so that
``metrics``, ``compare`` and ``report`` work on published runs exactly as on ours.
Reading the sheet's rows is ``upstream_workbook``; turning them into sessions and records (the
rules below) is ``upstream_records``; this module builds the run directory from them.

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
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from sysbench_gpu.benchmarks.registry import load_dataset, save_run_sessions
from sysbench_gpu.benchmarks.sysbench.upstream_records import (
    UPSTREAM_JUDGE,
    Anomalies,
    build_records,
    check_against_data,
    match_verdicts,
    parse_checklist,
    sessions_from_rows,
    unshifted_reference,
)
from sysbench_gpu.benchmarks.sysbench.upstream_workbook import (
    REQUIRED_COLUMNS,
    Workbook,
    WorkbookRow,
    read_workbook,
)
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.locks import stage_lock
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.core.sessions import file_sha256

GT_HISTORY_FOLDER = "with_gt_history_output"


# ---------------------------------------------------------------- checklist and verdicts


# ---------------------------------------------------------------- sessions


# ---------------------------------------------------------------- records


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
            save_run_sessions(run, sessions, dataset)
        else:
            save_run_sessions(run, sessions)
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
    section = (
        RunDir(out).read_manifest().get("stages", {}).get("import", {}) if (out / "manifest.json").is_file() else {}
    )
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
