"""Side-by-side reports of judged runs: the paper's tables (Markdown and LaTeX) and figures.

``sysbench-gpu report RUN_DIR [RUN_DIR ...] --out DIR`` computes every run's metrics
with :func:`sysbench_gpu.benchmarks.runs.run_metrics` and writes

- ``table2_overall``: CSR, ISR, SSR per run (95% CI in the Markdown version);
- ``table3_alignment``: ISR on aligned / misaligned turns within dependent sessions,
  parallel sessions and overall (the paper's Table 3/7 layout);
- ``table4_rounds``: R1..R5 and SSR within dependent and parallel sessions;
- ``table6_csr_by_type``: CSR per constraint type and overall;
- ``table_gt_history_gain`` (with ``--gt-pair``): per-turn ISR gain of ground-truth
  history over the model's own history;
- ``table_history_ablation`` (with single-turn or distractor runs, or one model's runs of
  several kinds): per-turn ISR of each kind (``report_ablations``);

each as ``.md`` and ``.tex`` (booktabs), figures (see :mod:`sysbench_gpu.benchmarks.sysbench.figures`),
``report.md`` stitching it all together and ``report.json`` with every metrics dict
and how it was made. Percentages carry one decimal; the best value of a column is
bold. MT-Eval runs get their own report (``benchmarks.mteval.report``: the leaderboard
layout). The work is split by job: ``report_runs`` (runs, pairs, checks), ``report_tables``
(the tables; their rendering is ``core.tables``), ``report_ablations``, and this module
(the SysBench report); the command line is ``reporting.report``. Nothing here imports
torch; matplotlib is imported only when figures are drawn.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from sysbench_gpu import __version__
from sysbench_gpu.benchmarks.base import ReportRequest, ReportResult
from sysbench_gpu.benchmarks.registry import load_dataset, load_run_sessions
from sysbench_gpu.benchmarks.sysbench import figures as figs  # matplotlib is imported inside its functions
from sysbench_gpu.benchmarks.sysbench.data import TYPE_ORDER
from sysbench_gpu.benchmarks.sysbench.report_ablations import (
    ablation_groups,
    ablation_panels,
    gains_by_group,
    run_kind,
    table_history_ablation,
)
from sysbench_gpu.benchmarks.sysbench.report_runs import GtPair, RunSummary, _diff_points, dataset_warnings, load_run
from sysbench_gpu.benchmarks.sysbench.report_tables import (  # noqa: F401
    SORT_KEYS,
    build_tables,
    sort_runs,
    table_alignment,
    table_csr_by_type,
    table_gt_gain,
    table_overall,
    table_rounds,
)
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.rundir import RunDir, utc_now, write_json_atomic
from sysbench_gpu.core.sessions import Session
from sysbench_gpu.core.tables import (  # noqa: F401
    Table,
    _num,
    escape_latex,
    escape_markdown,
    pct,
    render_latex,
    render_markdown,
    unique_labels,
)

# ---------------------------------------------------------------- the report


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
    profile_lines: Sequence[str] = (),
    profile_entries: Sequence[Mapping[str, Any]] = (),
    explorer: str | None = None,
) -> ReportResult:
    """Write tables, figures, ``report.md`` and ``report.json`` for ``runs`` (in display order).

    ``options`` are the metric options the runs were scored with; ``arguments`` the
    command-line arguments, both recorded in ``report.json``. ``profile_lines`` and
    ``profile_entries`` (the throughput profile) and ``explorer`` (a site beside the
    report) come from the reporting stage, which computes them.
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

    groups, ablation_warnings = ablation_groups(runs, pairs)
    warnings += ablation_warnings
    tables = build_tables(runs, pairs)
    if groups:
        tables.append(table_history_ablation(groups))
    table_paths: list[Path] = []
    for table in tables:
        for suffix, text in (("md", render_markdown(table)), ("tex", render_latex(table))):
            path = out_dir / f"{table.name}.{suffix}"
            path.write_text(text, encoding="utf-8")
            table_paths.append(path)

    figure_paths: dict[str, list[Path]] = {}
    if figures:
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
                [gains_by_group(pair) for pair in pairs],
                out_dir / "fig_gt_history_gain",
                formats,
            )
            figure_paths["fig_gt_history_gain"] = drawn.paths
            warnings += drawn.warnings
        if groups:
            drawn = figs.plot_history_ablation_isr(
                ablation_panels(groups), out_dir / "fig_history_ablation_isr", formats
            )
            figure_paths["fig_history_ablation_isr"] = drawn.paths
            warnings += drawn.warnings

    created = utc_now()
    report_md = _report_markdown(runs, pairs, tables, figure_paths, warnings, created, sessions_source)
    if explorer:
        report_md = report_md.replace("\n## Runs\n", f"\nExplorer: [{explorer}]({explorer})\n\n## Runs\n", 1)
    if profile_lines:
        report_md += "\n" + "\n".join(profile_lines) + "\n"
    (out_dir / "report.md").write_text(report_md, encoding="utf-8")
    report_json = _report_json(
        runs, pairs, table_paths, figure_paths, warnings, created, sessions_source, options or {}, arguments or {}
    )
    write_json_atomic(out_dir / "report.json", {**report_json, "profile": list(profile_entries), "explorer": explorer})
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
    "fig_gt_history_gain": "ISR gain per turn from ground-truth history, dependent and parallel sessions apart "
    "(dashed: ±|ΔT1|, the turn-1 gain, which is noise since turn 1 has no history)",
    "fig_history_ablation_isr": "ISR per turn of each model under the history ablations",
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
        counts = [
            m.get(key, "?")
            for key in (
                "n_sessions",
                "n_turns",
                "n_constraints",
                "n_other_verdicts",
                "n_unparsed_turns",
                "n_missing_turns",
            )
        ]
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
            "history_kind": run_kind(manifest).name,
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
                "isr_gain_by_turn_by_group_points": gains_by_group(pair),
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


def report_sysbench(request: ReportRequest) -> ReportResult:
    """The ``report`` verb on SysBench runs: Tables 2, 3/7, 4 and 6, the GT-history gain and the figures."""
    options = dict(request.metric_options)
    # Every distinct directory is scored once, even when it is both a run and half of a pair.
    wanted = [Path(p) for p in request.runs] + [p for pair in request.gt_pairs for p in pair]
    cache: dict[Path, RunSummary] = {}
    for path in tqdm(wanted, desc="metrics", unit="run", file=sys.stderr, disable=None):
        key = path.resolve()
        if key not in cache:
            cache[key] = load_run(path, **options)
    runs = []
    for path, label in zip(request.runs, request.labels, strict=False):
        summary = cache[Path(path).resolve()]
        runs.append(_relabel(summary, label) if label else summary)
    runs = [_relabel(run, label) for run, label in zip(runs, unique_labels([r.label for r in runs]), strict=False)]
    runs = sort_runs(runs, request.sort)
    # A pair is named after its base run, with the label that run got in the tables if it is one.
    shown = {run.path.resolve(): run.label for run in runs}
    pairs = [
        GtPair(
            label=shown.get(base.resolve(), cache[base.resolve()].label),
            gt=cache[gt.resolve()],
            base=cache[base.resolve()],
        )
        for gt, base in request.gt_pairs
    ]
    pair_labels = unique_labels([pair.label for pair in pairs])
    pairs = [dataclasses.replace(pair, label=label) for pair, label in zip(pairs, pair_labels, strict=False)]

    sessions = None
    source = None
    if request.figures:
        if request.data:
            dataset = load_dataset(request.data)
            sessions, source = list(dataset.sessions), str(dataset.path)
        else:
            first = RunDir(request.runs[0])
            sessions, source = load_run_sessions(first), str(first.sessions_path)
    return write_report(
        runs,
        request.out,
        pairs,
        sessions=sessions,
        sessions_source=source,
        formats=request.formats,
        figures=request.figures,
        options=options,
        arguments=request.arguments,
        profile_lines=request.profile_lines,
        profile_entries=request.profile_entries,
        explorer=request.explorer,
    )


def _relabel(run: RunSummary, label: str) -> RunSummary:
    return dataclasses.replace(run, label=label)
