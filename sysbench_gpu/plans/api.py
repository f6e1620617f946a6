"""``run_plan`` as a Python function: what ``sysbench-gpu run PLAN`` does (docs/plans.md, docs/python-api.md)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from sysbench_gpu.plans.execute import RunOptions, run_plan_steps
from sysbench_gpu.plans.plan import Plan, load_plan
from sysbench_gpu.plans.result import PlanResult


def run_plan(
    plan_or_path: Plan | str | Path,
    *,
    out: str | Path | None = None,
    only: Sequence[str] | None = None,
    steps: Sequence[str] | None = None,
    continue_on_error: bool = False,
    progress: bool = True,
    log_every: float | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> PlanResult:
    """Run an evaluation plan to its end: every model's runs, then the arena, the explorer and the report.

    ``plan_or_path``: a plan file (TOML) or a :class:`Plan` from ``load_plan``. ``out`` overrides the
    plan's output root. ``only``: these models; ``steps``: these step kinds (``generate``, ``judge``,
    ``metrics``, ``attention``, ``arena``, ``explore``, ``report``). Each step is its verb run in a
    child process; a rerun skips what is done and resumes what is half done. A failure raises
    ``SysbenchError`` naming the model and the step, unless ``continue_on_error``: then the result's
    ``failed`` names it. The steps' output goes to ``stdout``/``stderr`` (default: this process's).
    """
    plan = plan_or_path if isinstance(plan_or_path, Plan) else load_plan(plan_or_path, out=out)
    if out is not None and isinstance(plan_or_path, Plan):
        plan = load_plan(plan.path, out=out)
    options = RunOptions(
        only=tuple(only) if only is not None else None,
        steps=tuple(steps) if steps is not None else None,
        continue_on_error=continue_on_error,
        progress=progress,
        log_every=log_every,
    )
    return run_plan_steps(plan, options, stdout or sys.stdout, stderr or sys.stderr)
