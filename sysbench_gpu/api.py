"""The Python API: the pipeline as functions that return numbers (docs/python-api.md).

Each function is its verb's, with the verb's checks, files and resumption; a run made here is
the run the command line would have made, and the other way round::

    from sysbench_gpu.api import generate, judge, metrics

    generate("demo", model="smollm2", engine="hf", out="demo-run", max_tokens=64)
    judge("demo-run", backend="hf", model="smollm2", template="en", engine_options={"batch_size": 8})
    print(metrics("demo-run")["ssr"])

- ``run_plan(plan_or_path) -> PlanResult``: ``sysbench-gpu run PLAN.toml`` (``plans.api``);
- ``generate(data, model=, engine=, out=, ...)``: ``generate`` (``generation.api``);
- ``judge(run_dir, backend=, model=, ...)`` and ``judge_estimate(...)``: ``judge`` and its dry run (``judging.api``);
- ``metrics(run_dir) -> dict`` and ``report(runs, out)``: ``metrics --json`` and ``report`` (``reporting.api``);
- ``attention(run_dir, model=, out=, ...)``: ``attention``, in this process (``attention.api``).

Importing this module imports no model library: torch and the engines load when a function needs them.
"""

from sysbench_gpu.attention.api import attention
from sysbench_gpu.generation.api import generate
from sysbench_gpu.judging.api import judge, judge_estimate
from sysbench_gpu.plans.api import run_plan
from sysbench_gpu.plans.plan import Plan, load_plan
from sysbench_gpu.plans.result import PlanResult, StepOutcome
from sysbench_gpu.reporting.api import metrics, report

__all__ = [
    "Plan",
    "PlanResult",
    "StepOutcome",
    "attention",
    "generate",
    "judge",
    "judge_estimate",
    "load_plan",
    "metrics",
    "report",
    "run_plan",
]
