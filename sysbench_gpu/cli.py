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
import traceback
from collections.abc import Sequence

from sysbench_gpu import __version__
from sysbench_gpu.core.arguments import check_shared_flags
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.redact import Secrets, install_log_redaction

# Order is the order in `--help`: the pipeline, then the side stage.
STAGE_MODULES = (
    "sysbench_gpu.plans.cli",  # `run PLAN.toml`: the whole pipeline from one file
    "sysbench_gpu.datasets.cli",
    "sysbench_gpu.generation.cli",
    "sysbench_gpu.judging.cli",
    "sysbench_gpu.reporting.metrics",
    "sysbench_gpu.reporting.report",
    "sysbench_gpu.arena.cli",
    "sysbench_gpu.benchmarks.sysbench.upstream",
    "sysbench_gpu.attention.stage",
    "sysbench_gpu.attention.analysis.interp_report",
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


# Client libraries that log every HTTP request at INFO ("HTTP Request: POST ... 200 OK"): shown with -v only.
# The openai package talks through httpx2/httpcore2 in its newer releases, through httpx/httpcore before.
HTTP_CLIENT_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2", "openai", "urllib3")


def quiet_http_clients(verbose: bool) -> None:
    """The client libraries' request lines are debug detail: below WARNING they show only with ``-v``."""
    for name in HTTP_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    quiet_http_clients(args.verbose)
    # The secrets this command can meet are known before anything can log or fail; stages
    # get them as ``args.secrets`` and pass them to whatever talks to a server.
    secrets = Secrets.gather(getattr(args, "api_key_env", None) or "OPENAI_API_KEY", getattr(args, "base_url", None))
    args.secrets = secrets
    install_log_redaction(secrets)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        # The flags many verbs share are checked here, once, before any verb makes a folder or loads a model.
        check_shared_flags(args)
        result = args.func(args)
    except SysbenchError as error:
        print(f"error: {' '.join(secrets.scrub(str(error)).splitlines())}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # Output piped into `head` and friends: not an error of ours.
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("interrupted: finished records are kept; rerun the same command to resume", file=sys.stderr)
        return 130
    except Exception:  # noqa: BLE001 (a bug of ours: its traceback, scrubbed, since its text may echo a server)
        print(secrets.scrub(traceback.format_exc()), end="", file=sys.stderr)
        return 1
    return int(result or 0)
