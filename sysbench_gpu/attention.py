"""Placeholder: filled in by its issue."""

from __future__ import annotations

import argparse

from sysbench_gpu.errors import SysbenchError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("attention", help="share of attention on system tokens (issue 5)")
    parser.set_defaults(func=_not_ready)


def _not_ready(args: argparse.Namespace) -> int:
    raise SysbenchError("'attention' is not implemented yet")
