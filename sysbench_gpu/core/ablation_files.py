"""A run's history ablation as files: the manifest fields that name it, and the distractor exchanges each session got
(distractors.json).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.jsonio import read_json
from sysbench_gpu.core.rundir import write_json_atomic

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


def ablation_settings(
    history: str, distractor_turns: int = 0, distractor_seed: int = DEFAULT_DISTRACTOR_SEED
) -> dict[str, Any]:
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


def write_distractors(path: Path, chosen: Mapping[int, Sequence[Exchange]], count: int, seed: int) -> None:
    """``distractors.json``: per session id, the exchanges in the order they go into the conversation."""
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
            if (
                not isinstance(item, dict)
                or set(item) != set(fields)
                or any(
                    isinstance(item[name], bool) or not isinstance(item[name], kind) for name, kind in fields.items()
                )
            ):
                raise SysbenchError(
                    f"{path}: field 'sessions.{key}[{position}]' should be an object with system_id, turn, user, reply"
                )
            exchanges.append(Exchange(**item))
        chosen[int(key)] = tuple(exchanges)
    return count, chosen


SINGLE_TURN = "single-turn"
