"""``sysbench-gpu run PLAN.toml``: one file describes the job, and the command runs it to the end (docs/plans.md)."""

from __future__ import annotations

import argparse
import json
import sys

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.progress import DEFAULT_LOG_EVERY, add_progress_flags
from sysbench_gpu.plans.api import run_plan
from sysbench_gpu.plans.dry_run import as_json, describe_plan, format_dry_run
from sysbench_gpu.plans.execute import RunOptions
from sysbench_gpu.plans.plan import load_plan
from sysbench_gpu.plans.steps import STEP_KINDS


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run an evaluation plan (TOML): generate, judge, metrics and attention per model, then arena, "
        "explorer and report (resumable)",
        description="Run every step a plan file describes, each as its verb in a child process; a rerun skips "
        "what is done and resumes what is half done. docs/plans.md describes the file.",
    )
    parser.add_argument("plan", metavar="PLAN.toml", help="the plan file")
    parser.add_argument("--out", help="output root (default: the plan's `out`, else runs/<name>)")
    parser.add_argument("--dry-run", action="store_true", help="list the steps as commands, and the judge's estimate")
    parser.add_argument("--json", action="store_true", help="with --dry-run: as JSON")
    parser.add_argument("--only", metavar="MODEL[,MODEL...]", help="only these models of the plan")
    parser.add_argument(
        "--steps", metavar="STEP[,STEP...]", help=f"only these steps ({', '.join(STEP_KINDS)}; default all)"
    )
    parser.add_argument(
        "--continue-on-error",
        action="store_true",
        help="record a failed model and go on with the next; the summary names it (exit status 1)",
    )
    add_progress_flags(parser)
    parser.set_defaults(func=_cmd_run)


def _names(text: str | None, flag: str) -> tuple[str, ...] | None:
    if text is None:
        return None
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise SysbenchError(f"{flag}: give at least one name")
    return names


def _cmd_run(args: argparse.Namespace) -> int:
    if args.json and not args.dry_run:
        raise SysbenchError("--json applies with --dry-run")
    only, steps = _names(args.only, "--only"), _names(args.steps, "--steps")
    plan = load_plan(args.plan, out=args.out)
    # Passed on to the steps only when it is not the default that every verb has anyway.
    log_every = args.log_every if args.log_every != DEFAULT_LOG_EVERY else None
    if args.dry_run:
        options = RunOptions(only=only, steps=steps, progress=not args.no_progress, log_every=log_every)
        states = describe_plan(plan, options)
        print(
            json.dumps(as_json(plan, states), ensure_ascii=False, indent=2)
            if args.json
            else format_dry_run(plan, states)
        )
        return 0
    result = run_plan(
        plan,
        only=only,
        steps=steps,
        continue_on_error=args.continue_on_error,
        progress=not args.no_progress,
        log_every=log_every,
        stdout=sys.stdout,
        stderr=sys.stderr,
    )
    return 0 if result.ok else 1
