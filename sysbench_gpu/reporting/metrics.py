"""The ``metrics`` and ``compare`` verbs: each run's benchmark computes and formats its numbers."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

from sysbench_gpu.benchmarks.registry import get_benchmark
from sysbench_gpu.benchmarks.runs import compare_loaded, compare_runs, load_run, metrics_of, run_metrics

__all__ = ["compare_runs", "register", "run_metrics"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "metrics", help="CSR, ISR, SSR and breakdowns of a judged run (MT-Eval: scores by task, category and turn)"
    )
    parser.add_argument("run_dir", help="run directory (generated and judged, or imported)")
    parser.add_argument("--json", action="store_true", help="print JSON (fractions in [0, 1])")
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help="score what is there of an unfinished run (ungenerated or unjudged turns)",
    )
    parser.add_argument("--exclude-unparsed", action="store_true", help="leave out (and count) unparsed judgments")
    parser.add_argument(
        "--exclude-skipped", action="store_true", help="leave out (and count) turns skipped at generation (no reply)"
    )
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.set_defaults(func=_cmd_metrics)

    compare = subparsers.add_parser(
        "compare", help="difference of runs' metrics (B - A) with CIs, paired where they share sessions"
    )
    compare.add_argument("run_a", help="baseline run directory")
    compare.add_argument(
        "run_b", nargs="+", help="run directory compared against it (MT-Eval: one or more, each against RUN_A)"
    )
    compare.add_argument("--json", action="store_true", help="print JSON")
    compare.add_argument("--allow-partial", action="store_true", help="compare runs with ungenerated or unjudged turns")
    compare.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default 1000)")
    compare.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    compare.set_defaults(func=_cmd_compare)


def _cmd_metrics(args: argparse.Namespace) -> int:
    loaded = load_run(args.run_dir)
    result = metrics_of(
        loaded,
        allow_partial=args.allow_partial,
        exclude_unparsed=args.exclude_unparsed,
        exclude_skipped=args.exclude_skipped,
        resamples=args.resamples,
        seed=args.seed,
    )
    benchmark = get_benchmark(loaded.benchmark)
    warning = benchmark.procedure_warning(loaded.manifest)
    if warning:
        print(f"warning: {loaded.label}: {warning}", file=sys.stderr)
    _emit(result, args.json, benchmark.format_metrics)
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    runs = [load_run(path) for path in (args.run_a, *args.run_b)]
    result = compare_loaded(runs, resamples=args.resamples, seed=args.seed, allow_partial=args.allow_partial)
    _emit(result, args.json, get_benchmark(runs[0].benchmark).format_comparison)
    return 0


def _emit(result: Mapping[str, Any], as_json: bool, formatter: Callable[[Mapping[str, Any]], str]) -> None:
    if as_json:
        json.dump(result, sys.stdout, ensure_ascii=False, indent=2)
        print()
    else:
        print(formatter(result))
