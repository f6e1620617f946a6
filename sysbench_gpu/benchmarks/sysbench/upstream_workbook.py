"""Reading one of upstream's published result workbooks: sheet ``详情``, one typed row per (session, turn).

Every cell is checked as it is read (ints, booleans, alignment, the required columns), so a
malformed workbook is one line naming the file, the Excel row and the column. The import
itself is ``upstream_records`` (sessions, records, anomalies) and ``upstream`` (the run directory).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.sysbench.data import ALIGNMENTS
from sysbench_gpu.core.errors import SysbenchError, where
from sysbench_gpu.core.sessions import file_sha256

SHEET = "详情"
REQUIRED_COLUMNS: tuple[str, ...] = (
    "system_id",
    "领域",
    "场景",
    "multi_rounds_related",
    "alignment",
    "round_index",
    "system_prompt",
    "prompt",
    "referrence",
    "answer",
    "infer_model",
    "评判细则",
    "评判理由",
    "评判结果",
    "是否可用",
)


@dataclass(frozen=True)
class WorkbookRow:
    """One row of sheet 详情, with cells coerced to Python types."""

    excel_row: int  # 1-based row number in the sheet (header is row 1)
    system_id: int
    domain: str | None
    scene: str | None
    dependent: bool
    alignment: str  # aligned | misaligned
    round_index: int
    system_prompt: str
    prompt: str
    shifted_reference: str | None  # the `referrence` cell, as is (shifted, see upstream's module doc)
    answer: str | None
    infer_model: str
    checklist: str
    reasoning: str | None
    verdicts: str | None
    usable: int | None  # 是否可用: 1 when no verdict is 否


@dataclass(frozen=True)
class Workbook:
    path: Path
    sha256: str
    sheet: str
    rows: tuple[WorkbookRow, ...]


def read_workbook(path: str | Path) -> Workbook:
    """Read sheet 详情 of an upstream analysis workbook; any other shape is one clear error."""
    path = Path(path)
    if not path.is_file():
        raise SysbenchError(f"{path}: no such workbook")
    try:
        import openpyxl  # lazy: only this command needs it
    except ImportError:
        raise SysbenchError("import-upstream needs openpyxl (pip install openpyxl)") from None
    try:
        book = openpyxl.load_workbook(path, read_only=True, data_only=True)
    except Exception as error:  # openpyxl raises zipfile, KeyError, InvalidFileException... for non-xlsx
        raise SysbenchError(f"{path}: not an .xlsx workbook ({type(error).__name__}: {error})") from None
    try:
        if SHEET not in book.sheetnames:
            raise SysbenchError(
                f"{path}: no sheet {SHEET!r} (sheets: {', '.join(book.sheetnames) or 'none'}); "
                "expected an upstream <model>_analysis.xlsx"
            )
        raw_rows = book[SHEET].iter_rows(values_only=True)
        header = next(raw_rows, None)
        if header is None:
            raise SysbenchError(f"{path}: sheet {SHEET!r} is empty")
        names = [str(cell).strip() if cell is not None else "" for cell in header]
        missing = [column for column in REQUIRED_COLUMNS if column not in names]
        if missing:
            raise SysbenchError(f"{path}: sheet {SHEET!r} lacks column(s) {', '.join(missing)}")
        position = {name: names.index(name) for name in REQUIRED_COLUMNS}
        rows = []
        for excel_row, cells in enumerate(raw_rows, start=2):
            if cells is None or all(cell is None for cell in cells):
                continue  # trailing blank rows of a hand-edited sheet
            cells = tuple(cells) + (None,) * max(0, len(names) - len(cells))
            rows.append(_coerce_row(path, excel_row, {name: cells[index] for name, index in position.items()}))
    finally:
        book.close()
    if not rows:
        raise SysbenchError(f"{path}: sheet {SHEET!r} has no data rows")
    return Workbook(path=path, sha256=file_sha256(path), sheet=SHEET, rows=tuple(rows))


def _coerce_row(path: Path, excel_row: int, cells: dict[str, Any]) -> WorkbookRow:
    def loc(column: str) -> str:
        return f"{path}: row {excel_row}, column {column!r}"

    system_id = _as_int(cells["system_id"], loc("system_id"))
    round_index = _as_int(cells["round_index"], loc("round_index"))
    if round_index < 1:
        raise SysbenchError(f"{loc('round_index')}: {round_index} is not a turn number (1-based)")
    at = f"{path}: row {excel_row}, {where(None, system_id, round_index)}"

    def text(column: str, required: bool) -> str | None:
        value = cells[column]
        blank = value is None or (isinstance(value, str) and not value.strip())
        if blank and required:
            raise SysbenchError(f"{at}, column {column!r}: empty cell")
        if value is None:
            return None
        return value if isinstance(value, str) else str(value)

    alignment_raw = text("alignment", True).strip()
    if alignment_raw not in ALIGNMENTS:
        raise SysbenchError(f"{at}, column 'alignment': {alignment_raw!r} is not align or misalign")
    usable = cells["是否可用"]
    return WorkbookRow(
        excel_row=excel_row,
        system_id=system_id,
        domain=text("领域", False),
        scene=text("场景", False),
        dependent=_as_bool(cells["multi_rounds_related"], f"{at}, column 'multi_rounds_related'"),
        alignment=ALIGNMENTS[alignment_raw],
        round_index=round_index,
        system_prompt=text("system_prompt", True),
        prompt=text("prompt", True),
        shifted_reference=text("referrence", False),
        answer=text("answer", False),
        infer_model=text("infer_model", True).strip(),
        checklist=text("评判细则", True),
        reasoning=text("评判理由", False),
        verdicts=text("评判结果", False),
        usable=None if usable is None else _as_int(usable, f"{at}, column '是否可用'"),
    )


def _as_int(value: Any, loc: str) -> int:
    if isinstance(value, bool):
        raise SysbenchError(f"{loc}: {value!r} is not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    raise SysbenchError(f"{loc}: {value!r} is not an integer")


def _as_bool(value: Any, loc: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    raise SysbenchError(f"{loc}: {value!r} is not true/false")
