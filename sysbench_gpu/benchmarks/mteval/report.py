"""``report`` on MT-Eval runs: MT-Eval's leaderboard layout, scores per task and per answered turn, and runs of
one model side by side (multi, gold history, single) with paired CIs where the dialogues are the same.

An MT-Eval run directory holds one task (one data file). The report groups runs into rows by
model and condition: ``multi`` (multi-turn dialogues, the model's own history), ``gold
history`` (``--history reference``), ``single`` (the ``*_single`` files) and ``ablation``
(``cls_ablation_*``, ``refinement_ablation_*``). A row's scores pool the turns of its runs
(``benchmarks.mteval.metrics.mteval_metrics``): the recollection category pools cls and global-inst
turns, and the average is the mean of the category means, as upstream computes it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from sysbench_gpu import __version__
from sysbench_gpu.benchmarks.base import ReportRequest, ReportResult
from sysbench_gpu.benchmarks.mteval import figures as figs  # matplotlib is imported inside its functions
from sysbench_gpu.benchmarks.mteval.procedure import procedure_warning
from sysbench_gpu.benchmarks.mteval.report_rows import (
    MtevalRow,
    MtevalRun,
    build_rows,
    load_mteval_run,
    side_by_side,
    table_leaderboard,
    table_tasks,
    tables_by_turn,
)
from sysbench_gpu.benchmarks.mteval.tables import (
    leaderboard_markdown,
    side_by_side_markdown,
)
from sysbench_gpu.benchmarks.mteval.tasks import CATEGORIES
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.rundir import RunDir, utc_now, write_json_atomic
from sysbench_gpu.core.tables import (
    Table,
    escape_markdown,
    render_latex,
    render_markdown,
)

# ---------------------------------------------------------------- tables


# ---------------------------------------------------------------- the report


def write_mteval_report(
    runs: Sequence[MtevalRun],
    out_dir: str | Path,
    *,
    formats: Sequence[str] = ("png", "pdf"),
    figures: bool = True,
    options: Mapping[str, Any] | None = None,
    arguments: Mapping[str, Any] | None = None,
    notes: Sequence[str] = (),
) -> tuple[list[Path], list[Path], list[str]]:
    """Write the MT-Eval tables, figure, ``report.md`` and ``report.json``; returns (tables, figures, warnings).

    ``notes``: warnings known before the rows are built (how runs were made unlike the paper).
    """
    if not runs:
        raise SysbenchError("report: no runs given")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    options = dict(options or {})
    resamples, seed = int(options.get("resamples", 1000)), int(options.get("seed", 0))
    rows = build_rows(runs, resamples=resamples, seed=seed)
    blocks = side_by_side(rows, resamples=resamples, seed=seed)
    warnings = [*notes] + [
        f"partial run (turns not generated or not judged, or a stage still running): {run.label}"
        for run in runs
        if run.metrics.get("partial")
    ]
    incomplete = [row.label for row in rows if row.condition != "ablation" and not row.metrics["leaderboard_complete"]]
    if incomplete:
        warnings.append(
            "rows without all four leaderboard categories (their average is over fewer, marked *): "
            + ", ".join(incomplete)
        )

    tables = [table_leaderboard(rows), table_tasks(rows), *tables_by_turn(rows)]
    table_paths: list[Path] = []
    leaderboard_md = (
        leaderboard_markdown([(row.label, row.metrics) for row in rows if row.condition != "ablation"], published=True)
        if any(r.condition != "ablation" for r in rows)
        else ""
    )
    for table in tables:
        markdown = (
            leaderboard_md + "\n" if table.name == "mteval_leaderboard" and leaderboard_md else render_markdown(table)
        )
        for suffix, text in (("md", markdown), ("tex", render_latex(table))):
            path = out_dir / f"{table.name}.{suffix}"
            path.write_text(text, encoding="utf-8")
            table_paths.append(path)
    side_md = "\n\n".join(
        f"### {block['model']}\n\n"
        + side_by_side_markdown(block["columns"], [(c["label"], c) for c in block["comparisons"]])
        for block in blocks
    )
    if side_md:
        path = out_dir / "mteval_side_by_side.md"
        path.write_text(side_md + "\n", encoding="utf-8")
        table_paths.append(path)

    figure_paths: list[Path] = []
    if figures:
        categories = [c for c in CATEGORIES if any(c in row.metrics["categories"] for row in rows)]
        drawn = figs.plot_mteval_by_turn(
            categories,
            [(row.label, {c: b["by_turn"] for c, b in row.metrics["categories"].items()}) for row in rows],
            out_dir / "fig_mteval_by_turn",
            formats,
        )
        figure_paths, warnings = drawn.paths, warnings + drawn.warnings

    created = utc_now()
    markdown = _markdown(runs, rows, tables, leaderboard_md, side_md, figure_paths, warnings, created, resamples)
    (out_dir / "report.md").write_text(markdown, encoding="utf-8")
    write_json_atomic(
        out_dir / "report.json",
        {
            "tool": "sysbench-gpu",
            "version": __version__,
            "created": created,
            "benchmark": "mteval",
            "arguments": dict(arguments or {}),
            "metric_options": options,
            "runs": [
                {
                    "label": run.label,
                    "path": str(run.path.resolve()),
                    "model": run.model,
                    "history": run.history,
                    "settings": list(run.settings),
                    "condition": run.condition,
                    "tasks": list(run.tasks),
                    "metrics": run.metrics,
                }
                for run in runs
            ],
            "rows": [
                {
                    "label": row.label,
                    "model": row.model,
                    "condition": row.condition,
                    "runs": [str(run.path.resolve()) for run in row.runs],
                    "metrics": row.metrics,
                }
                for row in rows
            ],
            "side_by_side": [{"model": b["model"], "comparisons": b["comparisons"]} for b in blocks],
            "tables": [path.name for path in table_paths],
            "figures": [path.name for path in figure_paths],
            "warnings": warnings,
        },
    )
    return table_paths, figure_paths, warnings


def _markdown(
    runs: Sequence[MtevalRun],
    rows: Sequence[MtevalRow],
    tables: Sequence[Table],
    leaderboard_md: str,
    side_md: str,
    figure_paths: Sequence[Path],
    warnings: Sequence[str],
    created: str,
    resamples: int,
) -> str:
    out = [
        "# MT-Eval report",
        "",
        f"Made by sysbench-gpu {__version__} on {created}. Scores on MT-Eval's 0-10 scale, two decimals: the LLM "
        "judge's 1-10 for refinement, expansion and follow-up; 0 or 10 from a rule for recollection (cls: the gold "
        "label in the reply; global-inst: the verifiable instruction followed). Brackets: 95% CI from "
        f"{resamples} bootstrap resamples of dialogues within each task.",
        "",
        "## Runs",
        "",
        "| Label | Model | Run directory | Task | Setting | History | Dialogues | Answered turns | Unparsed | Missing "
        "| Scored by |",
        "| :--- | :--- | :--- | :--- | :--- | :--- | ---: | ---: | ---: | ---: | :--- |",
    ]
    for run in runs:
        m = run.metrics
        scorers = ", ".join(m.get("judge_models") or []) or ", ".join(m.get("scorers") or [])
        out.append(
            f"| {escape_markdown(run.label)} | {escape_markdown(run.model)} | `{run.path}` | "
            f"{', '.join(run.tasks)} | {', '.join(run.settings)} | {run.history} | {m['n_sessions']} | "
            f"{m['n_turns']} | {m.get('n_unparsed_turns', 0)} | {m.get('n_missing_turns', 0)} | "
            f"{escape_markdown(scorers)} |"
        )
    out += [
        "",
        "Rows pool the runs of one model and condition: "
        + "; ".join(
            f"{escape_markdown(row.label)} = {', '.join(escape_markdown(r.label) for r in row.runs)}" for row in rows
        )
        + ".",
    ]
    if warnings:
        out += ["", "## Warnings", ""] + [f"- {escape_markdown(w)}" for w in warnings]
    for table in tables:
        out += ["", f"## {table.title}", "", escape_markdown(table.caption), ""]
        body = leaderboard_md if table.name == "mteval_leaderboard" and leaderboard_md else render_markdown(table)
        out += [body.rstrip("\n"), "", f"LaTeX: [{table.name}.tex]({table.name}.tex)"]
    if side_md:
        out += [
            "",
            "## Runs of one model side by side",
            "",
            "Each condition minus the first, with a 95% CI of the difference: paired (the same dialogue "
            "resamples for both) when the two hold the same dialogues and turns (gold history against the "
            "model's own), unpaired otherwise (multi against single).",
            "",
            side_md,
        ]
    if figure_paths:
        raster = next((p for p in figure_paths if p.suffix in (".png", ".svg")), None)
        out += ["", "## Figures", "", "### Score by answered turn", ""]
        if raster is not None:
            out += [f"![Score by answered turn]({raster.name})", ""]
        out.append("Files: " + ", ".join(f"[{p.name}]({p.name})" for p in figure_paths))
    return "\n".join(out) + "\n"


def report_mteval(request: ReportRequest) -> ReportResult:
    """The ``report`` verb on MT-Eval runs: leaderboard, tasks, turns, side by side."""
    if request.gt_pairs:
        raise SysbenchError(
            "--gt-pair applies to SysBench runs; MT-Eval gold-history runs go in the list of runs "
            "and are shown beside the same model's runs"
        )
    if request.sort != "given":
        raise SysbenchError("--sort applies to SysBench runs; MT-Eval rows follow the order of the runs")
    options = dict(request.metric_options)
    runs = [
        load_mteval_run(path, label, **options)
        for path, label in tqdm(
            list(zip(request.runs, request.labels, strict=False)),
            desc="metrics",
            unit="run",
            file=sys.stderr,
            disable=None,
        )
    ]
    # Rows beside the published leaderboard say how they were made unlike it.
    procedure = [
        f"{label}: {line}"
        for path, label in zip(request.runs, request.labels, strict=False)
        if (line := procedure_warning(RunDir(path).read_manifest()))
    ]
    tables, figures, warnings = write_mteval_report(
        runs,
        request.out,
        formats=request.formats,
        figures=request.figures,
        options=options,
        arguments=request.arguments,
        notes=procedure,
    )
    return ReportResult(out_dir=request.out, tables=tables, figures=figures, warnings=warnings)
