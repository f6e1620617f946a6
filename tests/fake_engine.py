"""A small deterministic engine for scheduler tests: replies depend on the whole conversation."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from sysbench_gpu.engines.base import Completion, SamplingSpec


class Interrupted(Exception):
    """Stands for a kill: raised by the fake engine on a chosen call."""


class FakeEngine:
    """Deterministic replies that depend on the whole conversation (so history is checkable)."""

    name = "fake"
    model = "fake-model"

    def __init__(
        self,
        context: int | None = None,
        system_role: bool = True,
        fail_on_call: int | None = None,
        is_primary: bool = True,
    ) -> None:
        self.context = context
        self.system_role = system_role
        self.fail_on_call = fail_on_call
        self.is_primary = is_primary
        self.calls: list[list[list[dict[str, str]]]] = []
        self.session_keys: list[list[str]] = []  # per call, as the scheduler passed them (replica placement)

    def chat(
        self,
        conversations: Sequence[Sequence[dict[str, str]]],
        sampling: SamplingSpec,
        session_keys: Sequence[str] | None = None,
    ) -> list[Completion]:
        if self.fail_on_call is not None and len(self.calls) + 1 == self.fail_on_call:
            raise Interrupted
        self.calls.append([list(c) for c in conversations])
        self.session_keys.append(list(session_keys or []))
        out = []
        for conversation in conversations:
            digest = hashlib.sha1(json.dumps(conversation, sort_keys=True).encode()).hexdigest()[:10]
            users = sum(m["role"] == "user" for m in conversation)
            text = f"reply {users} [{digest}] max={sampling.max_tokens}"
            out.append(
                Completion(
                    text=text,
                    prompt_tokens=self.count_prompt_tokens(conversation),
                    output_tokens=4,
                    finish_reason="stop" if users % 2 else "length",
                )
            )
        return out

    def count_prompt_tokens(self, conversation: Sequence[dict[str, str]]) -> int:
        return sum(len(m["content"].split()) + 3 for m in conversation)

    def supports_system_role(self) -> bool:
        return self.system_role

    def context_length(self) -> int | None:
        return self.context

    def describe(self) -> dict[str, Any]:
        return {"engine": "fake", "defaults": {"max_tokens": 10}}

    def close(self) -> None:
        pass
