"""Side-by-side reports of judged runs: the paper's tables (Markdown and LaTeX) and figures.

``sysbench-gpu report RUN_DIR [RUN_DIR ...] --out DIR`` computes every run's metrics
with :func:`sysbench_gpu.metrics.run_metrics` and writes

- ``table2_overall``: CSR, ISR, SSR per run (95% CI in the Markdown version);
- ``table3_alignment``: ISR on aligned / misaligned turns within dependent sessions,
  parallel sessions and overall (the paper's Table 3/7 layout);
- ``table4_rounds``: R1..R5 and SSR within dependent and parallel sessions;
- ``table6_csr_by_type``: CSR per constraint type and overall;
- ``table_gt_history_gain`` (with ``--gt-pair``): per-turn ISR gain of ground-truth
  history over the model's own history;

each as ``.md`` and ``.tex`` (booktabs), figures (see :mod:`sysbench_gpu.figures`),
``report.md`` stitching it all together and ``report.json`` with every metrics dict
and how it was made. Percentages carry one decimal; the best value of a column is
bold. Nothing here imports torch; matplotlib is imported only when figures are drawn.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from sysbench_gpu import __version__
from sysbench_gpu.data import ALIGNMENT_ORDER, GROUP_ORDER, TYPE_ORDER, Session, load_dataset
from sysbench_gpu.errors import SysbenchError
from sysbench_gpu.runstore import RunDir, utc_now, write_json_atomic

N_TURNS = 5  # SysBench sessions have five user turns
SORT_KEYS = ("given", "csr", "isr", "ssr")
FIGURE_FORMATS = ("png", "pdf", "svg")

MetricsFn = Callable[..., dict]


# ---------------------------------------------------------------- runs and their metrics


@dataclass(frozen=True)
class RunSummary:
    """One judged run as the report sees it."""

    path: Path
    label: str
    model: str | None
    dataset_sha256: str | None  # checksum of the data file the run was made from, per its manifest
    metrics: dict[str, Any]
    manifest: dict[str, Any]
    checklist_sha256: str | None = None  # what is scored: sessions, turns, alignments, checklists

    @property
    def data_file_sha256(self) -> str | None:
        """The dataset checksum when it is one of a data file (an import without --data records the workbook's)."""
        dataset = self.manifest.get("dataset")
        if isinstance(dataset, dict) and dataset.get("rebuilt_from"):
            return None
        return self.dataset_sha256


@dataclass(frozen=True)
class GtPair:
    """A run generated with ground-truth history next to the same model's normal run."""

    label: str
    gt: RunSummary
    base: RunSummary

    @property
    def turn_gains(self) -> list[float | None]:
        """ISR gain per turn in percentage points (GT minus base), turns 1..5."""
        return isr_gain_by_turn(self.gt.metrics, self.base.metrics)

    @property
    def turn1_noise_band(self) -> float | None:
        """Half-width (points) of a 95% band for the turn-1 gain from sampling and judging alone.

        Turn 1 sees no history, so both runs answer the same prompt: the two turn-1 ISRs
        differ only by chance. Treated as two independent proportions over the sessions.
        """
        p_gt = _num(as_sequence(self.gt.metrics.get("isr_by_round"))[0])
        p_base = _num(as_sequence(self.base.metrics.get("isr_by_round"))[0])
        n_gt, n_base = _num(self.gt.metrics.get("n_sessions")), _num(self.base.metrics.get("n_sessions"))
        if None in (p_gt, p_base) or not n_gt or not n_base:
            return None
        variance = p_gt * (1 - p_gt) / n_gt + p_base * (1 - p_base) / n_base
        return 100.0 * 1.96 * math.sqrt(variance)


def _default_metrics_fn() -> MetricsFn:
    from sysbench_gpu.metrics import run_metrics  # imported late: a sibling stage module

    return run_metrics


def require_judged(path: Path) -> RunDir:
    """The run directory at ``path``; a clear error when it is not one or has no judgments."""
    run = RunDir(path)
    run.require()
    if not run.judgments.path.is_file() or run.judgments.path.stat().st_size == 0:
        raise SysbenchError(
            f"{path}: run is not judged (no {run.judgments.path.name}); run `sysbench-gpu judge` "
            "or `sysbench-gpu import-upstream` first"
        )
    return run


def load_run(
    path: str | Path,
    label: str | None = None,
    metrics_fn: MetricsFn | None = None,
    **metric_options: Any,
) -> RunSummary:
    """Compute a run's metrics and collect what the report says about how they were made."""
    path = Path(path)
    run = require_judged(path)
    manifest = run.read_manifest()
    metrics = (metrics_fn or _default_metrics_fn())(path, **metric_options)
    model = metrics.get("model") or manifest.get("model") or _find_in_stages(manifest, "model")
    label = label or metrics.get("label") or manifest.get("label") or path.name
    dataset = manifest.get("dataset") if isinstance(manifest.get("dataset"), dict) else {}
    return RunSummary(
        path=path,
        label=str(label),
        model=str(model) if model is not None else None,
        dataset_sha256=dataset.get("sha256"),
        metrics=metrics,
        manifest=manifest,
        checklist_sha256=checklist_fingerprint(run.load_sessions()) if run.sessions_path.is_file() else None,
    )


def checklist_fingerprint(sessions: Sequence[Session]) -> str:
    """sha256 over everything scoring depends on, so runs made from differently-sourced copies
    of the same data (an official file, a workbook import) still compare equal."""
    digest = hashlib.sha256()
    for session in sorted(sessions, key=lambda s: s.system_id):
        item = [
            session.system_id,
            session.dependent,
            [[t.index, t.alignment, [[c.id, c.type, c.content] for c in t.constraints]] for t in session.turns],
        ]
        digest.update(json.dumps(item, ensure_ascii=False).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def _find_in_stages(manifest: Mapping[str, Any], key: str) -> Any:
    for section in (manifest.get("stages") or {}).values():
        if isinstance(section, dict) and section.get(key):
            return section[key]
    return None


def dataset_warnings(runs: Sequence[RunSummary]) -> list[str]:
    """Warnings when runs were made over different data (the numbers are then not comparable)."""
    unique: dict[Path, RunSummary] = {}
    for run in runs:
        unique.setdefault(run.path.resolve(), run)
    runs = list(unique.values())
    warnings: list[str] = []
    missing = [run.label for run in runs if not run.dataset_sha256]
    if missing:
        warnings.append(f"no dataset checksum recorded in the manifest of: {', '.join(missing)}")
    by_sha: dict[str, list[str]] = {}
    for run in runs:
        if run.data_file_sha256:
            by_sha.setdefault(run.data_file_sha256, []).append(run.label)
    if len(by_sha) > 1:
        groups = "; ".join(f"{sha[:12]}: {', '.join(labels)}" for sha, labels in by_sha.items())
        warnings.append(f"runs were made from {len(by_sha)} different dataset files ({groups}); compare with care")
    by_checklist: dict[str, list[str]] = {}
    for run in runs:
        if run.checklist_sha256:
            named = f"{run.label} ({run.metrics.get('n_sessions')} sessions)"
            by_checklist.setdefault(run.checklist_sha256, []).append(named)
    if len(by_checklist) > 1:
        groups = "; ".join(f"{sha[:12]}: {', '.join(labels)}" for sha, labels in by_checklist.items())
        warnings.append(
            f"runs score {len(by_checklist)} different sets of sessions or checklists ({groups}); "
            "their numbers are not comparable"
        )
    partial = [run.label for run in runs if run.metrics.get("partial")]
    if partial:
        warnings.append(f"partial runs (turns not generated or not judged, or a stage still running): {', '.join(partial)}")
    return warnings


def unique_labels(labels: Sequence[str]) -> list[str]:
    """Labels made unique by numbering repeats: ``a, a`` -> ``a, a (2)``."""
    seen: dict[str, int] = {}
    result = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        result.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return result


# ---------------------------------------------------------------- metric access


def as_sequence(value: Any, n: int = N_TURNS) -> list[float | None]:
    """A per-turn/per-round metric as a list of ``n`` values, whether stored as a list or a dict."""
    if value is None:
        return [None] * n
    if isinstance(value, Mapping):
        out: list[float | None] = []
        for index in range(1, n + 1):
            found = None
            for key in (f"t{index}", f"R{index}", f"r{index}", str(index), index):
                if key in value:
                    found = value[key]
                    break
            out.append(found)
        return out
    values = list(value)
    return [values[i] if i < len(values) else None for i in range(n)]


def _num(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def isr_gain_by_turn(gt_metrics: Mapping[str, Any], base_metrics: Mapping[str, Any]) -> list[float | None]:
    """Per-turn ISR of the GT-history run minus that of the base run, in percentage points."""
    gt = as_sequence(gt_metrics.get("isr_by_round"))
    base = as_sequence(base_metrics.get("isr_by_round"))
    gains: list[float | None] = []
    for g, b in zip(gt, base):
        g, b = _num(g), _num(b)
        gains.append(None if g is None or b is None else 100.0 * (g - b))
    return gains


def _diff_points(a: Any, b: Any) -> float | None:
    a, b = _num(a), _num(b)
    return None if a is None or b is None else 100.0 * (a - b)


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
        text = f"{value:+.1f}" if self.signed else f"{value:.1f}"
        return "+0.0" if text == "-0.0" and self.signed else ("0.0" if text == "-0.0" else text)


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


# ---------------------------------------------------------------- the report


@dataclass
class ReportResult:
    out_dir: Path
    tables: list[Path]
    figures: list[Path]
    warnings: list[str]


def parse_gt_pair(text: str) -> tuple[Path, Path]:
    gt, sep, base = text.partition("=")
    if not sep or not gt or not base:
        raise SysbenchError(f"--gt-pair {text!r}: expected GT_RUN=BASE_RUN")
    return Path(gt), Path(base)


def parse_formats(text: str) -> list[str]:
    formats = [item.strip().lower().lstrip(".") for item in text.split(",") if item.strip()]
    unknown = [item for item in formats if item not in FIGURE_FORMATS]
    if not formats:
        raise SysbenchError(f"--formats: no format given (choose from {', '.join(FIGURE_FORMATS)})")
    if unknown:
        raise SysbenchError(f"--formats: unknown format {', '.join(unknown)} (choose from {', '.join(FIGURE_FORMATS)})")
    return formats


def write_report(
    runs: Sequence[RunSummary],
    out_dir: str | Path,
    pairs: Sequence[GtPair] = (),
    sessions: Sequence[Session] | None = None,
    sessions_source: str | None = None,
    formats: Sequence[str] = ("png", "pdf"),
    figures: bool = True,
    options: Mapping[str, Any] | None = None,
    arguments: Mapping[str, Any] | None = None,
    device_spec: str | None = None,
) -> ReportResult:
    """Write tables, figures, ``report.md`` and ``report.json`` for ``runs`` (in display order).

    ``options`` are the metric options the runs were scored with; ``arguments`` the
    command-line arguments, both recorded in ``report.json``.
    """
    if not runs:
        raise SysbenchError("report: no runs given")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    warnings = dataset_warnings(list(runs) + [r for pair in pairs for r in (pair.gt, pair.base)])
    for pair in pairs:
        if pair.gt.checklist_sha256 != pair.base.checklist_sha256:
            warnings.append(f"gt pair {pair.label}: the two runs score different sessions or checklists")
        if pair.gt.model and pair.base.model and pair.gt.model != pair.base.model:
            warnings.append(
                f"gt pair {pair.label}: the runs name different models ({pair.gt.model} with ground-truth history, "
                f"{pair.base.model} without); the gain mixes history and model"
            )
        gain, band = pair.turn_gains[0], pair.turn1_noise_band
        if gain is not None and band is not None and abs(gain) > band:
            warnings.append(
                f"gt pair {pair.label}: turn-1 ISR gain is {gain:+.1f} points, beyond the ±{band:.1f}-point noise "
                "band, although turn 1 has the same (empty) history in both runs; are they the same model and judge?"
            )

    tables = build_tables(runs, pairs)
    table_paths: list[Path] = []
    for table in tables:
        for suffix, text in (("md", render_markdown(table)), ("tex", render_latex(table))):
            path = out_dir / f"{table.name}.{suffix}"
            path.write_text(text, encoding="utf-8")
            table_paths.append(path)

    figure_paths: dict[str, list[Path]] = {}
    if figures:
        from sysbench_gpu import figures as figs  # matplotlib is imported inside

        if sessions:
            drawn = figs.plot_dataset_distribution(sessions, out_dir / "fig_dataset_distribution", formats)
            figure_paths["fig_dataset_distribution"] = drawn.paths
            warnings += drawn.warnings
        drawn = figs.plot_radar_csr_by_type(
            [run.label for run in runs],
            [[pct((run.metrics.get("csr_by_type") or {}).get(kind)) for kind in TYPE_ORDER] for run in runs],
            [kind.capitalize() for kind in TYPE_ORDER],
            out_dir / "fig_radar_csr_by_type",
            formats,
        )
        figure_paths["fig_radar_csr_by_type"] = drawn.paths
        warnings += drawn.warnings
        if pairs:
            drawn = figs.plot_gt_history_gain(
                [pair.label for pair in pairs],
                [pair.turn_gains for pair in pairs],
                out_dir / "fig_gt_history_gain",
                formats,
            )
            figure_paths["fig_gt_history_gain"] = drawn.paths
            warnings += drawn.warnings

    from sysbench_gpu.profile import report_section  # runs with stats.json get a throughput profile

    profile_lines, profile_entries = report_section([run.path for run in runs], device_spec)
    created = utc_now()
    report_md = _report_markdown(runs, pairs, tables, figure_paths, warnings, created, sessions_source)
    from sysbench_gpu.explore import explorer_link  # an explorer site in a folder `explore` beside the report's

    explorer = explorer_link(out_dir)
    if explorer:
        report_md = report_md.replace("\n## Runs\n", f"\nExplorer: [{explorer}]({explorer})\n\n## Runs\n", 1)
    if profile_lines:
        report_md += "\n" + "\n".join(profile_lines) + "\n"
    (out_dir / "report.md").write_text(report_md, encoding="utf-8")
    report_json = _report_json(
        runs, pairs, table_paths, figure_paths, warnings, created, sessions_source, options or {}, arguments or {}
    )
    write_json_atomic(out_dir / "report.json", {**report_json, "profile": profile_entries, "explorer": explorer})
    return ReportResult(
        out_dir=out_dir,
        tables=table_paths,
        figures=[p for paths in figure_paths.values() for p in paths],
        warnings=warnings,
    )


def _turn1_check(pairs: Sequence[GtPair]) -> str:
    """One sentence on the turn-1 sanity check of the ground-truth-history pairs."""
    parts, outside = [], []
    for pair in pairs:
        gain, band = pair.turn_gains[0], pair.turn1_noise_band
        if gain is None or band is None:
            continue
        parts.append(f"{escape_markdown(pair.label)} {gain:+.1f} (±{band:.1f})")
        if abs(gain) > band:
            outside.append(escape_markdown(pair.label))
    if not parts:
        return "Turn-1 check: not available."
    verdict = (
        "All within their 95% noise band, as expected: turn 1 has the same (empty) history in both runs."
        if not outside
        else f"Outside the noise band: {', '.join(outside)} (see the warnings)."
    )
    return "Turn-1 check, gain (noise band) in points: " + "; ".join(parts) + f". {verdict}"


_FIGURE_CAPTIONS = {
    "fig_dataset_distribution": "Dataset: sessions per domain and constraints per type",
    "fig_radar_csr_by_type": "CSR per constraint type",
    "fig_gt_history_gain": "ISR gain per turn from ground-truth history (turn 1 should be about zero)",
}


def _report_markdown(
    runs: Sequence[RunSummary],
    pairs: Sequence[GtPair],
    tables: Sequence[Table],
    figure_paths: Mapping[str, list[Path]],
    warnings: Sequence[str],
    created: str,
    sessions_source: str | None,
) -> str:
    out = [
        "# SysBench report",
        "",
        f"Made by sysbench-gpu {__version__} on {created}. Percentages with one decimal; the best value "
        "of each column is bold. CSR is pooled over constraints; a turn passes when none of its verdicts "
        "is *no*; R*n* is the share of sessions whose first *n* turns pass and SSR their mean.",
        "",
        "## Runs",
        "",
        "Other verdicts are neither yes nor no (e.g. 不适用): no CSR credit, but they do not fail a turn. "
        "Checklists: fingerprint of the scored sessions, turns and checklists (equal means comparable).",
        "",
        "| Label | Model | Run directory | Sessions | Turns | Constraints | Other verdicts | Unparsed turns "
        "| Missing turns | Dataset sha256 | Checklists |",
        "| :--- | :--- | :--- | ---: | ---: | ---: | ---: | ---: | ---: | :--- | :--- |",
    ]
    for run in runs:
        m = run.metrics
        counts = [m.get(key, "?") for key in ("n_sessions", "n_turns", "n_constraints", "n_other_verdicts",
                                              "n_unparsed_turns", "n_missing_turns")]
        out.append(
            f"| {escape_markdown(run.label)} | {escape_markdown(run.model or '?')} | `{run.path}` | "
            + " | ".join(str(c) for c in counts)
            + f" | `{(run.dataset_sha256 or 'unknown')[:12]}` | `{(run.checklist_sha256 or 'unknown')[:12]}` |"
        )
    if pairs:
        out += ["", "Ground-truth history pairs:", ""]
        out += [f"- {escape_markdown(p.label)}: `{p.gt.path}` against `{p.base.path}`" for p in pairs]
    if warnings:
        out += ["", "## Warnings", ""] + [f"- {escape_markdown(w)}" for w in warnings]
    for table in tables:
        out += ["", f"## {table.title}", "", escape_markdown(table.caption), ""]
        if table.name == "table2_overall":
            out += ["Brackets: 95% bootstrap confidence interval over sessions.", ""]
        out.append(render_markdown(table).rstrip("\n"))
        if table.name == "table_gt_history_gain":
            out += ["", _turn1_check(pairs)]
        out += ["", f"LaTeX: [{table.name}.tex]({table.name}.tex)"]
    if figure_paths:
        out += ["", "## Figures"]
        for name, paths in figure_paths.items():
            raster = next((p for p in paths if p.suffix in (".png", ".svg")), None)
            caption = _FIGURE_CAPTIONS.get(name, name)
            if name == "fig_dataset_distribution" and sessions_source:
                caption += f" (from {sessions_source})"
            out += ["", f"### {caption}", ""]
            if raster is not None:
                out.append(f"![{caption}]({raster.name})")
                out.append("")
            out.append("Files: " + ", ".join(f"[{p.name}]({p.name})" for p in paths))
    return "\n".join(out) + "\n"


def _report_json(
    runs: Sequence[RunSummary],
    pairs: Sequence[GtPair],
    table_paths: Sequence[Path],
    figure_paths: Mapping[str, list[Path]],
    warnings: Sequence[str],
    created: str,
    sessions_source: str | None,
    options: Mapping[str, Any],
    arguments: Mapping[str, Any],
) -> dict[str, Any]:
    def describe(run: RunSummary) -> dict[str, Any]:
        manifest = run.manifest
        return {
            "label": run.label,
            "path": str(run.path.resolve()),
            "model": run.model,
            "manifest": {
                "label": manifest.get("label"),
                "model": run.model,
                "dataset": manifest.get("dataset"),
                "stages": sorted((manifest.get("stages") or {}).keys()),
                "created": manifest.get("created"),
                "updated": manifest.get("updated"),
            },
            "dataset_sha256": run.dataset_sha256,
            "checklist_sha256": run.checklist_sha256,
            "metrics": run.metrics,
        }

    return {
        "tool": "sysbench-gpu",
        "version": __version__,
        "created": created,
        "arguments": dict(arguments),
        "metric_options": dict(options),
        "percent_format": "one decimal; fractions in metrics are in [0, 1]",
        "dataset_for_figures": sessions_source,
        "runs": [describe(run) for run in runs],
        "gt_pairs": [
            {
                "label": pair.label,
                "gt": describe(pair.gt),
                "base": describe(pair.base),
                "isr_gain_by_turn_points": pair.turn_gains,
                "turn1_noise_band_points": pair.turn1_noise_band,
                "isr_gain_points": _diff_points(pair.gt.metrics.get("isr"), pair.base.metrics.get("isr")),
                "ssr_gain_points": _diff_points(pair.gt.metrics.get("ssr"), pair.base.metrics.get("ssr")),
            }
            for pair in pairs
        ],
        "tables": [path.name for path in table_paths],
        "figures": {name: [p.name for p in paths] for name, paths in figure_paths.items()},
        "warnings": list(warnings),
    }


# ---------------------------------------------------------------- CLI


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="Markdown/LaTeX tables and figures for runs",
        description="Tables (Markdown + LaTeX) and figures comparing judged runs side by side, as in the paper.",
    )
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="judged run directories, in display order")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--gt-pair",
        action="append",
        default=[],
        metavar="GT_RUN=BASE_RUN",
        help="a run generated with ground-truth history and the same model's normal run (repeatable)",
    )
    parser.add_argument("--labels", help="comma-separated labels, one per RUN_DIR (default: the runs' labels)")
    parser.add_argument("--data", help="data file for the dataset figure (default: the first run's sessions.json)")
    parser.add_argument("--formats", default="png,pdf", help="figure formats, comma-separated (png, pdf, svg)")
    parser.add_argument(
        "--sort", default="given", choices=SORT_KEYS, help="row order: as given, or by a metric with the best first"
    )
    parser.add_argument("--no-figures", action="store_true", help="tables only")
    parser.add_argument("--allow-partial", action="store_true", help="score runs with missing turns")
    parser.add_argument(
        "--exclude-unparsed", action="store_true", help="leave out turns whose judge reply never parsed"
    )
    parser.add_argument(
        "--exclude-skipped", action="store_true", help="leave out turns skipped at generation (no reply)"
    )
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples for the 95%% CIs")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    parser.add_argument("--device-spec", help="device for the throughput profile of runs with stats.json "
                        "(h100, h200, a100, cpu or a JSON file; default: cpu for CPU runs, else none)")
    parser.set_defaults(func=_cmd_report)


def _cmd_report(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    labels: list[str | None] = [None] * len(args.runs)
    if args.labels:
        given = [label.strip() for label in args.labels.split(",")]
        if len(given) != len(args.runs):
            raise SysbenchError(f"--labels: {len(given)} labels for {len(args.runs)} run directories")
        labels = list(given)
    formats = parse_formats(args.formats)
    pair_paths = [parse_gt_pair(text) for text in args.gt_pair]
    options = {
        "allow_partial": args.allow_partial,
        "exclude_unparsed": args.exclude_unparsed,
        "exclude_skipped": args.exclude_skipped,
        "resamples": args.resamples,
        "seed": args.seed,
    }
    # Every distinct directory is scored once, even when it is both a run and half of a pair.
    wanted = [Path(p) for p in args.runs] + [p for pair in pair_paths for p in pair]
    cache: dict[Path, RunSummary] = {}
    for path in tqdm(wanted, desc="metrics", unit="run", file=sys.stderr, disable=None):
        key = path.resolve()
        if key not in cache:
            cache[key] = load_run(path, **options)
    runs = []
    for path, label in zip(args.runs, labels):
        summary = cache[Path(path).resolve()]
        runs.append(_relabel(summary, label) if label else summary)
    runs = [_relabel(run, label) for run, label in zip(runs, unique_labels([r.label for r in runs]))]
    runs = sort_runs(runs, args.sort)
    # A pair is named after its base run, with the label that run got in the tables if it is one.
    shown = {run.path.resolve(): run.label for run in runs}
    pairs = [
        GtPair(
            label=shown.get(base.resolve(), cache[base.resolve()].label),
            gt=cache[gt.resolve()],
            base=cache[base.resolve()],
        )
        for gt, base in pair_paths
    ]
    pair_labels = unique_labels([pair.label for pair in pairs])
    pairs = [dataclasses.replace(pair, label=label) for pair, label in zip(pairs, pair_labels)]

    sessions = None
    source = None
    if not args.no_figures:
        if args.data:
            dataset = load_dataset(args.data)
            sessions, source = list(dataset.sessions), str(dataset.path)
        else:
            first = RunDir(args.runs[0])
            sessions, source = first.load_sessions(), str(first.sessions_path)
    result = write_report(
        runs, args.out, pairs, sessions=sessions, sessions_source=source, formats=formats,
        figures=not args.no_figures, options=options,
        arguments={key: value for key, value in vars(args).items() if key != "func"}, device_spec=args.device_spec,
    )
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(
        f"wrote {len(result.tables)} table files, {len(result.figures)} figure files, report.md and report.json "
        f"to {result.out_dir}"
    )
    return 0


def _relabel(run: RunSummary, label: str) -> RunSummary:
    return dataclasses.replace(run, label=label)

