"""The ``data`` command: download, validate and describe a benchmark's data files.

Every action goes through the file's benchmark (``benchmarks.base``): ``--benchmark NAME``
picks one, otherwise a file is read by the benchmark whose format it is.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sysbench_gpu.benchmarks.registry import benchmark_names, dataset_benchmark, get_benchmark, load_dataset

# ---------------------------------------------------------------- CLI


def register(subparsers: argparse._SubParsersAction) -> None:
    data = subparsers.add_parser("data", help="download, validate and describe SysBench or MT-Eval data")
    data_sub = data.add_subparsers(dest="data_command", metavar="ACTION")

    download = data_sub.add_parser(
        "download", help="fetch the official SysBench file (sha256 checked) or MT-Eval's task files (Hugging Face hub)"
    )
    names = benchmark_names()
    download.add_argument("--benchmark", choices=names, default=names[0])
    download.add_argument("--out", default="data", help="directory or file path (default: ./data)")
    download.add_argument(
        "--url", help="SysBench: mirror URL (default: the pinned official one); the checksum is still enforced"
    )
    download.add_argument("--tasks", help="MT-Eval: comma-separated configs, e.g. refinement_multi (default: all)")
    download.add_argument("--revision", help="MT-Eval: dataset revision on the hub (default: main)")
    download.set_defaults(func=_cmd_download)

    stats = data_sub.add_parser("stats", help="print statistics of a data file (SysBench Table 1, or MT-Eval counts)")
    stats.add_argument("file", help="data file or directory")
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.add_argument("--task", help="MT-Eval: the task, when the file name does not say (e.g. refinement_multi)")
    stats.add_argument("--benchmark", choices=names, help="read the file as this benchmark's (default: by its format)")
    stats.set_defaults(func=_cmd_stats)

    validate = data_sub.add_parser("validate", help="validate a data file and say whether it is the official one")
    validate.add_argument("file", help="data file or directory")
    validate.add_argument(
        "--benchmark", choices=names, help="read the file as this benchmark's (default: by its format)"
    )
    validate.set_defaults(func=_cmd_validate)
    data.set_defaults(func=lambda args: data.print_help() or 2)


def _cmd_download(args: argparse.Namespace) -> int:
    options = {"url": args.url, "tasks": args.tasks, "revision": args.revision}
    for line in get_benchmark(args.benchmark).download(Path(args.out), options):
        print(line)
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
    dataset = load_dataset(args.file, task=args.task, benchmark=args.benchmark)
    benchmark = dataset_benchmark(dataset)
    stats = benchmark.stats(dataset)
    if args.json:
        json.dump(stats, sys.stdout, ensure_ascii=False, indent=2)
        print()
    else:
        print(benchmark.format_stats(dataset, stats))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    dataset = load_dataset(args.file, benchmark=args.benchmark)
    print(dataset_benchmark(dataset).describe_valid(dataset))
    return 0
