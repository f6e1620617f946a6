"""Message lists of one turn: the conversation, system-role folding, and fitting into the context.

``conversation_for_turn`` is the SysBench conversation (system message, earlier user turns
each followed by a history reply, this user turn); MT-Eval and the ablations build on it
(``benchmarks.mteval.conversation``, ``benchmarks.sysbench.ablations``). ``fit_to_context``
applies ``--on-overflow`` to any such list (docs/generation.md, "Over-length turns").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.sessions import Session

# Templates without a system role get "<system message><separator><first user message>".
SYSTEM_FOLD_SEPARATOR = "\n\n"


def conversation_for_turn(session: Session, turn: int, history: Mapping[int, str]) -> list[ChatMessage]:
    """System message, then user turns 1..turn-1 each followed by ``history[i]``, then user turn ``turn``."""
    messages: list[ChatMessage] = [{"role": "system", "content": session.system_prompt}]
    for index in range(1, turn):
        messages.append({"role": "user", "content": session.turn(index).user})
        messages.append({"role": "assistant", "content": history[index]})
    messages.append({"role": "user", "content": session.turn(turn).user})
    return messages


def fold_system_message(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """Merge a leading system message into the first user message, for templates without a system role."""
    if not messages or messages[0]["role"] != "system":
        return list(messages)
    system, rest = messages[0], list(messages[1:])
    for position, message in enumerate(rest):
        if message["role"] == "user":
            rest[position] = {"role": "user", "content": system["content"] + SYSTEM_FOLD_SEPARATOR + message["content"]}
            return rest
    return [{"role": "user", "content": system["content"]}] + rest


def drop_oldest_turns(messages: Sequence[ChatMessage], count: int) -> list[ChatMessage]:
    """Remove the ``count`` oldest user+assistant pairs; the system message and the last user turn stay."""
    head = [m for m in messages[:1] if m["role"] == "system"]
    body = list(messages[len(head) :])
    return head + body[2 * count :]


def fit_to_context(
    messages: list[ChatMessage],
    *,
    count_tokens: Callable[[Sequence[ChatMessage]], int | None],
    context_length: int | None,
    reserve: int,
    policy: str,
    fold_system: bool,
    location: str,
) -> tuple[list[ChatMessage], int | None, str | None, str | None]:
    """Apply the over-length policy; returns (messages to send, prompt tokens, overflow, skip reason).

    ``reserve`` is the number of output tokens the reply may take (max tokens). Truncation
    drops whole oldest pairs (distractor exchanges first, then the session's own turns),
    never the system message; a prompt that still does not fit without any history is skipped.
    """
    shape = fold_system_message if fold_system else list
    final = shape(messages)
    tokens = count_tokens(final)
    if tokens is None or context_length is None or tokens + reserve <= context_length:
        return final, tokens, None, None
    if policy == "error":
        raise SysbenchError(
            f"{location}: prompt of {tokens} tokens + {reserve} max tokens exceeds the model's context length "
            f"{context_length}; pass --on-overflow truncate-history or --on-overflow skip, or lower --max-tokens"
        )
    if policy == "skip":
        return final, tokens, "skipped", f"prompt of {tokens} + {reserve} tokens exceeds context {context_length}"
    history_turns = (len(messages) - (1 if messages and messages[0]["role"] == "system" else 0) - 1) // 2
    for dropped in range(1, history_turns + 1):
        final = shape(drop_oldest_turns(messages, dropped))
        tokens = count_tokens(final)
        if tokens is None or tokens + reserve <= context_length:
            return final, tokens, f"truncated-history:{dropped}", None
    return (
        final,
        tokens,
        "skipped",
        (f"prompt of {tokens} + {reserve} tokens exceeds context {context_length} even without history"),
    )
