"""Running a plan: its steps in order, each its verb in a child process, skipping what is done (docs/plans.md).

Before any step runs, every chosen step is checked as its verb would check it
(``plans.status``): a changed plan against an existing run directory is refused there, in a
line naming the model, the step and the field. Then each model's steps run one after another
(a step that is done is skipped; a half-done one resumes through its verb), and the arena,
the explorer and the report over the runs that finished. With ``continue_on_error`` a failed
model is recorded and the next one starts; the result names it.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, replace
from typing import IO

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.progress import DEFAULT_LOG_EVERY, ProgressLog, format_duration
from sysbench_gpu.core.rundir import PLAN_PATH_ENV, PLAN_SHA256_ENV
from sysbench_gpu.plans.child import run_child
from sysbench_gpu.plans.plan import ModelSpec, Plan, RunSpec
from sysbench_gpu.plans.result import PlanResult, StepOutcome
from sysbench_gpu.plans.status import StepRefused, step_state
from sysbench_gpu.plans.steps import RUN_STEPS, STEP_KINDS, Step, closing_steps, plan_steps
from sysbench_gpu.plans.upper_bound import UpperBounds
from sysbench_gpu.plans.verbs import has_flag

OUTPUTS = "outputs"  # where a failed closing step is recorded in PlanResult.failed
ARENA_RATINGS = "ratings.json"  # an arena the explorer can show


@dataclass(frozen=True)
class RunOptions:
    """``run``'s flags: which models and steps, and what a failure does."""

    only: tuple[str, ...] | None = None  # model names
    steps: tuple[str, ...] | None = None  # step kinds
    continue_on_error: bool = False
    progress: bool = True
    log_every: float | None = None  # passed on to every step that logs progress; None: each verb's default

    def wants(self, kind: str) -> bool:
        return self.steps is None or kind in self.steps


def check_options(plan: Plan, options: RunOptions) -> None:
    names = [model.name for model in plan.models]
    for name in options.only or ():
        if name not in names:
            raise SysbenchError(f"--only {name}: not a model of {plan.path} (models: {', '.join(names)})")
    for kind in options.steps or ():
        if kind not in STEP_KINDS:
            raise SysbenchError(f"--steps {kind}: not a step (steps: {', '.join(STEP_KINDS)})")


def chosen_models(plan: Plan, options: RunOptions) -> list[ModelSpec]:
    return [model for model in plan.models if options.only is None or model.name in options.only]


def with_progress_flags(step: Step, options: RunOptions) -> Step:
    """The step with ``run``'s ``--log-every``/``--no-progress`` passed on, where its verb has them."""
    verb = step.argv[0]
    extra: list[str] = []
    if options.log_every is not None and has_flag(verb, "log_every"):
        extra += ["--log-every", f"{options.log_every:g}"]
    if not options.progress and has_flag(verb, "no_progress"):
        extra.append("--no-progress")
    return replace(step, argv=(*step.argv, *extra)) if extra else step


def model_steps(plan: Plan, options: RunOptions) -> dict[str, list[Step]]:
    """Each chosen model's steps, in order, filtered by ``--steps``."""
    steps = [with_progress_flags(step, options) for step in plan_steps(plan, runs=()) if step.kind in RUN_STEPS]
    return {
        model.name: [step for step in steps if step.model == model.name and options.wants(step.kind)]
        for model in chosen_models(plan, options)
    }


def run_plan_steps(
    plan: Plan, options: RunOptions, stdout: IO[str] | None = None, stderr: IO[str] | None = None
) -> PlanResult:
    """Run the plan to its end (or its first failure); a rerun continues where it stopped."""
    check_options(plan, options)
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    started = time.monotonic()
    result = PlanResult(plan.path, plan.sha256, plan.out, runs={run.name: plan.run_dir(run) for run in plan.runs})
    by_model = model_steps(plan, options)
    every_step = [step for steps in by_model.values() for step in steps]
    bounds = UpperBounds(plan_steps(plan, runs=()))
    # Every step checked as its verb would check it, before anything runs or loads.
    for name, steps in by_model.items():
        try:
            for step in steps:
                step_state(step, bounds)
        except StepRefused as error:
            _fail(result, name, str(error), options)
    for step in closing_steps(plan, plan.runs):
        if options.wants(step.kind):
            try:
                step_state(step)
            except StepRefused as error:
                _fail(result, OUTPUTS, str(error), options)
    closing_total = sum(1 for kind in ("arena", "explore", "report") if options.wants(kind))
    _say(stderr, f"plan {plan.path} (sha256 {plan.sha256[:12]}): {len(plan.runs)} run(s) under {plan.out}")
    with ProgressLog(
        "run",
        len(every_step) + closing_total,
        "step",
        log_every=options.log_every or DEFAULT_LOG_EVERY,
        enabled=options.progress,
    ) as progress:
        for name, steps in by_model.items():
            for step in steps:
                if name in result.failed:
                    result.steps.append(_outcome(step, "not run"))
                    progress.update(1)
                    continue
                _run_step(plan, step, result, options, stdout, stderr)
                progress.update(1)
        finished = [run for run in plan.runs if _finished(plan, run)]
        result.left_out = [run.name for run in plan.runs if run not in finished]
        arena = options.wants("arena") or (plan.output_dir("arena") / ARENA_RATINGS).is_file()
        closing = [with_progress_flags(step, options) for step in closing_steps(plan, finished, arena=arena)]
        for step in closing:
            if options.wants(step.kind) and OUTPUTS not in result.failed:
                _run_step(plan, step, result, options, stdout, stderr)
                _record_output(plan, result, step)
        progress.update(closing_total)
    result.seconds = time.monotonic() - started
    _summary(result, stderr)
    return result


def _run_step(
    plan: Plan, step: Step, result: PlanResult, options: RunOptions, stdout: IO[str], stderr: IO[str]
) -> None:
    owner = step.model or OUTPUTS
    try:
        state = step_state(step)
    except StepRefused as error:
        _fail(result, owner, str(error), options)
        result.steps.append(_outcome(step, "failed", error=str(error)))
        return
    if state.done:
        _say(stderr, f"{step.label}: done before ({state.note}); skipped")
        result.steps.append(_outcome(step, "done before"))
        return
    _say(stderr, f"{step.label}: {step.shell()}")
    env = {**os.environ, **step.env, PLAN_PATH_ENV: str(plan.path.resolve()), PLAN_SHA256_ENV: plan.sha256}
    env.setdefault("PYTHONUNBUFFERED", "1")
    child = run_child(step.command(), env, stdout, stderr)
    if child.returncode == 0:
        _say(stderr, f"{step.label}: finished in {format_duration(child.seconds)}")
        result.steps.append(_outcome(step, "ran", child.seconds))
        return
    reason = child.error or f"exited with status {child.returncode}"
    message = f"{step.label}: {reason}"
    result.steps.append(_outcome(step, "failed", child.seconds, message))
    _fail(result, owner, message, options)


def _fail(result: PlanResult, owner: str, message: str, options: RunOptions) -> None:
    if not options.continue_on_error:
        raise SysbenchError(message)
    result.failed.setdefault(owner, message)


def _finished(plan: Plan, run: RunSpec) -> bool:
    """Generated and judged (as the stages' own files say): a run the report, arena and explorer can show."""
    steps = [step for step in plan_steps(plan, runs=()) if step.run == run.name and step.kind in ("generate", "judge")]
    try:
        return all(step_state(step).done for step in steps)
    except SysbenchError:
        return False


def _record_output(plan: Plan, result: PlanResult, step: Step) -> None:
    if result.steps and result.steps[-1].status == "ran":
        setattr(result, step.kind, plan.output_dir(step.kind))


def _outcome(step: Step, status: str, seconds: float = 0.0, error: str | None = None) -> StepOutcome:
    return StepOutcome(step.kind, step.model, step.run, step.shell(), status, round(seconds, 2), error)


def _say(stream: IO[str], text: str) -> None:
    print(f"run: {text}", file=stream, flush=True)


def _summary(result: PlanResult, stream: IO[str]) -> None:
    counts = result.counts()
    shown = ", ".join(f"{count} {status}" for status, count in counts.items()) or "no step"
    _say(stream, f"{len(result.steps)} step(s): {shown}; {format_duration(result.seconds)}")
    for kind in ("report", "arena", "explore"):
        folder = getattr(result, kind)
        if folder is not None:
            _say(stream, f"{kind}: {folder}")
    if result.left_out:
        _say(stream, f"not in the report, arena or explorer (not finished): {', '.join(result.left_out)}")
    for owner, message in result.failed.items():
        _say(stream, f"failed: {owner}: {message}")
