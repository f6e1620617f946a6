"""What a judge stage asks: tasks, plans, pending turns; shared by every benchmark's judging."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord, Verdict
from sysbench_gpu.core.sessions import Constraint, Session, Turn

NEEDS_JUDGE = "--judge {openai,vllm,hf} and --judge-model NAME"


@dataclass(frozen=True)
class ReplyReading:
    """A judge reply as read: verdicts per checklist item or a score, the reasoning, or why it is invalid."""

    ok: bool
    verdicts: Mapping[str, Verdict] = field(default_factory=dict)
    reasoning: str | None = None
    score: float | None = None
    error: str | None = None  # why the reply is invalid, for logs and the unparsed record
    repaired: bool = False  # the JSON needed the documented repair


class ReplyFormat(Protocol):
    """What a judge must answer to one task and how the answer is read; the benchmark that plans the task gives it.

    Replies are read as text (JSON found and checked), never evaluated.
    """

    def schema(self, max_reasoning_chars: int | None) -> dict[str, Any]:
        """The JSON schema of a valid reply, for guided decoding."""
        ...

    def read(self, text: str | None) -> ReplyReading: ...


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
    # How the reply is asked for and read (not part of the task's identity).
    reply: ReplyFormat | None = field(default=None, compare=False, repr=False)

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
    ruled: list[JudgmentRecord] = field(default_factory=list)  # turns scored by a rule, no judge needed
    benchmark: str = ""  # the registered name of the run's benchmark
    judge_tasks: tuple[str, ...] = ()  # tasks whose turns need the LLM judge (MT-Eval)
    template_sha256: str | None = None  # the one template every task was rendered from, where there is one
    options: Mapping[str, Any] = field(default_factory=dict)  # the benchmark's judge options, for the manifest

    def finished(self) -> list[JudgmentRecord]:
        """Records made without asking anyone: skipped turns, then rule-scored ones."""
        return [*self.skipped, *self.ruled]


@dataclass
class PendingTurns:
    """Sorts turns into judged already, not generated, or generated (yielded with their record), counting the first
    two.
    """

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
