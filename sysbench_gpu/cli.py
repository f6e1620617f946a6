"""Command-line entry point: ``sysbench-gpu`` and ``python -m sysbench_gpu``.

Each stage module exposes ``register(subparsers)`` that adds its sub-commands with
``set_defaults(func=...)``. Stage modules import torch, vllm and friends lazily
inside their functions, so building the parser stays cheap and ``metrics`` or
``report`` never touch a GPU library.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from sysbench_gpu import __version__
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.redact import (
    install_log_redaction,
    redact,
    register_secret_env,
    register_url_secrets,
)

# Order is the order in `--help`: the pipeline, then the side stage.
STAGE_MODULES = (
    "sysbench_gpu.datasets.cli",
    "sysbench_gpu.generation.cli",
    "sysbench_gpu.judging.cli",
    "sysbench_gpu.reporting.metrics",
    "sysbench_gpu.reporting.report",
    "sysbench_gpu.benchmarks.sysbench.upstream",
    "sysbench_gpu.attention.stage",
    "sysbench_gpu.profiling.stage",
    "sysbench_gpu.explore.site",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sysbench-gpu",
        description="Generate, judge, score and explain SysBench runs.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in STAGE_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    # Secrets named on the command line are known before anything can log or fail.
    register_secret_env(getattr(args, "api_key_env", None) or "OPENAI_API_KEY")
    register_url_secrets(getattr(args, "base_url", None))
    install_log_redaction()
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        result = args.func(args)
    except SysbenchError as error:
        print(f"error: {' '.join(redact(str(error)).splitlines())}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # Output piped into `head` and friends: not an error of ours.
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("interrupted: finished records are kept; rerun the same command to resume", file=sys.stderr)
        return 130
    return int(result or 0)
