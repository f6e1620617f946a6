"""The ``report`` verb: one benchmark's tables and figures for runs side by side.

The runs' benchmark writes its report (``Benchmark.report``); this stage checks that the runs
belong to one benchmark, parses the shared flags, and adds what only it knows: the
throughput profile of runs with ``stats.json`` and a link to an explorer built beside.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sysbench_gpu.attention.analysis.interp_report import report_markdown
from sysbench_gpu.attention.analysis.knockout_report import knockout_markdown
from sysbench_gpu.benchmarks.base import ReportRequest, ReportResult
from sysbench_gpu.benchmarks.registry import REGISTRY, one_benchmark, run_benchmark
from sysbench_gpu.core.arguments import check_out_folder
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.plotting import parse_formats
from sysbench_gpu.profiling.stage import report_section


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
        "--sort", default="given", choices=_sort_keys(), help="row order: as given, or by a metric with the best first"
    )
    parser.add_argument("--no-figures", action="store_true", help="tables only")
    parser.add_argument(
        "--attention",
        action="append",
        default=[],
        metavar="ATT_DIR",
        help="attention output directory whose `attention-analyze` files (heads, probe, decay) the report shows",
    )
    parser.add_argument("--allow-partial", action="store_true", help="score runs with missing turns")
    parser.add_argument(
        "--exclude-unparsed", action="store_true", help="leave out turns whose judge reply never parsed"
    )
    parser.add_argument(
        "--exclude-skipped", action="store_true", help="leave out turns skipped at generation (no reply)"
    )
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples for the 95%% CIs")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    parser.add_argument(
        "--device-spec",
        help="device for the throughput profile of runs with stats.json "
        "(h100, h200, a100, cpu or a JSON file; default: cpu for CPU runs, else none)",
    )
    parser.set_defaults(func=_cmd_report)


EXPLORER_DIRNAME = "explore"  # `explore --out` beside a report's folder is linked from it
# What a report folder holds: report.md and report.json, tables (.md, .tex) and figures (.png, .pdf, .svg).
REPORT_SUFFIXES = frozenset({".md", ".tex", ".json", ".png", ".pdf", ".svg"})


def is_report_folder(path: Path) -> bool:
    """An earlier report (or one stopped before report.json): only the kinds of file a report writes."""
    if (path / "report.json").is_file():
        return True
    return all(entry.is_file() and entry.suffix in REPORT_SUFFIXES for entry in path.iterdir())


def explorer_link(report_dir: str | Path) -> str | None:
    """The explorer's index as a path relative to a report folder, when one is built beside it."""
    candidate = Path(report_dir).resolve().parent / EXPLORER_DIRNAME / "index.html"
    return f"../{EXPLORER_DIRNAME}/index.html" if candidate.is_file() else None


def _sort_keys() -> tuple[str, ...]:
    """``--sort`` choices: every registered benchmark's, in order (a benchmark refuses those not its own)."""
    return tuple(dict.fromkeys(key for benchmark in REGISTRY.all() for key in benchmark.sort_keys))


def parse_gt_pair(text: str) -> tuple[Path, Path]:
    gt, sep, base = text.partition("=")
    if not sep or not gt or not base:
        raise SysbenchError(f"--gt-pair {text!r}: expected GT_RUN=BASE_RUN")
    return Path(gt), Path(base)


def _cmd_report(args: argparse.Namespace) -> int:
    result = report_from_args(args)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(
        f"wrote {len(result.tables)} table files, {len(result.figures)} figure files, report.md and report.json "
        f"to {result.out_dir}"
    )
    return 0


def report_from_args(args: argparse.Namespace) -> ReportResult:
    """The report the verb's flags ask for, written (``reporting.api.report`` calls this too)."""
    labels: list[str | None] = [None] * len(args.runs)
    pair_paths = [parse_gt_pair(text) for text in args.gt_pair]
    # A report may live inside a run (README: `--out demo-run/report`), never in the run's own folder.
    inputs = [*args.runs, *(path for pair in pair_paths for path in pair), *args.attention]
    check_out_folder(args.out, inputs=inputs, inside_inputs=True, kind="report", is_own=is_report_folder)
    if args.labels:
        given = [label.strip() for label in args.labels.split(",")]
        if len(given) != len(args.runs):
            raise SysbenchError(f"--labels: {len(given)} labels for {len(args.runs)} run directories")
        labels = list(given)
    formats = parse_formats(args.formats)
    benchmark = one_benchmark([(path, run_benchmark(path)) for path in args.runs], "report")
    profile_lines: Sequence[str] = ()
    profile_entries: Sequence[Mapping[str, Any]] = ()
    explorer = None
    if benchmark.report_extras:
        # Runs with stats.json get a throughput profile; an explorer built beside the report is linked.
        profile_lines, profile_entries = report_section([Path(path) for path in args.runs], args.device_spec)
        explorer = explorer_link(args.out)
    request = ReportRequest(
        runs=list(args.runs),
        labels=labels,
        out=Path(args.out),
        formats=formats,
        figures=not args.no_figures,
        metric_options=_metric_options(args),
        arguments={key: value for key, value in vars(args).items() if key not in ("func", "secrets")},
        gt_pairs=pair_paths,
        sort=args.sort,
        data=args.data,
        device_spec=args.device_spec,
        profile_lines=profile_lines,
        profile_entries=profile_entries,
        explorer=explorer,
    )
    result = benchmark.report(request)
    if args.attention:
        # Heads, failure probe and decay are the attention folders' own files; the report appends their section.
        section = report_markdown([Path(d) for d in args.attention], Path(result.out_dir))
        with (Path(result.out_dir) / "report.md").open("a", encoding="utf-8") as handle:
            handle.write("\n" + "\n".join(section) + "\n")
        knockout = knockout_markdown([Path(d) for d in args.attention], Path(result.out_dir))
        if knockout:  # `attention --knockout`: Δ log p per arm, joined with the verdicts
            with (Path(result.out_dir) / "report.md").open("a", encoding="utf-8") as handle:
                handle.write("\n" + "\n".join(knockout) + "\n")
    return result


def _metric_options(args: argparse.Namespace) -> dict[str, Any]:
    """The metric settings a benchmark's report passes to every run it scores."""
    return {
        "allow_partial": args.allow_partial,
        "exclude_unparsed": args.exclude_unparsed,
        "exclude_skipped": args.exclude_skipped,
        "resamples": args.resamples,
        "seed": args.seed,
    }
