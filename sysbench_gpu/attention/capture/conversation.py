"""The teacher-forced conversations the attention stage measures: those generation used.

A run's ``generate`` section (manifest) says how its turns were built; the attention stage
rebuilds the same conversations, with each turn's reply in place:

- SysBench, model or reference history: one forward, the system message, then every
  turn with its reply (the run's generations or the references);
- ``--distractor-turns K``: the K exchanges each session got (``distractors.json``) sit
  between the system message and user turn 1, as a prefix that belongs to no turn;
- ``--history single-turn``: every turn is its own conversation (system message, that
  user turn, its reply), so one forward per turn; the stored arrays of a session lay the
  forwards end to end (``concat_forwards``);
- MT-Eval: context turns carry their given ``sys``; answered turns the run's replies
  (or ``sys`` with ``--replies reference``); the conversation ends with the last answered
  turn that has a reply (later context turns were never shown to the model).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sysbench_gpu.attention.capture.segments import TurnText
from sysbench_gpu.core.ablation_files import (
    DISTRACTORS_FILE,
    SINGLE_TURN,
    Exchange,
    read_distractors,
)
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.sessions import Session

DISTRACTOR_INDEX = 0  # TurnText.index of a distractor exchange (turns count from 1)


@dataclass(frozen=True)
class Forward:
    """One teacher-forced forward: system message, distractor exchanges, turns with their replies."""

    system_prompt: str
    prefix: tuple[TurnText, ...]
    turns: tuple[TurnText, ...]


@dataclass(frozen=True)
class RunConversations:
    """How a run built its conversations, read from its manifest and ``distractors.json``."""

    history: str = "model"
    distractor_turns: int = 0
    distractors: Mapping[int, tuple[Exchange, ...]] = field(default_factory=dict)

    @classmethod
    def from_run(cls, run: Any) -> RunConversations:
        """From a ``RunDir``; a run without a generate section (imported) is plain model history."""
        section = run.stage_section("generate")
        history = section.get("history") or "model"
        count = section.get("distractor_turns") or 0
        distractors: dict[int, tuple[Exchange, ...]] = {}
        if count:
            stored, distractors = read_distractors(run.path / DISTRACTORS_FILE)
            if stored != count:
                raise SysbenchError(
                    f"{run.path / DISTRACTORS_FILE}: field 'distractor_turns' is {stored}, the manifest says {count}"
                )
        return cls(history=history, distractor_turns=count, distractors=distractors)

    @property
    def single_turn(self) -> bool:
        return self.history == SINGLE_TURN

    def prefix(self, session: Session) -> tuple[TurnText, ...]:
        if not self.distractor_turns:
            return ()
        if session.system_id not in self.distractors:
            raise SysbenchError(f"{DISTRACTORS_FILE}: session {session.system_id}: no distractor exchanges recorded")
        return tuple(TurnText(DISTRACTOR_INDEX, e.user, e.reply) for e in self.distractors[session.system_id])

    def forwards(
        self, session: Session, replies: str, generations: Mapping[tuple[int, int], Any]
    ) -> tuple[list[Forward], str | None]:
        """The forwards of one session, and why turns are missing (None when every turn is measured)."""
        if not session.system_prompt:
            raise SysbenchError(
                f"session {session.system_id}: the run sends no system message (--system-message ''); "
                "there is no system span to measure"
            )
        prefix = self.prefix(session)
        if self.single_turn:
            measured, missing = [], []
            for turn in session.turns:
                reply, why = _reply(session, turn, replies, generations)
                if reply is None:
                    missing.append(f"turn {turn.index}: {why}")
                else:
                    measured.append(Forward(session.system_prompt, prefix, (TurnText(turn.index, turn.user, reply),)))
            return measured, "; ".join(missing) or None
        turns, stop = conversation_turns(session, replies, generations)
        return ([Forward(session.system_prompt, prefix, tuple(turns))] if turns else []), stop


def _reply(
    session: Session, turn: Any, replies: str, generations: Mapping[tuple[int, int], Any]
) -> tuple[str | None, str]:
    """A turn's reply in the conversation, or None and why not."""
    if not turn.answered:
        return turn.reference or "", ""  # an MT-Eval context turn: its sys, as generation gave it
    if replies == "generations":
        record = generations.get((session.system_id, turn.index))
        if record is None:
            return None, "no generation"
        return record.response, f"generation status {record.status!r}"
    return turn.reference, "no reference reply"


def conversation_turns(
    session: Session, replies: str, generations: Mapping[tuple[int, int], Any]
) -> tuple[list[TurnText], str | None]:
    """Leading turns that have a reply, and why the conversation stops early (None if complete).

    Context turns after the last answered turn kept are dropped: the model never saw them.
    """
    turns: list[TurnText] = []
    stop = None
    for turn in session.turns:
        reply, why = _reply(session, turn, replies, generations)
        if reply is None:
            stop = f"turn {turn.index}: {why}"
            break
        turns.append(TurnText(index=turn.index, user=turn.user, reply=reply))
    while turns and not session.turn(turns[-1].index).answered:
        turns.pop()
    return turns, stop


def concat_forwards(parts: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The arrays of several forwards of one session laid end to end on the token axis.

    Token spans (users, replies, turns, distractors) are shifted by each forward's start;
    ``spans``/``system`` stay those of the first forward (what single-forward readers
    expect), and ``forwards`` ([F, 2] token ranges) and ``forward_spans`` ([F, 2, 2]:
    lead and system of each forward) say where every forward and its system text are.
    """
    if len(parts) == 1:
        return dict(parts[0])
    starts = np.cumsum([0] + [len(part["token_ids"]) for part in parts])
    shifted = {
        name: np.concatenate(
            [np.asarray(part[name]).reshape(-1, 2) + start for part, start in zip(parts, starts, strict=False)]
        )
        for name in ("users", "replies", "turns", "distractors")
        if name in parts[0]
    }
    out = dict(parts[0])
    out.update(shifted)
    out["token_ids"] = np.concatenate([part["token_ids"] for part in parts])
    out["shares"] = np.concatenate([part["shares"] for part in parts], axis=1)  # [L, T, spans]
    if "per_head" in parts[0]:
        out["per_head"] = np.concatenate([part["per_head"] for part in parts], axis=2)  # [L, H, T, spans]
    out["turn_numbers"] = np.concatenate([part["turn_numbers"] for part in parts])
    out["forwards"] = np.stack([starts[:-1], starts[1:]], axis=1).astype(np.int64)
    out["forward_spans"] = np.stack(
        [np.asarray(part["spans"]) + start for part, start in zip(parts, starts, strict=False)]
    )
    return out
