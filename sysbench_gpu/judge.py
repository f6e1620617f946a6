"""Placeholder: filled in by its issue."""

from __future__ import annotations

import argparse

from sysbench_gpu.errors import SysbenchError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("judge", help="judge generated turns against their checklists (issue 4)")
    parser.set_defaults(func=_not_ready)


def _not_ready(args: argparse.Namespace) -> int:
    raise SysbenchError("'judge' is not implemented yet")
