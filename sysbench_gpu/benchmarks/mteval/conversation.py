"""The messages an MT-Eval model sees at an answered turn, and the order of engine calls.

History modes (upstream's ``use_gold_history`` switch):

- ``model``: an earlier answered turn is followed by the model's own reply; a context turn
  (``do_inference`` false) by its given ``sys``.
- ``reference`` (MT-Eval's gold-context ablation): every earlier turn is followed by its ``sys``.

The ``*_single`` files need nothing special: each dialogue is one answered turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sysbench_gpu.benchmarks.mteval.data import answered_turns
from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError, where
from sysbench_gpu.core.messages import conversation_for_turn
from sysbench_gpu.core.sessions import Session

HISTORY_MODES = ("model", "reference")


def history_for_turn(
    session: Session, turn_index: int, mode: str, replies: Mapping[int, str] | None = None
) -> dict[int, str]:
    """The assistant message after each turn before ``turn_index``: ``{turn: text}``.

    ``replies`` holds the model's replies to earlier answered turns (needed in ``model`` mode).
    """
    if mode not in HISTORY_MODES:
        raise SysbenchError(f"--history must be one of {', '.join(HISTORY_MODES)} for MT-Eval, got {mode!r}")
    replies = replies or {}
    history: dict[int, str] = {}
    for turn in session.turns[: turn_index - 1]:
        if turn.answered and mode == "model":
            if turn.index not in replies:
                raise SysbenchError(f"{where(None, session.system_id, turn.index)}: no reply yet to use as history")
            history[turn.index] = replies[turn.index]
        elif turn.reference is None:
            raise SysbenchError(
                f"{where(None, session.system_id, turn.index, 'sys')}: no reference reply to use as history "
                "(use --history model)"
            )
        else:
            history[turn.index] = turn.reference
    return history


def conversation_for_answered_turn(
    session: Session, turn_index: int, mode: str = "model", replies: Mapping[int, str] | None = None
) -> list[ChatMessage]:
    """System message (unless empty), then every earlier user turn with its history reply, then this user turn."""
    if not session.turn(turn_index).answered:
        raise SysbenchError(f"{where(None, session.system_id, turn_index)}: a context turn, never answered")
    messages = conversation_for_turn(session, turn_index, history_for_turn(session, turn_index, mode, replies))
    return messages if session.system_prompt else messages[1:]


def engine_calls(sessions: Sequence[Session], mode: str) -> list[list[tuple[int, int]]]:
    """The ``(system_id, turn)`` keys of each engine call, in order.

    ``model``: call k holds the k-th answered turn of every dialogue that has one, so each
    call needs only replies of earlier calls. ``reference``: one call with every answered turn.
    """
    if mode not in HISTORY_MODES:
        raise SysbenchError(f"--history must be one of {', '.join(HISTORY_MODES)} for MT-Eval, got {mode!r}")
    if mode == "reference":
        return [[(s.system_id, t.index) for s in sessions for t in answered_turns(s)]]
    calls: list[list[tuple[int, int]]] = []
    for session in sessions:
        for k, turn in enumerate(answered_turns(session), start=1):
            while len(calls) < k:
                calls.append([])
            calls[k - 1].append((session.system_id, turn.index))
    return calls
