"""The verbs a plan runs, read from their own parsers: a step's argv is checked as the verb would check it.

Every step of a plan is a verb's command line (``plans.steps``). Here those command lines
are parsed by the verbs' own ``register(subparsers)`` parsers, in this process, so a value
the verb would refuse is refused before any step runs, and the types of a model's engine
options come from the flags themselves.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, NoReturn

from sysbench_gpu.arena import cli as arena_cli
from sysbench_gpu.attention import stage as attention_stage
from sysbench_gpu.core.arguments import check_shared_flags
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.explore import site as explore_site
from sysbench_gpu.generation import cli as generation_cli
from sysbench_gpu.judging import cli as judging_cli
from sysbench_gpu.reporting import metrics as metrics_cli
from sysbench_gpu.reporting import report as report_cli

VERB_MODULES = (generation_cli, judging_cli, metrics_cli, report_cli, arena_cli, attention_stage, explore_site)


class _RaisingParser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting: the plan names its own key."""

    def error(self, message: str) -> NoReturn:
        raise SysbenchError(message)


@lru_cache(maxsize=1)
def _parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = _RaisingParser(prog="sysbench-gpu", add_help=False)
    subparsers = parser.add_subparsers(dest="command")
    for module in VERB_MODULES:
        module.register(subparsers)
    return parser, dict(subparsers.choices)


def verb_parser(verb: str) -> argparse.ArgumentParser:
    return _parsers()[1][verb]


def parse_step(argv: Sequence[str]) -> argparse.Namespace:
    """A step's command line as its verb parses it, with the checks every verb shares (``check_shared_flags``)."""
    args = _parsers()[0].parse_args(list(argv))
    args.secrets = None
    check_shared_flags(args)
    return args


def has_flag(verb: str, dest: str) -> bool:
    return any(action.dest == dest for action in verb_parser(verb)._actions)


def flag_of(verb: str, dest: str) -> argparse.Action | None:
    """The verb's action for ``dest`` (None when the verb has no such flag)."""
    for action in verb_parser(verb)._actions:
        if action.dest == dest and action.option_strings:
            return action
    return None


def flag_types(action: argparse.Action) -> tuple[type, ...]:
    """The TOML types a plan may give for a flag: true/false for a switch, else what the flag parses.

    A flag read as text may take a table too (sent as JSON, e.g. ``extra_body``).
    """
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return (bool,)
    kind: Any = action.type
    if kind is int:
        return (int,)
    if kind is float:
        return (float,)
    return (str, dict)


def option_string(action: argparse.Action) -> str:
    """The long form of a flag (``--tensor-parallel-size``)."""
    longs = [option for option in action.option_strings if option.startswith("--")]
    return longs[0] if longs else action.option_strings[0]
