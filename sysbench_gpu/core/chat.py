"""The chat message type shared by conversations, engines and judges."""

from __future__ import annotations

from typing import TypedDict


class ChatMessage(TypedDict):
    role: str  # system | user | assistant
    content: str
