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
(``check_ablation_compatible``); the exchanges each session got are written to
``distractors.json`` so that later stages (attention) rebuild the same conversations
without the original data file.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from sysbench_gpu.data import Session
from sysbench_gpu.engines.base import ChatMessage
from sysbench_gpu.errors import SysbenchError
from sysbench_gpu.messages import conversation_for_turn

SINGLE_TURN = "single-turn"
DEFAULT_DISTRACTOR_SEED = 0
# Manifest fields of the generate stage that one run directory must keep.
ABLATION_FIELDS = ("history", "distractor_turns", "distractor_seed")
# The exchanges every session of a distractor run got (run directory file).
DISTRACTORS_FILE = "distractors.json"


@dataclass(frozen=True)
class Exchange:
    """One unrelated user/assistant exchange, and where it comes from."""

    system_id: int
    turn: int
    user: str
    reply: str

    def messages(self) -> list[ChatMessage]:
        return [{"role": "user", "content": self.user}, {"role": "assistant", "content": self.reply}]


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
    """``count`` exchanges from ``count`` sessions other than ``system_id``; deterministic in (seed, system_id, count)."""
    if count < 0:
        raise SysbenchError(f"--distractor-turns must be 0 or more, got {count}")
    if count == 0:
        return ()
    others = sorted(sid for sid in pool if sid != system_id)
    if len(others) < count:
        raise SysbenchError(
            f"--distractor-turns {count} needs {count} other sessions with a reference reply; the data has {len(others)}"
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
    the references), as ``messages.conversation_for_turn`` takes it; unused when
    ``single_turn``.
    """
    if single_turn:
        base = single_turn_conversation(session, turn)
    else:
        base = conversation_for_turn(session, turn, history or {})
    return insert_distractors(base, distractors)


def ablation_settings(history: str, distractor_turns: int = 0, distractor_seed: int = DEFAULT_DISTRACTOR_SEED) -> dict[str, Any]:
    """The manifest fields that describe a run's ablation (``distractor_seed`` only with distractors)."""
    if distractor_turns < 0:
        raise SysbenchError(f"--distractor-turns must be 0 or more, got {distractor_turns}")
    return {
        "history": history,
        "distractor_turns": distractor_turns,
        "distractor_seed": distractor_seed if distractor_turns else None,
    }


def check_ablation_compatible(stored: Mapping[str, Any], wanted: Mapping[str, Any], source: str) -> None:
    """Refuse to mix ablations in one run directory; name the first field that differs.

    ``stored`` is the manifest's generate section (an old run without the distractor fields
    had none: 0 distractor turns).
    """
    defaults = {"distractor_turns": 0, "distractor_seed": None}
    for name in ABLATION_FIELDS:
        old = stored.get(name, defaults.get(name))
        new = wanted.get(name, defaults.get(name))
        if old != new:
            raise SysbenchError(
                f"{source}: field {name!r} was {old!r} in this run, this command asks for {new!r}; "
                "one run directory holds one ablation: use a new --out"
            )


# ------------------------------------------------------------------ distractors.json


def write_distractors(path: Path, chosen: Mapping[int, Sequence[Exchange]], count: int, seed: int) -> None:
    """``distractors.json``: per session id, the exchanges in the order they go into the conversation."""
    from sysbench_gpu.runstore import write_json_atomic

    write_json_atomic(
        Path(path),
        {
            "distractor_turns": count,
            "distractor_seed": seed,
            "sessions": {str(sid): [asdict(e) for e in exchanges] for sid, exchanges in sorted(chosen.items())},
        },
    )


def read_distractors(path: Path) -> tuple[int, dict[int, tuple[Exchange, ...]]]:
    """(distractor turns, exchanges per session id) from ``distractors.json``; one-line errors name the field."""
    from sysbench_gpu.jsonio import read_json

    path = Path(path)
    if not path.is_file():
        raise SysbenchError(f"{path}: missing; the run's manifest says it has distractor turns (rerun generate)")
    raw = read_json(path, expect=dict)
    count = raw.get("distractor_turns")
    sessions = raw.get("sessions")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise SysbenchError(f"{path}: field 'distractor_turns' should be a positive integer, found {count!r}")
    if not isinstance(sessions, dict):
        raise SysbenchError(f"{path}: field 'sessions' should be an object")
    chosen: dict[int, tuple[Exchange, ...]] = {}
    for key, items in sessions.items():
        if not key.isdigit() or not isinstance(items, list) or len(items) != count:
            raise SysbenchError(f"{path}: field 'sessions.{key}' should be a list of {count} exchanges")
        exchanges = []
        for position, item in enumerate(items):
            fields = {"system_id": int, "turn": int, "user": str, "reply": str}
            if not isinstance(item, dict) or set(item) != set(fields) or any(
                isinstance(item[name], bool) or not isinstance(item[name], kind) for name, kind in fields.items()
            ):
                raise SysbenchError(
                    f"{path}: field 'sessions.{key}[{position}]' should be an object with system_id, turn, user, reply"
                )
            exchanges.append(Exchange(**item))
        chosen[int(key)] = tuple(exchanges)
    return count, chosen
