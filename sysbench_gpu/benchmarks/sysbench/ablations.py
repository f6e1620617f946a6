"""SysBench history ablations: single-turn conversations and unrelated exchanges in front.

- ``--history single-turn``: every turn sees the system message and its own user message
  only; no turn depends on another, so a whole run is one engine call.
- ``--distractor-turns K``: K unrelated user/assistant exchanges go between the system
  message and user turn 1, so the system message sits K exchanges further back. Each
  exchange is one turn of ANOTHER session with its reference reply (the shared data has
  reference replies for turns 1-2 only, so only turns whose reference is not null qualify).
  The K exchanges come from K different sessions, drawn with a generator seeded from
  (seed, session id, K): the same for every turn of a session, independent of which
  sessions are selected (the pool is the whole data file), and reproducible across runs.

Both work with the ``model`` and ``reference`` history of the rest of the conversation.
A run directory records its ablation in the manifest and refuses another one
(``core.ablation_files.check_ablation_compatible``); the exchanges each session got are
written to ``distractors.json`` (``core.ablation_files``) so that later stages (attention)
rebuild the same conversations without the original data file.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence

from sysbench_gpu.core.ablation_files import DEFAULT_DISTRACTOR_SEED, Exchange
from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.messages import conversation_for_turn
from sysbench_gpu.core.sessions import Session


def single_turn_conversation(session: Session, turn: int) -> list[ChatMessage]:
    """The system message and user turn ``turn``, nothing else."""
    return [
        {"role": "system", "content": session.system_prompt},
        {"role": "user", "content": session.turn(turn).user},
    ]


def distractor_pool(sessions: Sequence[Session]) -> dict[int, list[Exchange]]:
    """Per session, the turns usable as distractors (reference reply present and not blank), in turn order."""
    pool: dict[int, list[Exchange]] = {}
    for session in sessions:
        usable = [
            Exchange(session.system_id, turn.index, turn.user, turn.reference)
            for turn in session.turns
            if turn.reference is not None and turn.reference.strip()
        ]
        if usable:
            pool[session.system_id] = usable
    return pool


def choose_distractors(
    pool: Mapping[int, Sequence[Exchange]], system_id: int, count: int, seed: int = DEFAULT_DISTRACTOR_SEED
) -> tuple[Exchange, ...]:
    """``count`` exchanges from ``count`` sessions other than ``system_id``.

    Deterministic in (seed, system_id, count).
    """
    if count < 0:
        raise SysbenchError(f"--distractor-turns must be 0 or more, got {count}")
    if count == 0:
        return ()
    others = sorted(sid for sid in pool if sid != system_id)
    if len(others) < count:
        raise SysbenchError(
            f"--distractor-turns {count} needs {count} other sessions with a reference reply; the data has "
            f"{len(others)}"
        )
    rng = random.Random(_derived_seed(seed, system_id, count))
    return tuple(rng.choice(list(pool[sid])) for sid in rng.sample(others, count))


def _derived_seed(seed: int, system_id: int, count: int) -> int:
    # A hash, not Python's hash(): stable across processes and versions.
    digest = hashlib.sha256(f"sysbench-gpu distractors {seed} {system_id} {count}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def insert_distractors(messages: Sequence[ChatMessage], exchanges: Sequence[Exchange]) -> list[ChatMessage]:
    """``messages`` with the exchanges placed right after a leading system message (or first, without one)."""
    head = [m for m in messages[:1] if m["role"] == "system"]
    inserted = [message for exchange in exchanges for message in exchange.messages()]
    return head + inserted + list(messages[len(head) :])


def ablation_conversation(
    session: Session,
    turn: int,
    history: Mapping[int, str] | None = None,
    *,
    single_turn: bool = False,
    distractors: Sequence[Exchange] = (),
) -> list[ChatMessage]:
    """The conversation for one turn under the ablations.

    ``history`` holds the assistant message after each earlier turn (the model's replies or
    the references), as ``core.messages.conversation_for_turn`` takes it; unused when
    ``single_turn``.
    """
    if single_turn:
        base = single_turn_conversation(session, turn)
    else:
        base = conversation_for_turn(session, turn, history or {})
    return insert_distractors(base, distractors)


# ------------------------------------------------------------------ distractors.json
