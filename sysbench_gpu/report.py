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
- ``table_history_ablation`` (with single-turn or distractor runs, or one model's runs of
  several kinds): per-turn ISR of each kind (``report_ablations``);

each as ``.md`` and ``.tex`` (booktabs), figures (see :mod:`sysbench_gpu.figures`),
``report.md`` stitching it all together and ``report.json`` with every metrics dict
and how it was made. Percentages carry one decimal; the best value of a column is
bold. MT-Eval runs get their own report (``report_mteval``: the leaderboard layout).
The work is split by job: ``report_runs`` (runs, pairs, checks), ``report_tables``
(tables and their rendering), ``report_ablations``, ``report_mteval``, and this module
(the SysBench report and the command line). Nothing here imports torch; matplotlib is
imported only when figures are drawn.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from sysbench_gpu import __version__
from sysbench_gpu.data import TYPE_ORDER, Session, load_dataset
from sysbench_gpu.errors import SysbenchError
from sysbench_gpu.report_ablations import (
    ablation_groups,
    ablation_panels,
    gains_by_group,
    run_kind,
    table_history_ablation,
)
from sysbench_gpu.report_runs import (  # noqa: F401  (re-exported: the report's public names)
    N_TURNS,
    GtPair,
    MetricsFn,
    RunSummary,
    _diff_points,
    _num,
    as_sequence,
    checklist_fingerprint,
    dataset_warnings,
    isr_gain_by_turn,
    load_run,
    require_judged,
    unique_labels,
)
from sysbench_gpu.report_tables import (  # noqa: F401
    SORT_KEYS,
    Table,
    build_tables,
    escape_latex,
    escape_markdown,
    pct,
    render_latex,
    render_markdown,
    sort_runs,
    table_alignment,
    table_csr_by_type,
    table_gt_gain,
    table_overall,
    table_rounds,
)
from sysbench_gpu.runstore import RunDir, utc_now, write_json_atomic

FIGURE_FORMATS = ("png", "pdf", "svg")


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
                [gains_by_group(pair) for pair in pairs],
                out_dir / "fig_gt_history_gain",
                formats,
            )
            figure_paths["fig_gt_history_gain"] = drawn.paths
            warnings += drawn.warnings
        if groups:
            drawn = figs.plot_history_ablation_isr(ablation_panels(groups), out_dir / "fig_history_ablation_isr", formats)
            figure_paths["fig_history_ablation_isr"] = drawn.paths
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
    if any(_is_mteval(path) for path in args.runs):
        return _cmd_report_mteval(args, labels, formats, pair_paths)
    options = _metric_options(args)
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


def _is_mteval(path: str) -> bool:
    from sysbench_gpu.report_mteval import is_mteval_run

    return is_mteval_run(path)


def _metric_options(args: argparse.Namespace) -> dict[str, Any]:
    """The metric settings both benchmarks' reports pass to every run they score."""
    return {
        "allow_partial": args.allow_partial,
        "exclude_unparsed": args.exclude_unparsed,
        "exclude_skipped": args.exclude_skipped,
        "resamples": args.resamples,
        "seed": args.seed,
    }


def _cmd_report_mteval(args: argparse.Namespace, labels: Sequence[str | None], formats: Sequence[str],
                       pair_paths: Sequence[tuple[Path, Path]]) -> int:
    """``report`` on MT-Eval runs (every run must be one): leaderboard, tasks, turns, side by side."""
    from tqdm import tqdm

    from sysbench_gpu.report_mteval import load_mteval_run, write_mteval_report

    sysbench = [path for path in args.runs if not _is_mteval(path)]
    if sysbench:
        raise SysbenchError(f"report: {sysbench[0]} is a SysBench run among MT-Eval runs; "
                            "report the two benchmarks separately")
    if pair_paths:
        raise SysbenchError("--gt-pair applies to SysBench runs; MT-Eval gold-history runs go in the list of runs "
                            "and are shown beside the same model's runs")
    if args.sort != "given":
        raise SysbenchError("--sort applies to SysBench runs; MT-Eval rows follow the order of the runs")
    options = _metric_options(args)
    runs = [load_mteval_run(path, label, **options)
            for path, label in tqdm(list(zip(args.runs, labels)), desc="metrics", unit="run", file=sys.stderr,
                                    disable=None)]
    tables, figures, warnings = write_mteval_report(
        runs, args.out, formats=formats, figures=not args.no_figures, options=options,
        arguments={key: value for key, value in vars(args).items() if key != "func"},
    )
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"wrote {len(tables)} table files, {len(figures)} figure files, report.md and report.json to {args.out}")
    return 0


def _relabel(run: RunSummary, label: str) -> RunSummary:
    return dataclasses.replace(run, label=label)

