"""The report's numeric tables: what goes in them (the paper's layouts) and how they render (Markdown, LaTeX)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from sysbench_gpu import __version__
from sysbench_gpu.data import ALIGNMENT_ORDER, GROUP_ORDER, TYPE_ORDER
from sysbench_gpu.errors import SysbenchError
from sysbench_gpu.report_runs import N_TURNS, GtPair, RunSummary, _diff_points, _num, as_sequence

SORT_KEYS = ("given", "csr", "isr", "ssr")


# ---------------------------------------------------------------- tables


@dataclass
class Table:
    """A numeric table: rows of runs, columns optionally grouped under a spanning header."""

    name: str  # file stem, e.g. "table2_overall"
    title: str
    caption: str  # plain text; escaped for LaTeX unless ``latex_caption`` is given
    groups: list[tuple[str, list[str]]]  # (spanning header or "", column headers)
    rows: list[tuple[str, list[float | None]]]  # values already in the unit shown (percent / points)
    notes: list[list[str]] = field(default_factory=list)  # per row, per column: Markdown-only suffix
    bold_best: bool = True
    signed: bool = False  # show a + on positive values (gains)
    first_header: str = "Model"
    latex_caption: str | None = None
    markdown_headers: list[str] | None = None  # flat headers for Markdown, when "group column" reads badly
    decimals: int = 1  # percent tables: one; MT-Eval's 0-10 scores: two

    @property
    def columns(self) -> list[str]:
        return [column for _, columns in self.groups for column in columns]

    def best(self) -> list[str | None]:
        """Per column, the best (largest) value as displayed, or None."""
        best: list[str | None] = []
        for index in range(len(self.columns)):
            values = [row[1][index] for row in self.rows if row[1][index] is not None]
            best.append(self.fmt(max(values)) if values and self.bold_best else None)
        return best

    def fmt(self, value: float | None) -> str:
        if value is None:
            return ""
        text = f"{value:+.{self.decimals}f}" if self.signed else f"{value:.{self.decimals}f}"
        if text.startswith("-") and not text.strip("-0."):  # a negative zero after rounding
            text = ("+" if self.signed else "") + text[1:]
        return text


def pct(value: Any) -> float | None:
    number = _num(value)
    return None if number is None else 100.0 * number


def table_overall(runs: Sequence[RunSummary]) -> Table:
    rows, notes = [], []
    for run in runs:
        m = run.metrics
        rows.append((run.label, [pct(m.get("csr")), pct(m.get("isr")), pct(m.get("ssr"))]))
        ci = m.get("ci95") or {}
        row_notes = []
        for key in ("csr", "isr", "ssr"):
            bounds = ci.get(key)
            if bounds and len(bounds) == 2 and None not in bounds:
                row_notes.append(f" [{100 * bounds[0]:.1f}, {100 * bounds[1]:.1f}]")
            else:
                row_notes.append("")
        notes.append(row_notes)
    return Table(
        name="table2_overall",
        title="Overall: constraint, instruction and session satisfaction rates",
        caption="CSR, ISR and SSR (%) per model; best per column in bold.",
        groups=[("", ["CSR", "ISR", "SSR"])],
        rows=rows,
        notes=notes,
    )


def table_alignment(runs: Sequence[RunSummary]) -> Table:
    rows = []
    for run in runs:
        by_group = run.metrics.get("isr_by_group") or {}
        overall = run.metrics.get("isr_by_alignment") or {}
        values = []
        for group in GROUP_ORDER:
            values += [pct((by_group.get(group) or {}).get(alignment)) for alignment in ALIGNMENT_ORDER]
        values += [pct(overall.get(alignment)) for alignment in ALIGNMENT_ORDER]
        rows.append((run.label, values))
    headers = [alignment.capitalize() for alignment in ALIGNMENT_ORDER]
    return Table(
        name="table3_alignment",
        title="ISR on aligned and misaligned instructions",
        caption="ISR (%) on aligned and misaligned user instructions within multi-turn dependent "
        "sessions, multi-turn parallel sessions and overall; best per column in bold.",
        groups=[("Dependent", headers), ("Parallel", headers), ("Overall", headers)],
        rows=rows,
    )


def table_rounds(runs: Sequence[RunSummary]) -> Table:
    rows = []
    for run in runs:
        rounds = run.metrics.get("rounds") or {}
        ssr_by_group = run.metrics.get("ssr_by_group") or {}
        values = []
        for group in GROUP_ORDER:
            values += [pct(v) for v in as_sequence(rounds.get(group))]
            values.append(pct(ssr_by_group.get(group)))
        rows.append((run.label, values))
    headers = [f"R{n}" for n in range(1, N_TURNS + 1)] + ["SSR"]
    return Table(
        name="table4_rounds",
        title="Session satisfaction by round",
        caption="Rn: share of sessions whose first n turns all pass (%), and SSR (the mean of R1..R5), "
        "within multi-turn dependent and parallel sessions; best per column in bold.",
        latex_caption="R$_n$: share of sessions whose first $n$ turns all pass (\\%), and SSR (the mean of "
        "R$_1$..R$_5$), within multi-turn dependent and parallel sessions; best per column in bold.",
        groups=[("Dependent", headers), ("Parallel", headers)],
        rows=rows,
    )


def table_csr_by_type(runs: Sequence[RunSummary]) -> Table:
    rows = []
    for run in runs:
        by_type = run.metrics.get("csr_by_type") or {}
        rows.append((run.label, [pct(by_type.get(kind)) for kind in TYPE_ORDER] + [pct(run.metrics.get("csr"))]))
    return Table(
        name="table6_csr_by_type",
        title="CSR by constraint type",
        caption="CSR (%) per constraint type and overall; best per column in bold.",
        groups=[("", [kind.capitalize() for kind in TYPE_ORDER] + ["Overall"])],
        rows=rows,
    )


def table_gt_gain(pairs: Sequence[GtPair]) -> Table:
    rows = []
    for pair in pairs:
        gains = pair.turn_gains
        overall = [
            _diff_points(pair.gt.metrics.get("isr"), pair.base.metrics.get("isr")),
            _diff_points(pair.gt.metrics.get("ssr"), pair.base.metrics.get("ssr")),
        ]
        rows.append((pair.label, gains + overall))
    return Table(
        name="table_gt_history_gain",
        title="Gain from ground-truth history",
        caption="ISR per turn, ISR and SSR with ground-truth history minus with the model's own "
        "history, in percentage points. Turn 1 has no history, so its gain should be about zero.",
        groups=[("ISR gain per turn", [f"T{n}" for n in range(1, N_TURNS + 1)]), ("Overall gain", ["ISR", "SSR"])],
        rows=rows,
        bold_best=False,
        signed=True,
        markdown_headers=[f"T{n}" for n in range(1, N_TURNS + 1)] + ["ISR", "SSR"],
    )


def build_tables(runs: Sequence[RunSummary], pairs: Sequence[GtPair] = ()) -> list[Table]:
    tables = [table_overall(runs), table_alignment(runs), table_rounds(runs), table_csr_by_type(runs)]
    if pairs:
        tables.append(table_gt_gain(pairs))
    return tables


def sort_runs(runs: Sequence[RunSummary], key: str) -> list[RunSummary]:
    """Runs as given, or by a headline metric, best first (stable for ties)."""
    if key == "given":
        return list(runs)
    if key not in SORT_KEYS:
        raise SysbenchError(f"--sort: unknown key {key!r} (choose from {', '.join(SORT_KEYS)})")
    return sorted(runs, key=lambda run: -(_num(run.metrics.get(key)) or 0.0))


# ---------------------------------------------------------------- rendering


def escape_markdown(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*")


_LATEX_SPECIALS = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def escape_latex(text: str) -> str:
    """Plain text made safe for LaTeX (labels, file names): every special character escaped."""
    return "".join(_LATEX_SPECIALS.get(char, char) for char in text)


def render_markdown(table: Table) -> str:
    best = table.best()
    has_groups = any(group for group, _ in table.groups)
    headers = [table.first_header]
    if table.markdown_headers:
        headers += table.markdown_headers
    else:
        for group, columns in table.groups:
            headers += [f"{group} {column}" if has_groups and group else column for column in columns]
    lines = [
        "| " + " | ".join(escape_markdown(h) for h in headers) + " |",
        "| :--- | " + " | ".join("---:" for _ in headers[1:]) + " |",
    ]
    for index, (label, values) in enumerate(table.rows):
        cells = [escape_markdown(label)]
        for column, value in enumerate(values):
            text = table.fmt(value)
            if value is None:
                text = "–"
            elif best[column] is not None and text == best[column]:
                text = f"**{text}**"
            if table.notes and table.notes[index][column]:
                text += table.notes[index][column]
            cells.append(text)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_latex(table: Table) -> str:
    """A booktabs ``table`` environment; ``\\input`` it into a document that loads booktabs."""
    best = table.best()
    n_columns = len(table.columns)
    lines = [
        f"% {table.title}: generated by sysbench-gpu {__version__}. Needs \\usepackage{{booktabs}}.",
        "\\begin{table}[htbp]",
        "\\centering",
    ]
    if n_columns > 8:
        lines += ["\\small", "\\setlength{\\tabcolsep}{4pt}"]
    lines += [
        f"\\caption{{{table.latex_caption or escape_latex(table.caption)}}}",
        f"\\label{{tab:{table.name.replace('_', '-')}}}",
        "\\begin{tabular}{l" + "r" * n_columns + "}",
        "\\toprule",
    ]
    if any(group for group, _ in table.groups):
        spans, rules, start = [""], [], 2
        for group, columns in table.groups:
            width = len(columns)
            header = escape_latex(group)
            spans.append(f"\\multicolumn{{{width}}}{{c}}{{{header}}}" if width > 1 else header)
            if group:
                rules.append(f"\\cmidrule(lr){{{start}-{start + width - 1}}}")
            start += width
        lines.append(" & ".join(spans) + " \\\\")
        lines.append("".join(rules))
    lines.append(" & ".join([table.first_header] + [escape_latex(c) for c in table.columns]) + " \\\\")
    lines.append("\\midrule")
    for label, values in table.rows:
        cells = [escape_latex(label)]
        for column, value in enumerate(values):
            text = table.fmt(value)
            if value is None:
                text = "--"
            elif text.startswith("-"):
                text = "$-$" + text[1:]  # a minus sign, not a hyphen
            if value is not None and best[column] is not None and table.fmt(value) == best[column]:
                text = f"\\textbf{{{text}}}"
            cells.append(text)
        lines.append(" & ".join(cells) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
    return "\n".join(lines) + "\n"


