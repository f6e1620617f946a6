"""Placeholder: filled in by its issue."""

from __future__ import annotations

import argparse

from sysbench_gpu.errors import SysbenchError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("import-upstream", help="turn a published upstream workbook into a run directory")
    parser.set_defaults(func=_not_ready)


def _not_ready(args: argparse.Namespace) -> int:
    raise SysbenchError("'import-upstream' is not implemented yet")
