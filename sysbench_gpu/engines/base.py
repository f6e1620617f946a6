"""The engine interface: a batch of conversations in, completions with token counts out."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sysbench_gpu.core.chat import ChatMessage


@dataclass(frozen=True)
class SamplingSpec:
    """Sampling parameters. None means "the model's own default" (its generation config).

    ``json_schema`` asks engines that support it (vLLM) to constrain the output to a
    JSON schema; others ignore it. ``ignore_eos`` runs every reply to ``max_tokens``
    (benchmarks that compare schedules need the same tokens decoded by each).
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    json_schema: dict[str, Any] | None = None
    ignore_eos: bool | None = None  # None and False: stop at the model's end of sequence

    def explicit(self) -> dict[str, Any]:
        """Only the fields a user set, for the manifest."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class Completion:
    text: str
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_prompt_tokens: int | None = None  # where the engine reports prefix-cache hits
    finish_reason: str | None = None  # stop | length | error | ...
    extra: dict[str, Any] = field(default_factory=dict)


class Engine(Protocol):
    """What every backend provides."""

    name: str
    model: str
    # False on every rank but one under torchrun/external launchers: only the primary writes files.
    is_primary: bool

    def chat(self, conversations: Sequence[Sequence[ChatMessage]], sampling: SamplingSpec) -> list[Completion]:
        """Complete every conversation; the result is in input order, one per conversation.

        An engine that places conversations (data-parallel replicas with prefix caches)
        also takes ``session_keys``: one stable key per conversation, the same for every
        turn of a session. See ``chat_sessions``.
        """
        ...

    def count_prompt_tokens(self, conversation: Sequence[ChatMessage]) -> int | None:
        """Tokens of the templated prompt, or None where the engine cannot tell before sending."""
        ...

    def supports_system_role(self) -> bool:
        """False when the chat template rejects a system message (the scheduler then folds it into turn 1)."""
        ...

    def context_length(self) -> int | None:
        """The model's maximum sequence length, or None when unknown."""
        ...

    def describe(self) -> dict[str, Any]:
        """Engine settings for the manifest (no secrets)."""
        ...

    def close(self) -> None: ...


def chat_sessions(
    engine: Any,
    conversations: Sequence[Sequence[ChatMessage]],
    sampling: SamplingSpec,
    session_keys: Sequence[str],
) -> list[Completion]:
    """``engine.chat`` with each conversation's session key, for engines whose ``chat`` takes ``session_keys``.

    The key (the session id) keeps every turn of a session on one replica even when the
    messages themselves change shape (the system message folded into turn 1, oldest turns
    dropped to fit the context). Engines that place nothing do not declare the argument
    and are called as before.
    """
    if len(session_keys) != len(conversations):
        raise ValueError(f"{len(session_keys)} session keys for {len(conversations)} conversations")
    if _takes_session_keys(engine.chat):
        return engine.chat(conversations, sampling, session_keys=list(session_keys))
    return engine.chat(conversations, sampling)


def _takes_session_keys(method: Any) -> bool:
    try:
        return "session_keys" in inspect.signature(method).parameters
    except (TypeError, ValueError):  # builtins and mocks without a signature
        return False
