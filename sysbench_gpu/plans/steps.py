"""A plan as steps: each one a verb's command line, exactly what a user would type (docs/plans.md).

Per run: ``generate``, ``judge``, ``metrics``, and ``attention`` where the plan asks for it;
then over every run ``report``, ``arena`` and ``explore``. A step is its verb's argv, so
the dry run prints it as the equivalent single command and the runner starts
``python -m sysbench_gpu ARGV`` (under ``torchrun`` for a multi-process attention step): the
run directory's manifest is the one the verb would have written by hand.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sysbench_gpu.plans.plan import Plan, RunSpec
from sysbench_gpu.plans.verbs import flag_of, has_flag, option_string

STEP_KINDS = ("generate", "judge", "metrics", "attention", "arena", "explore", "report")
RUN_STEPS = ("generate", "judge", "metrics", "attention")


@dataclass(frozen=True)
class Step:
    kind: str
    argv: tuple[str, ...]  # the verb and its flags: `sysbench-gpu ARGV`
    model: str | None = None  # the plan's model (None for the steps over every run)
    run: str | None = None
    nproc: int = 1  # > 1: under torchrun, one process per GPU
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        if not self.model:
            return f"step {self.kind}"
        # An ablation's run is named beside its model: two runs of one model are told apart.
        run = f" (run {self.run})" if self.run and self.run != self.model else ""
        return f"model {self.model}{run}, step {self.kind}"

    def command(self) -> list[str]:
        """What the runner starts: this interpreter, as ``sysbench-gpu`` or ``torchrun`` would."""
        if self.nproc > 1:
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            return [*launcher, "--nproc-per-node", str(self.nproc), "-m", "sysbench_gpu", *self.argv]
        return [sys.executable, "-m", "sysbench_gpu", *self.argv]

    def shell(self) -> str:
        """The equivalent single command, as a user would type it."""
        env = " ".join(f"{name}={shlex.quote(value)}" for name, value in self.env.items())
        if self.nproc > 1:
            words = ["torchrun", "--standalone", "--nproc-per-node", str(self.nproc), "-m", "sysbench_gpu"]
        else:
            words = ["sysbench-gpu"]
        line = shlex.join([*words, *self.argv])
        return f"{env} {line}" if env else line


def flags(verb: str, values: Mapping[str, Any], rename: Mapping[str, str] | None = None) -> list[str]:
    """``--flag value`` for each plan key, named as the verb names the flag; a switch for ``true``."""
    out: list[str] = []
    for name, value in values.items():
        dest = (rename or {}).get(name, name)
        action = flag_of(verb, dest)
        if action is None:
            raise KeyError(f"{verb} has no flag for {dest!r}")
        option = option_string(action)
        if value is True:
            out.append(option)
        elif value is False or value is None:
            continue
        elif isinstance(value, dict):
            out += [option, json.dumps(value, ensure_ascii=False, sort_keys=True)]
        else:
            out += [option, str(value)]
    return out


def _pick(values: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
    return {name: values[name] for name in names if name in values}


# ------------------------------------------------------------------ per run


def generate_step(plan: Plan, run: RunSpec) -> Step:
    model = plan.model(run.model)
    argv = [
        "generate",
        "--data",
        run.data or plan.data["path"],
        "--model",
        model.model,
        "--engine",
        model.engine,
        "--out",
        str(plan.run_dir(run)),
    ]
    argv += flags("generate", _pick(plan.data, ("benchmark", "limit", "sessions", "system_message", "task")))
    if run.history != "model":
        argv += ["--history", run.history]
    ablation = {"distractor_turns": run.distractor_turns or None, "distractor_seed": run.distractor_seed}
    argv += flags("generate", {**ablation, "skip_missing_reference": run.skip_missing_reference})
    if model.on_overflow is not None:
        argv += ["--on-overflow", model.on_overflow]
    argv += flags("generate", model.sampling)
    argv += flags("generate", model.options)
    return Step("generate", tuple(argv), model.name, run.name, env=model.env)


def judge_argv(judge: Mapping[str, Any], verb: str = "judge") -> list[str]:
    """The judge flags of ``judge`` (or of ``arena --by judge``): backend, model, options as --engine-option."""
    argv: list[str] = []
    if judge.get("backend"):
        argv += ["--judge", judge["backend"], "--judge-model", judge["model"]]
    rest = {k: v for k, v in judge.items() if k not in ("backend", "model", "options", "mteval_templates")}
    if verb == "arena":
        # The arena's --seed is its bootstrap's (and its judge's); its template is a pairwise one of its own.
        rest = {k: v for k, v in rest.items() if has_flag("arena", k) and k not in ("seed", "template")}
    argv += flags(verb, rest)
    if verb == "judge":
        for kind, file in judge.get("mteval_templates", {}).items():
            argv += ["--mteval-template", f"{kind}={file}"]
    for name, value in judge.get("options", {}).items():
        argv += ["--engine-option", f"{name}={json.dumps(value, ensure_ascii=False)}"]
    return argv


def judge_step(plan: Plan, run: RunSpec) -> Step:
    model = plan.model(run.model)
    argv = ["judge", str(plan.run_dir(run)), *judge_argv(model.judge)]
    return Step("judge", tuple(argv), model.name, run.name, env=model.env)


def metrics_step(plan: Plan, run: RunSpec) -> Step:
    return Step("metrics", ("metrics", str(plan.run_dir(run))), run.model, run.name)


def attention_runs(plan: Plan) -> list[RunSpec]:
    """The runs measured by ``attention``: each model's plain run, or all its runs (``runs = "all"``)."""
    chosen = []
    for model in plan.models:
        if model.attention is None:
            continue
        every = model.attention.get("runs", "plain") == "all"
        chosen += [run for run in model.runs if every or run.ablation is None] or list(model.runs[:1])
    return chosen


def attention_step(plan: Plan, run: RunSpec) -> Step:
    model = plan.model(run.model)
    options = dict(model.attention or {})
    nproc = options.pop("nproc", 1)
    options.pop("runs", None)
    figures = options.pop("figures", True)
    argv = ["attention", str(plan.run_dir(run)), "--model", model.model, "--out", str(plan.attention_dir(run))]
    argv += flags("attention", options)
    if not figures:
        argv.append("--no-figures")
    return Step("attention", tuple(argv), model.name, run.name, nproc=nproc, env=model.env)


# ------------------------------------------------------------------ over every run


def report_step(plan: Plan, runs: Sequence[RunSpec]) -> Step:
    options = dict(plan.report or {})
    figures = options.pop("figures", True)
    gt_pairs = options.pop("gt_pairs", False)
    argv = ["report", *(str(plan.run_dir(run)) for run in runs), "--out", str(plan.output_dir("report"))]
    if gt_pairs:
        names = {run.name for run in runs}
        for run in runs:
            plain = plan.model(run.model).runs[0]
            if run.history == "reference" and plain.ablation is None and plain.name in names:
                argv += ["--gt-pair", f"{plan.run_dir(run)}={plan.run_dir(plain)}"]
    argv += flags("report", options)
    if not figures:
        argv.append("--no-figures")
    return Step("report", tuple(argv))


def arena_runs(plan: Plan, runs: Sequence[RunSpec]) -> list[RunSpec]:
    if (plan.arena or {}).get("runs", "all") == "plain":
        return [run for run in runs if run.ablation is None]
    return list(runs)


def arena_step(plan: Plan, runs: Sequence[RunSpec]) -> Step:
    options = dict(plan.arena or {})
    figures = options.pop("figures", True)
    options.pop("runs", None)
    baseline = options.pop("baseline", None)
    arena = arena_runs(plan, runs)
    argv = ["arena", *(str(plan.run_dir(run)) for run in arena), "--out", str(plan.output_dir("arena"))]
    if baseline is not None:
        argv += ["--baseline", str(plan.run_dir(next(run for run in plan.runs if run.name == baseline)))]
    by_judge = options.get("by") == "judge"
    argv += flags("arena", options)
    if by_judge:
        # The plan's judge decides the battles (the first model's, where models override it).
        judge = {k: v for k, v in plan.models[0].judge.items() if k != "max_tokens"}
        argv += judge_argv(judge, verb="arena")
    if not figures:
        argv.append("--no-figures")
    return Step("arena", tuple(argv))


def explore_step(plan: Plan, runs: Sequence[RunSpec], attention: Sequence[RunSpec], arena: bool) -> Step:
    argv = ["explore", *(str(plan.run_dir(run)) for run in runs), "--out", str(plan.output_dir("explore"))]
    if attention:
        argv += ["--attention", *(str(plan.attention_dir(run)) for run in attention)]
    if arena:
        argv += ["--arena", str(plan.output_dir("arena"))]
    argv += flags("explore", plan.explore or {})
    return Step("explore", tuple(argv))


def plan_steps(plan: Plan, runs: Sequence[RunSpec] | None = None) -> list[Step]:
    """Every step in order: each model's runs one after another, then arena, explore and report over the runs.

    The explorer is built before the report so that the report links to it (``report.explorer_link``), and
    after the arena so that it shows the battles. ``runs``: the runs the closing steps cover (default: all).
    """
    steps: list[Step] = []
    measured = attention_runs(plan)
    for run in plan.runs:
        steps.append(generate_step(plan, run))
        steps.append(judge_step(plan, run))
        if plan.metrics:
            steps.append(metrics_step(plan, run))
        if run in measured:
            steps.append(attention_step(plan, run))
    steps += closing_steps(plan, plan.runs if runs is None else runs)
    return steps


def closing_steps(plan: Plan, runs: Sequence[RunSpec], *, arena: bool = True) -> list[Step]:
    """arena, explore and report over ``runs`` (those that finished); an arena needs two runs.

    ``arena``: whether the explorer shows the arena (False when it is neither run now nor there from before).
    """
    if not runs:
        return []
    steps: list[Step] = []
    has_arena = plan.arena is not None and len(arena_runs(plan, runs)) >= 2
    if has_arena:
        steps.append(arena_step(plan, runs))
    if plan.explore is not None:
        measured = [run for run in attention_runs(plan) if run in runs]
        steps.append(explore_step(plan, runs, measured, has_arena and arena))
    if plan.report is not None:
        steps.append(report_step(plan, runs))
    return steps


def step_path(step: Step) -> Path | None:
    """The folder a step writes (a run directory, an attention folder or an output folder)."""
    argv = list(step.argv)
    if step.kind in ("judge", "metrics"):
        return Path(argv[1])
    return Path(argv[argv.index("--out") + 1]) if "--out" in argv else None
