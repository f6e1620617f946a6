"""Whether a step is done, read from the files its stage writes, and what its judge would ask.

A step is done when a rerun of its verb would add nothing: ``generate`` when the stage
finished and every wanted record is stored, ``judge`` when every generated turn has its
record, ``attention`` when every session and arm is measured and analysed. The checks are
the stages' own (``generation.job``, ``judging.job``, ``attention.files.store``), and so are
the refusals: a run directory made with other settings is refused as the verb would refuse
it, in a line that names the model and the step. ``metrics`` and the steps over every run
only read, and run every time.

The judge's estimate is its dry run (``judge --dry-run``) where the replies exist. Before
generation it is the same dry run on a stand-in of the run whose every reply is
``max_tokens`` tokens long (``plans.upper_bound``): an upper bound, labelled as one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sysbench_gpu.attention.files.store import check_settings, session_path, skip_path
from sysbench_gpu.benchmarks.registry import load_run_sessions
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.core.sessions import parse_session_ids, select_sessions
from sysbench_gpu.generation import cli as generation_cli
from sysbench_gpu.judging import cli as judging_cli
from sysbench_gpu.judging.job import estimate_judging, judging_progress
from sysbench_gpu.plans.steps import Step
from sysbench_gpu.plans.upper_bound import UpperBounds
from sysbench_gpu.plans.verbs import parse_step

ANALYSIS = "analysis.json"


class StepRefused(SysbenchError):
    """A step its verb would refuse (a changed plan against an existing run directory, a bad flag)."""


@dataclass(frozen=True)
class StepState:
    step: Step
    state: str  # "done" | "to do" | "half done" | "every time" (reads the runs; cheap, and always current)
    note: str = ""
    estimate: Mapping[str, Any] | None = None  # the judge's dry run (judge steps)
    # "dry run" (on the replies there), "upper bound" (every reply at max_tokens), "no bound" (max_tokens unset)
    estimate_kind: str | None = None

    @property
    def done(self) -> bool:
        return self.state == "done"


def refused(step: Step, error: SysbenchError) -> StepRefused:
    return StepRefused(f"{step.label}: {' '.join(str(error).split())}")


def step_state(step: Step, bounds: UpperBounds | None = None, *, estimate: bool = False) -> StepState:
    """The state of ``step`` now; a step its verb would refuse raises :class:`StepRefused` naming it."""
    try:
        if step.kind == "generate":
            return _generate_state(step)
        if step.kind == "judge":
            return _judge_state(step, bounds, estimate)
        if step.kind == "attention":
            return _attention_state(step)
        parse_step(step.argv)  # its flags, as its verb parses them
        return StepState(step, "every time", "reads the runs")
    except StepRefused:
        raise
    except SysbenchError as error:
        raise refused(step, error) from None


def _generate_state(step: Step) -> StepState:
    job = generation_cli.job_from_args(parse_step(step.argv))
    wanted, stored = job.wanted(), job.stored()  # each read once
    if job.complete(wanted, stored):
        return StepState(step, "done", f"{len(wanted)} records there")
    if stored:
        return StepState(step, "half done", f"{len(stored)} of {len(wanted)} records; resumes")
    return StepState(step, "to do", f"{len(wanted)} records to generate")


def _judge_state(step: Step, bounds: UpperBounds | None, estimate: bool) -> StepState:
    args = parse_step(step.argv)
    run = RunDir(args.run_dir)
    if not run.generations.path.exists() or not run.manifest_path.is_file():
        # Not generated yet: the verb's checks and its dry run on a stand-in of the run.
        return _before_generation(step, bounds, "to do")
    job = judging_cli.job_from_args(args)
    complete, left = judging_progress(job)  # one dry run: whether it is done, how many are judged, the estimate
    if complete:
        return StepState(step, "done", "every generated turn judged")
    judged = left["turns_already_judged"] if left is not None else 0
    state, note = ("half done", f"{judged} judged; resumes") if judged else ("to do", "")
    if bounds is not None and not _generation_complete(step, bounds):
        return _before_generation(step, bounds, state)
    if not estimate:
        return StepState(step, state, note)
    report = left if left is not None else estimate_judging(job)
    return StepState(step, state, note, report, "dry run")


def _before_generation(step: Step, bounds: UpperBounds | None, state: str) -> StepState:
    if bounds is None:
        return StepState(step, state, "after generation")
    report, bounded = bounds.judge_estimate(step)
    return StepState(step, state, "after generation", report, "upper bound" if bounded else "no bound")


def _generation_complete(step: Step, bounds: UpperBounds) -> bool:
    generate = bounds.generate_step(step)
    return generate is None or generation_cli.job_from_args(parse_step(generate.argv)).complete()


def _attention_state(step: Step) -> StepState:
    args = parse_step(step.argv)
    out, run = Path(args.out), RunDir(args.run_dir)
    if not (out / "manifest.json").is_file() or not run.sessions_path.is_file():
        return StepState(step, "to do")
    # The settings the verb records and refuses to change, checked by its own function (nothing written).
    wanted = {
        "run_dir": str(Path(args.run_dir).resolve()),
        "model": args.model,
        "layers_spec": args.layers,
        "store_dtype": args.store_dtype,
    }
    check_settings(out, wanted, write=False)
    sessions = select_sessions(
        load_run_sessions(run), parse_session_ids(args.sessions), args.limit, source=run.sessions_path
    )
    conditions = ("system", "control") if args.control or args.knockout else ("system",)
    missing = [
        (s.system_id, c)
        for s in sessions
        for c in conditions
        if not session_path(out, s.system_id, c).exists() and not skip_path(out, s.system_id, c).exists()
    ]
    finished = (out / ANALYSIS).is_file() and (not args.knockout or (out / "knockout.jsonl").is_file())
    if not missing and finished:
        return StepState(step, "done", f"{len(sessions)} sessions x {len(conditions)} arms")
    measured = len(sessions) * len(conditions) - len(missing)
    if measured:
        return StepState(step, "half done", f"{measured} of {len(sessions) * len(conditions)} measured; resumes")
    return StepState(step, "to do")
