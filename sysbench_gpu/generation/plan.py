"""What a generate run answers, in which engine calls, and the messages of every turn.

One object, ``GenerationPlan``, decides for a run (benchmark, history mode, distractor
exchanges) which turns get a reply, how they are grouped into turn-synchronous engine
calls, and the conversation each one sees. The attention stage rebuilds the same
conversations from the same benchmark methods (``attention.capture.conversation``).

- SysBench, ``model`` history: call *t* holds turn *t* of every session, each with the
  model's own earlier replies; ``reference``: one call, references as history;
  ``single-turn``: one call, every turn sees the system message and its own user message.
  Distractor exchanges (``benchmarks.sysbench.ablations``) go between the system message and
  user turn 1.
- MT-Eval: only answered turns (``do_inference``) get a reply. ``model`` history: call *k*
  holds the *k*-th answered turn of every dialogue; a context turn carries its given
  ``sys``. ``reference``: one call (MT-Eval's gold-context setting).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sysbench_gpu.benchmarks.base import Benchmark
from sysbench_gpu.benchmarks.registry import REGISTRY, dataset_benchmark, get_benchmark
from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.sessions import Dataset, Session

log = logging.getLogger(__name__)

# --history values: every registered benchmark's, in order (each refuses those it does not support)
HISTORY_MODES = tuple(dict.fromkeys(mode for benchmark in REGISTRY.all() for mode in benchmark.history_modes))
ALL_IN_ONE_CALL = "all"  # the stats label of a run's single engine call

Key = tuple[int, int]


@dataclass(frozen=True)
class GenerationPlan:
    """The conversations of one run. ``distractor_turns`` exchanges per session come from ``pool`` (the whole file)."""

    benchmark: str  # the registered name of the run's benchmark
    history: str  # one of HISTORY_MODES
    distractor_turns: int = 0
    distractor_seed: int = 0
    pool: Mapping[int, Sequence[Any]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.history not in HISTORY_MODES:
            raise SysbenchError(f"--history must be one of {', '.join(HISTORY_MODES)}, got {self.history!r}")
        self.protocol.check_generation(self.history, self.distractor_turns)
        if self.distractor_turns < 0:
            raise SysbenchError(f"--distractor-turns must be 0 or more, got {self.distractor_turns}")

    @property
    def protocol(self) -> Benchmark:
        return get_benchmark(self.benchmark)

    @classmethod
    def for_dataset(
        cls, dataset: Dataset, history: str, distractor_turns: int = 0, distractor_seed: int = 0
    ) -> GenerationPlan:
        """The plan of a run on ``dataset``; distractors are drawn from every session of the file."""
        benchmark = dataset_benchmark(dataset)
        pool = benchmark.distractor_pool(dataset.sessions) if distractor_turns else {}
        return cls(benchmark.name, history, distractor_turns, distractor_seed, pool)

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
    def distractors(self, session: Session) -> tuple[Any, ...]:
        if not self.distractor_turns:
            return ()
        return self.protocol.choose_distractors(self.pool, session, self.distractor_turns, self.distractor_seed)

    def history_replies(self, session: Session, turn: int, replies: Mapping[int, str]) -> dict[int, str]:
        """The assistant message after each earlier turn: the model's (``replies``) or the references."""
        return self.protocol.history_replies(session, turn, self.history, replies)

    def messages(self, session: Session, turn: int, replies: Mapping[int, str] | None = None) -> list[ChatMessage]:
        """The conversation ``turn`` is generated from; ``replies`` are this run's earlier replies of the session."""
        return self.protocol.messages(session, turn, self.history, replies or {}, self.distractors(session))


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
