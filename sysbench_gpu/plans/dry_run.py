"""``run PLAN --dry-run``: the steps in order as single commands, which are done, and the judge's estimate.

Nothing is created, loaded or sent. Each judge step carries its dry run: the judge's own
(``judge --dry-run``) where the replies exist, else the same on a stand-in whose every reply
is ``max_tokens`` long (``plans.upper_bound``), labelled as an upper bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sysbench_gpu.plans.execute import RunOptions, check_options, model_steps, with_progress_flags
from sysbench_gpu.plans.plan import Plan
from sysbench_gpu.plans.status import StepState, step_state
from sysbench_gpu.plans.steps import closing_steps, plan_steps
from sysbench_gpu.plans.upper_bound import UpperBounds

ESTIMATE_FIELDS = ("requests", "estimated_prompt_tokens", "estimated_completion_tokens")


def describe_plan(plan: Plan, options: RunOptions) -> list[StepState]:
    """Every chosen step with its state, in the order ``run`` would take them (the closing steps over every run)."""
    check_options(plan, options)
    by_model = model_steps(plan, options)
    bounds = UpperBounds(plan_steps(plan, runs=()))
    states = [step_state(step, bounds, estimate=True) for steps in by_model.values() for step in steps]
    closing = [with_progress_flags(step, options) for step in closing_steps(plan, plan.runs)]
    return states + [step_state(step) for step in closing if options.wants(step.kind)]


def totals(states: Sequence[StepState]) -> dict[str, Any]:
    """The judge estimates summed: requests, tokens, cost (None when a model's price is unknown)."""
    total: dict[str, Any] = dict.fromkeys(ESTIMATE_FIELDS, 0)
    total["estimated_cost_usd"] = 0.0
    total["upper_bound"] = False
    total["unbounded_runs"] = []
    for state in states:
        report = state.estimate
        if report is None:
            continue
        for name in ESTIMATE_FIELDS:
            total[name] += report[name]
        cost = report.get("estimated_cost_usd")
        total["estimated_cost_usd"] = (
            None if cost is None or total["estimated_cost_usd"] is None else (total["estimated_cost_usd"] + cost)
        )
        total["upper_bound"] = total["upper_bound"] or state.estimate_kind == "upper bound"
        if state.estimate_kind == "no bound":
            total["unbounded_runs"].append(state.step.run)
    return total


def as_json(plan: Plan, states: Sequence[StepState]) -> dict[str, Any]:
    return {
        "plan": str(plan.path),
        "sha256": plan.sha256,
        "out": str(plan.out),
        "steps": [
            {
                "kind": state.step.kind,
                "model": state.step.model,
                "run": state.step.run,
                "command": state.step.shell(),
                "state": state.state,
                "note": state.note,
                "judge_estimate": dict(state.estimate) if state.estimate is not None else None,
                "judge_estimate_kind": state.estimate_kind,
            }
            for state in states
        ],
        "judge_total": totals(states),
    }


def format_dry_run(plan: Plan, states: Sequence[StepState]) -> str:
    lines = [
        f"dry run: {plan.path} (sha256 {plan.sha256[:12]}), {len(plan.runs)} run(s) of {len(plan.models)} model(s) "
        f"under {plan.out}; nothing is created, loaded or sent",
    ]
    width = len(str(len(states)))
    for number, state in enumerate(states, 1):
        note = f" ({state.note})" if state.note else ""
        lines.append(f"{number:>{width}}. [{state.state}]{note}")
        lines.append(f"{'':>{width}}  {state.step.shell()}")
        if state.estimate is not None:
            lines.append(f"{'':>{width}}  judge: {_estimate_line(state.estimate, state)}")
    total = totals(states)
    if any(state.estimate is not None for state in states):
        label = " (replies not yet generated counted at max_tokens: an upper bound)" if total["upper_bound"] else ""
        lines.append(f"judge, all runs: {_estimate_line(total, None)}{label}")
        if total["unbounded_runs"]:
            lines.append(
                "  no upper bound for " + ", ".join(total["unbounded_runs"]) + ": max_tokens is not set (the model's "
                "own default), so those replies count as empty"
            )
    return "\n".join(lines)


def _estimate_line(report: Mapping[str, Any], state: StepState | None) -> str:
    cost = report.get("estimated_cost_usd")
    money = "cost unknown for this model" if cost is None else f"${cost:.2f}"
    line = (
        f"{report['requests']} requests, ~{report['estimated_prompt_tokens']:,} prompt tokens, "
        f"~{report['estimated_completion_tokens']:,} output tokens, {money}"
    )
    if state is None:
        return line
    if state.estimate_kind == "upper bound":
        return line + " (before generation: every reply counted at max_tokens, an upper bound on the prompts)"
    if state.estimate_kind == "no bound":
        return line + " (replies counted empty: max_tokens is not set, so there is no upper bound)"
    return line + " (the judge's dry run on the replies there)"
