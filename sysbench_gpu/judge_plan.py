"""What the judge stage has to do: one task per turn to ask, plus the records made without asking.

A SysBench turn becomes a :class:`JudgeTask` holding the rendered checklist prompt
(``plan_judging``); an MT-Eval turn becomes a 1-10 score task or a rule-scored record
(``mteval.scoring.plan_mteval``). Turns without a response are recorded ``skipped``.
The history shown to the SysBench judge is the run's own: the model's earlier replies,
the references (``--history reference``), or nothing for a single-turn run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

from sysbench_gpu.data import Constraint, Session, Turn, select_sessions
from sysbench_gpu.engines.base import ChatMessage
from sysbench_gpu.judge_prompt import HistoryMessage, JudgeTemplate, render_prompt
from sysbench_gpu.runstore import GenerationRecord, JudgmentRecord, RunDir

SINGLE_TURN = "single-turn"  # the generate stage's --history single-turn: no earlier turns were shown


@dataclass(frozen=True)
class JudgeTask:
    """One (session, turn) to ask the judge about, with its rendered prompt.

    ``score_kind`` is None for a SysBench checklist (the reply holds a verdict per
    constraint) and names the MT-Eval template (refinement, expansion, follow-up) for a
    1-10 score. ``template_sha256`` is the hash of the template the prompt came from.
    """

    system_id: int
    turn: int
    prompt: str
    constraints: tuple[Constraint, ...]
    template_sha256: str
    score_kind: str | None = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.system_id, self.turn)

    @property
    def label(self) -> str:
        return f"session {self.system_id}, turn {self.turn}"

    @property
    def numbers(self) -> tuple[int, ...]:
        return tuple(c.id for c in self.constraints)

    @property
    def schema_group(self) -> tuple[Any, ...]:
        """Tasks of one group share a guided-decoding schema (so one engine call)."""
        return ("score",) if self.score_kind else self.numbers

    def messages(self) -> list[ChatMessage]:
        return [{"role": "user", "content": self.prompt}]


@dataclass
class JudgePlan:
    tasks: list[JudgeTask]
    skipped: list[JudgmentRecord]  # turns without a response, recorded as such
    already_judged: int
    not_generated: int  # turns of the chosen sessions with no generation record yet
    ruled: list[JudgmentRecord] = field(default_factory=list)  # MT-Eval turns scored by a rule, no judge needed
    benchmark: str = "sysbench"
    judge_tasks: tuple[str, ...] = ()  # MT-Eval tasks whose turns need the LLM judge

    def finished(self) -> list[JudgmentRecord]:
        """Records made without asking anyone: skipped turns, then rule-scored ones."""
        return [*self.skipped, *self.ruled]


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


@dataclass
class PendingTurns:
    """Sorts turns into judged already, not generated, or generated (yielded with their record), counting the first two."""

    judged: set[tuple[int, int]]
    generations: Mapping[tuple[int, int], GenerationRecord]
    already: int = 0
    not_generated: int = 0

    def generated(self, session: Session, turns: Iterable[Turn]) -> Iterator[tuple[Turn, GenerationRecord]]:
        for turn in turns:
            key = (session.system_id, turn.index)
            if key in self.judged:
                self.already += 1
            elif (record := self.generations.get(key)) is None:
                self.not_generated += 1
            else:
                yield turn, record


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
            tasks.append(JudgeTask(session.system_id, turn.index, prompt, turn.constraints, template.sha256))
    return JudgePlan(tasks=tasks, skipped=skipped, already_judged=pending.already, not_generated=pending.not_generated)


def skipped_record(
    record: GenerationRecord, judge_model: str | None, template_hash: str | None, scorer: str | None = None
) -> JudgmentRecord:
    """The record of a turn that has no response: never sent, never a pass."""
    return JudgmentRecord(
        system_id=record.system_id,
        turn=record.turn,
        verdicts={},
        parse_status="skipped",
        judge_model=judge_model,
        template_hash=template_hash,
        attempts=0,
        extra={"reason": f"generation status {record.status!r}, overflow {record.overflow!r}"},
        scorer=scorer,
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
