"""The judge's estimate before a run is generated: its own dry run on a stand-in with every reply at ``max_tokens``.

The stand-in is a temporary run directory holding what ``generate`` would write for the
run's sessions (``sessions.json``, the ``generate`` section of the manifest with its history
mode, one record per answered turn) with a reply of ``max_tokens`` tokens as the judge's
estimator counts them (``judging.ledger.estimate_tokens``: four characters a token). The
judge's ``job_from_args`` and dry run then read it as they read a real run: its flags are
checked against the benchmark, and the prompts, requests, tokens and cost are the judge's
own arithmetic. Without ``max_tokens`` (the model's own default) there is no bound: the
replies are left empty and the estimate is labelled as a lower one.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.registry import save_run_sessions
from sysbench_gpu.core.records import GenerationRecord
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.generation import cli as generation_cli
from sysbench_gpu.generation.job import GenerationJob
from sysbench_gpu.generation.settings import STAGE as GENERATE
from sysbench_gpu.generation.settings import sampling_json
from sysbench_gpu.judging import cli as judging_cli
from sysbench_gpu.judging.job import estimate_judging
from sysbench_gpu.plans.steps import Step
from sysbench_gpu.plans.verbs import parse_step

FILLER = "word"  # one token to the judge's estimator (four characters)


class UpperBounds:
    """The judge estimates of a plan's runs before generation, each computed once per distinct setting."""

    def __init__(self, steps: Sequence[Step]) -> None:
        self._generate = {step.run: step for step in steps if step.kind == "generate"}
        self._cache: dict[tuple[Any, ...], tuple[dict[str, Any], bool]] = {}

    def generate_step(self, judge: Step) -> Step | None:
        return self._generate.get(judge.run)

    def judge_estimate(self, judge: Step) -> tuple[dict[str, Any], bool]:
        """The judge's dry run on the stand-in, and whether it is an upper bound (``max_tokens`` set)."""
        generate = self._generate[judge.run]
        job = generation_cli.job_from_args(parse_step(generate.argv))
        # Runs of different models with the same sessions, ablation, reply length and judge ask the same.
        settings = job.settings
        key = (
            job.dataset.sha256,
            tuple(sorted(job.wanted())),
            settings.history,
            settings.distractor_turns,
            settings.distractor_seed,
            settings.sampling.max_tokens,
            tuple(judge.argv[2:]),
        )
        if key not in self._cache:
            self._cache[key] = self._estimate(job, judge)
        return self._cache[key]

    def _estimate(self, job: GenerationJob, judge: Step) -> tuple[dict[str, Any], bool]:
        max_tokens = job.settings.sampling.max_tokens
        reply = FILLER * max_tokens if max_tokens else ""
        with tempfile.TemporaryDirectory(prefix="sysbench-plan-estimate-") as folder:
            run = stand_in(Path(folder) / "run", job, reply)
            args = parse_step(["judge", str(run.path), *judge.argv[2:]])
            report = estimate_judging(judging_cli.job_from_args(args))
        report["run"] = judge.argv[1]
        return report, bool(max_tokens)


def stand_in(path: Path, job: GenerationJob, reply: str) -> RunDir:
    """A run directory as ``generate`` would leave it, every reply ``reply``."""
    run = RunDir(path)
    path.mkdir(parents=True)
    wanted = job.wanted()
    sessions = [s for s in job.sessions if any((s.system_id, t.index) in wanted for t in s.turns)]
    save_run_sessions(run, sessions, job.dataset)
    settings = job.settings
    run.update_manifest(
        GENERATE,
        status="complete",
        model=settings.model,
        engine=settings.engine,
        benchmark=job.dataset.benchmark,
        sampling=sampling_json(settings.sampling),
        **settings.ablation(),
    )
    records = [
        GenerationRecord(
            system_id=session.system_id,
            turn=turn.index,
            user=turn.user,
            response=reply,
            history=settings.history,
            model=settings.model,
        )
        for session in sessions
        for turn in session.turns
        if (session.system_id, turn.index) in wanted
    ]
    run.generations.append(records)
    return run
