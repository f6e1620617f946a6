"""Placeholder: filled in by its issue."""

from __future__ import annotations

import argparse

from sysbench_gpu.errors import SysbenchError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("generate", help="generate replies turn by turn (issue 3)")
    parser.set_defaults(func=_not_ready)


def _not_ready(args: argparse.Namespace) -> int:
    raise SysbenchError("'generate' is not implemented yet")
