"""What the judge stage has to do on a SysBench run: one task per turn to ask, plus the records made without asking.

A SysBench turn becomes a :class:`JudgeTask` holding the rendered checklist prompt
(``plan_judging``); an MT-Eval turn becomes a 1-10 score task or a rule-scored record
(``benchmarks.mteval.scoring.plan_mteval``, not here). Turns without a response are recorded ``skipped``.
The history shown to the SysBench judge is the run's own: the model's earlier replies,
the references (``--history reference``), or nothing for a single-turn run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sysbench_gpu.benchmarks.judge_tasks import (
    JudgePlan,
    JudgeTask,
    PendingTurns,
    skipped_record,
)
from sysbench_gpu.benchmarks.judge_text import HistoryMessage
from sysbench_gpu.benchmarks.sysbench.judge_parse import ChecklistReply
from sysbench_gpu.benchmarks.sysbench.judge_prompt import JudgeTemplate, render_prompt
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.core.sessions import Session, select_sessions

SINGLE_TURN = "single-turn"  # the generate stage's --history single-turn: no earlier turns were shown


def build_history(
    session: Session, turn_index: int, generations: dict[tuple[int, int], GenerationRecord], mode: str
) -> list[HistoryMessage]:
    """The earlier rounds as the model saw them: its own replies, references in ``reference`` mode, none single-turn."""
    if mode == SINGLE_TURN:
        return []
    history: list[HistoryMessage] = []
    for earlier in session.turns[: turn_index - 1]:
        history.append(HistoryMessage("user", earlier.user))
        record = generations.get((session.system_id, earlier.index))
        generated = record.response if record is not None else None
        if mode == "reference" and earlier.reference is not None:
            reply = earlier.reference
        else:
            # Model history, or a reference the data lacks: what the model itself said.
            reply = generated if generated is not None else ""
        history.append(HistoryMessage("assistant", reply))
    return history


def plan_judging(
    sessions: Sequence[Session],
    generations: dict[tuple[int, int], GenerationRecord],
    judged: set[tuple[int, int]],
    template: JudgeTemplate,
    limit: int | None = None,
    judge_model: str | None = None,
    imported_history: str = "model",
    system_ids: Sequence[int] | None = None,
    run_history: str | None = None,
) -> JudgePlan:
    """SysBench tasks for the first ``limit`` sessions.

    ``imported_history``: the history mode of imported turns; ``run_history``: the
    generate stage's history mode from the manifest (``single-turn`` overrides what the
    records say, since a record's ``history`` names only model or reference).
    """
    chosen = select_sessions(sessions, system_ids, limit, source="sessions.json of this run")
    tasks: list[JudgeTask] = []
    skipped: list[JudgmentRecord] = []
    pending = PendingTurns(judged, generations)
    for session in chosen:
        for turn, record in pending.generated(session, session.turns):
            if record.response is None or record.status != "ok":
                skipped.append(skipped_record(record, judge_model, template.sha256))
                continue
            mode = imported_history if record.history == "upstream" else record.history
            if run_history == SINGLE_TURN:
                mode = SINGLE_TURN
            history = build_history(session, turn.index, generations, mode)
            prompt = render_prompt(template, session, turn.index, history, record.response)
            tasks.append(
                JudgeTask(
                    session.system_id,
                    turn.index,
                    prompt,
                    turn.constraints,
                    template.sha256,
                    reply=ChecklistReply(turn.constraints, template.language),
                )
            )
    return JudgePlan(
        tasks=tasks,
        skipped=skipped,
        already_judged=pending.already,
        not_generated=pending.not_generated,
        benchmark="sysbench",
    )


def imported_history_mode(run: RunDir) -> str:
    """How an imported run's model saw earlier turns (``import-upstream`` records it per run)."""
    section = run.read_manifest().get("stages", {}).get("import", {})
    mode = section.get("history")
    return mode if mode in ("model", "reference") else "model"


def generated_history_mode(manifest: Mapping[str, Any]) -> str | None:
    """The generate stage's ``history`` (model, reference, single-turn), or None when not recorded."""
    section = (manifest.get("stages") or {}).get("generate") or {}
    mode = section.get("history") if isinstance(section, dict) else None
    return mode if mode in ("model", "reference", SINGLE_TURN) else None
