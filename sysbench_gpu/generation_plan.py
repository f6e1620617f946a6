"""What a generate run answers, in which engine calls, and the messages of every turn.

One object, ``GenerationPlan``, decides for a run (benchmark, history mode, distractor
exchanges) which turns get a reply, how they are grouped into turn-synchronous engine
calls, and the conversation each one sees. The attention stage rebuilds the same
conversations from it (``attn_conversation``).

- SysBench, ``model`` history: call *t* holds turn *t* of every session, each with the
  model's own earlier replies; ``reference``: one call, references as history;
  ``single-turn``: one call, every turn sees the system message and its own user message.
  Distractor exchanges (``ablations``) go between the system message and user turn 1.
- MT-Eval: only answered turns (``do_inference``) get a reply. ``model`` history: call *k*
  holds the *k*-th answered turn of every dialogue; a context turn carries its given
  ``sys``. ``reference``: one call (MT-Eval's gold-context setting).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from sysbench_gpu.ablations import (
    SINGLE_TURN,
    Exchange,
    ablation_conversation,
    choose_distractors,
    distractor_pool,
)
from sysbench_gpu.data import Dataset, Session
from sysbench_gpu.engines.base import ChatMessage
from sysbench_gpu.errors import SysbenchError

log = logging.getLogger(__name__)

HISTORY_MODES = ("model", "reference", SINGLE_TURN)
ALL_IN_ONE_CALL = "all"  # the stats label of a run's single engine call

Key = tuple[int, int]


@dataclass(frozen=True)
class GenerationPlan:
    """The conversations of one run. ``distractor_turns`` exchanges per session come from ``pool`` (the whole file)."""

    benchmark: str  # "sysbench" | "mteval"
    history: str  # one of HISTORY_MODES
    distractor_turns: int = 0
    distractor_seed: int = 0
    pool: Mapping[int, Sequence[Exchange]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.history not in HISTORY_MODES:
            raise SysbenchError(f"--history must be one of {', '.join(HISTORY_MODES)}, got {self.history!r}")
        if self.benchmark == "mteval" and self.history == SINGLE_TURN:
            raise SysbenchError(
                "--history single-turn is a SysBench ablation; MT-Eval's single-turn setting is its *_single files"
            )
        if self.benchmark == "mteval" and self.distractor_turns:
            raise SysbenchError(
                "--distractor-turns is a SysBench ablation; MT-Eval's irrelevant-context setting is its "
                "refinement_ablation_irrelevant-* files"
            )
        if self.distractor_turns < 0:
            raise SysbenchError(f"--distractor-turns must be 0 or more, got {self.distractor_turns}")

    @classmethod
    def for_dataset(cls, dataset: Dataset, history: str, distractor_turns: int = 0, distractor_seed: int = 0) -> "GenerationPlan":
        """The plan of a run on ``dataset``; distractors are drawn from every session of the file."""
        pool = distractor_pool(dataset.sessions) if distractor_turns and dataset.benchmark == "sysbench" else {}
        return cls(dataset.benchmark, history, distractor_turns, distractor_seed, pool)

    # -- which turns, in which calls ------------------------------------------------
    @property
    def one_call(self) -> bool:
        """No turn depends on another turn's reply: the whole run is one engine call."""
        return self.history != "model"

    @staticmethod
    def answered(session: Session) -> list[int]:
        """The turns that get a reply: every SysBench turn, MT-Eval's ``do_inference`` turns."""
        return [turn.index for turn in session.turns if turn.answered]

    def calls(self, sessions: Sequence[Session]) -> list[tuple[int | str, list[Key]]]:
        """``(label, keys)`` of each engine call, in order.

        With model history call *k* (label *k*) holds the *k*-th answered turn of every
        session that has one, so it needs only replies of earlier calls (SysBench: *k* is
        the turn number). Otherwise one call, label ``"all"``.
        """
        if self.one_call:
            return [(ALL_IN_ONE_CALL, [(s.system_id, turn) for s in sessions for turn in self.answered(s)])]
        calls: list[tuple[int | str, list[Key]]] = []
        for session in sessions:
            for k, turn in enumerate(self.answered(session), start=1):
                while len(calls) < k:
                    calls.append((len(calls) + 1, []))
                calls[k - 1][1].append((session.system_id, turn))
        return calls

    def depends_on(self, session: Session, turn: int) -> list[int]:
        """Earlier turns whose reply from this run goes into ``turn``'s conversation."""
        if self.history != "model":
            return []
        return [index for index in self.answered(session) if index < turn]

    # -- the messages ----------------------------------------------------------------
    def distractors(self, session: Session) -> tuple[Exchange, ...]:
        if not self.distractor_turns:
            return ()
        return choose_distractors(self.pool, session.system_id, self.distractor_turns, self.distractor_seed)

    def history_replies(self, session: Session, turn: int, replies: Mapping[int, str]) -> dict[int, str]:
        """The assistant message after each earlier turn: the model's (``replies``) or the references."""
        if self.benchmark == "mteval":
            from sysbench_gpu.mteval.conversation import history_for_turn

            return history_for_turn(session, turn, self.history, replies)
        if self.history == "reference":
            return {t.index: t.reference or "" for t in session.turns[: turn - 1]}
        if self.history == SINGLE_TURN:
            return {}
        return {index: replies[index] for index in range(1, turn)}

    def messages(self, session: Session, turn: int, replies: Mapping[int, str] | None = None) -> list[ChatMessage]:
        """The conversation ``turn`` is generated from; ``replies`` are this run's earlier replies of the session."""
        replies = replies or {}
        if self.benchmark == "mteval":
            from sysbench_gpu.mteval.conversation import conversation_for_answered_turn

            return conversation_for_answered_turn(session, turn, self.history, replies)
        return ablation_conversation(
            session,
            turn,
            self.history_replies(session, turn, replies),
            single_turn=self.history == SINGLE_TURN,
            distractors=self.distractors(session),
        )


# ------------------------------------------------------------------ reference history


def missing_references(sessions: Sequence[Session]) -> dict[int, list[int]]:
    """Sessions whose reference replies needed as history are null, with those turns.

    Needed: every turn before the session's last answered turn (SysBench: turns 1..n-1;
    MT-Eval: context turns too, since reference history replaces every earlier reply).
    """
    missing: dict[int, list[int]] = {}
    for session in sessions:
        answered = GenerationPlan.answered(session)
        last = answered[-1] if answered else 0
        turns = [turn.index for turn in session.turns if turn.index < last and turn.reference is None]
        if turns:
            missing[session.system_id] = turns
    return missing


def select_for_reference_history(sessions: list[Session], skip_missing: bool) -> tuple[list[Session], list[int]]:
    """Sessions usable with reference history; the rest are an error or, when asked, skipped."""
    missing = missing_references(sessions)
    if not missing:
        return sessions, []
    listing = "; ".join(f"session {sid}: turns {', '.join(map(str, turns))}" for sid, turns in missing.items())
    if not skip_missing:
        raise SysbenchError(
            f"--history reference needs the reference replies of earlier turns, and {len(missing)} of "
            f"{len(sessions)} sessions have null ones ({listing}); pass --skip-missing-reference to leave them out, "
            "or use --history model"
        )
    kept = [s for s in sessions if s.system_id not in missing]
    if not kept:
        raise SysbenchError(
            f"--skip-missing-reference leaves no session: all {len(sessions)} selected sessions lack a reference "
            "reply needed as history (the shared file keeps references for turns 1-2 only)"
        )
    log.warning("skipping %d sessions without reference replies: %s", len(missing), ", ".join(map(str, missing)))
    return kept, sorted(missing)
