"""Helpers shared by the MT-Eval stage tests (no tests here): run directories with hand-written replies."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.registry import load_dataset, save_run_sessions
from sysbench_gpu.core.records import GenerationRecord
from sysbench_gpu.core.rundir import RunDir

ReplyOf = Callable[[Any, int], "str | None"]  # (session, turn index) -> reply, None for a skipped turn


def marked(kind: str = "good") -> ReplyOf:
    """Replies carrying ``ANSWER <kind> s<id> t<turn>`` (test_judge_support.marker reads it back)."""
    return lambda session, turn: f"ANSWER {kind} s{session.system_id} t{turn}"


def make_mteval_run(
    path: Path,
    data_file: Path,
    system_ids: Iterable[int] | None,
    reply_of: ReplyOf,
    *,
    history: str = "model",
    model: str = "fake-model",
    label: str | None = None,
    answered_only: Iterable[tuple[int, int]] | None = None,
) -> RunDir:
    """An MT-Eval run directory as `generate` leaves it: snapshot, one record per answered turn, manifest.

    ``answered_only``: generate only these (system_id, turn) keys (an unfinished run).
    """
    dataset = load_dataset(data_file)
    sessions = dataset.select(system_ids=list(system_ids)) if system_ids is not None else list(dataset.sessions)
    run = RunDir(path)
    path.mkdir(parents=True, exist_ok=True)
    run.update_manifest(label=label or path.name, model=model)
    save_run_sessions(run, sessions, dataset)
    only = set(answered_only) if answered_only is not None else None
    records = []
    for session in sessions:
        for turn in session.turns:
            if not turn.answered or (only is not None and (session.system_id, turn.index) not in only):
                continue
            reply = reply_of(session, turn.index)
            records.append(
                GenerationRecord(
                    system_id=session.system_id,
                    turn=turn.index,
                    user=turn.user,
                    response=reply,
                    history=history,
                    status="ok" if reply is not None else "skipped",
                    overflow=None if reply is not None else "skipped",
                    model=model,
                )
            )
    run.generations.append(records, existing=set())
    run.update_manifest(
        stage="generate",
        status="complete",
        model=model,
        benchmark="mteval",
        history=history,
        distractor_turns=0,
        distractor_seed=None,
        system_message=sessions[0].system_prompt,
        task=sessions[0].task,
    )
    return run


class ScoreMarkerJudge:
    """A local judge engine (batched like hf/vllm) that gives the score a reply names: ``... SCORE7 ...`` -> 7."""

    name = "fake"
    is_primary = True

    def __init__(self) -> None:
        self.calls = 0

    def chat(self, conversations, sampling):
        import json
        import re

        from sysbench_gpu.engines.base import Completion

        self.calls += 1
        out = []
        for conversation in conversations:
            score = int(re.findall(r"SCORE(\d+)", conversation[-1]["content"])[-1])
            out.append(
                Completion(json.dumps({"rationale": "as marked", "score": score}), 100, 10, finish_reason="stop")
            )
        return out

    def count_prompt_tokens(self, conversation):
        return 100

    def context_length(self):
        return None

    def describe(self):
        return {"engine": "fake"}

    def close(self):
        pass


def judge_with_markers(run: RunDir) -> None:
    """Score a run's 1-10 turns with ScoreMarkerJudge (hf-style rounds, no cache), its rule turns by rule."""
    from sysbench_gpu.benchmarks.sysbench.judge_prompt import load_template
    from sysbench_gpu.judging.rounds import JudgeSettings
    from sysbench_gpu.judging.stage import judge_run

    settings = JudgeSettings(backend="hf", model="marker-judge", template=load_template("zh"), cache_dir=None)
    judge_run(run, settings, ScoreMarkerJudge, show_progress=False)
