"""Token boundaries of a rendered conversation: system text, each user turn, each reply.

The conversation is rendered once with the tokenizer's own chat template; each
message's text is located in the rendered string in order, and character positions
map to tokens through the tokenizer's offsets. Nothing is hard-coded per model:
leading tokens such as BOS or ``<|im_start|>system\\n`` are simply whatever the
template puts before the system text.

Two conditions:

* ``system``: the system text is the system message.
* ``control``: the same text is sent with role user, joined to the first user
  message (``system text + CONTROL_JOINER + user 1``); the span measured is the
  same text.

Distractor exchanges (``generate --distractor-turns``) come as ``prefix``: user/reply
pairs between the system message and user turn 1, located like turns but belonging to
no turn (``ConversationLayout.distractors``); in ``control`` the system text opens the
first distractor's user message, as generation folds it.

Leading tokens (excluded from numerator and denominator in the ``excl_lead``
variant) are the tokens before the system text in the ``system`` condition. The
control excludes the same number of first tokens, so a default system message that
a template inserts when none is given is not excluded wholesale (that would inflate
the control's share); upstream likewise excluded a fixed count per model.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sysbench_gpu.core.errors import SysbenchError

CONDITIONS = ("system", "control")
CONTROL_JOINER = "\n"

Span = tuple[int, int]


@dataclass(frozen=True)
class TurnText:
    index: int  # 1-based turn number
    user: str
    reply: str


@dataclass(frozen=True)
class ConversationLayout:
    """Token ids of the whole conversation and the token spans of its parts (half-open)."""

    condition: str
    token_ids: tuple[int, ...]
    system: Span  # the system text
    users: tuple[Span, ...]  # the user text of each turn (in control, turn 1 without the system text)
    replies: tuple[Span, ...]
    turns: tuple[Span, ...]  # partition of [system end, T): turn i runs to the end of reply i
    turn_numbers: tuple[int, ...]
    lead_end: int  # the template's leading tokens are [0, lead_end)
    distractors: tuple[Span, ...] = ()  # each distractor exchange, its user start to its reply end

    @property
    def lead(self) -> Span:
        """The template's leading tokens (BOS, system header): excluded in the ``excl_lead`` variant."""
        return (0, self.lead_end)

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


def build_messages(system_prompt: str, turns: Sequence[TurnText], condition: str) -> list[dict[str, str]]:
    """Chat messages for one condition."""
    if condition not in CONDITIONS:
        raise SysbenchError(f"unknown condition {condition!r} (expected one of {', '.join(CONDITIONS)})")
    messages: list[dict[str, str]] = []
    if condition == "system":
        messages.append({"role": "system", "content": system_prompt})
    for position, turn in enumerate(turns):
        user = turn.user
        if condition == "control" and position == 0:
            user = system_prompt + CONTROL_JOINER + user
        messages.append({"role": "user", "content": user})
        messages.append({"role": "assistant", "content": turn.reply})
    return messages


def _find(text: str, piece: str, cursor: int, what: str) -> Span:
    """Locate ``piece`` in ``text`` at or after ``cursor`` (templates may trim whitespace)."""
    for candidate in (piece, piece.strip()):
        if not candidate:
            return (cursor, cursor)
        start = text.find(candidate, cursor)
        if start >= 0:
            return (start, start + len(candidate))
    raise SysbenchError(
        f"the chat template's output does not contain the {what} text verbatim; cannot locate its tokens"
    )


# A marker no message contains: where the template puts it is where a message's text starts.
_PROBE = "\ue000sysbench-probe\ue000"


def _probe_start(tokenizer: Any, messages: list[dict[str, str]], index: int, text: str) -> int | None:
    """Where message ``index``'s text starts in ``text``, found by rendering the prefix with a marker.

    Exact even when the text also occurs in the template's own tokens (a reply
    "assistant" or "user"). None when the template cannot render the prefix or the
    prefix rendering is not a prefix of the whole.
    """
    probe_messages = messages[:index] + [{**messages[index], "content": _PROBE}]
    try:
        probe = tokenizer.apply_chat_template(probe_messages, tokenize=False)
    except Exception:  # templates that reject a partial conversation
        return None
    position = probe.find(_PROBE) if isinstance(probe, str) else -1
    if position < 0 or text[:position] != probe[:position]:
        return None
    return position


def _locate(
    tokenizer: Any, messages: list[dict[str, str]], index: int, piece: str, text: str, cursor: int, what: str
) -> Span:
    """Character span of ``piece`` (a message's text or its beginning) in the rendered conversation."""
    start = _probe_start(tokenizer, messages, index, text)
    if start is not None and start >= cursor:
        for candidate in (piece, piece.strip()):  # templates may trim whitespace
            if text.startswith(candidate, start):
                return (start, start + len(candidate))
    return _find(text, piece, cursor, what)


def render(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception as error:  # jinja errors, templates that reject a role
        raise SysbenchError(f"the tokenizer's chat template failed: {error}") from None
    if not isinstance(text, str):
        raise SysbenchError("the tokenizer's chat template did not return text")
    return text


def layout_conversation(
    tokenizer: Any,
    system_prompt: str,
    turns: Sequence[TurnText],
    condition: str = "system",
    prefix: Sequence[TurnText] = (),
) -> ConversationLayout:
    """Render, tokenize and find the token spans of every part of the conversation.

    ``prefix``: exchanges between the system message and turn 1 (distractors), in no turn.
    """
    if not turns:
        raise SysbenchError("a conversation needs at least one turn with a reply")
    n_prefix = len(prefix)
    own_turns = list(turns)
    turns = list(prefix) + own_turns
    text = render(tokenizer, build_messages(system_prompt, turns, condition))
    # The text of each message is located where the template puts it (see _locate).
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    token_ids = list(encoding["input_ids"])
    offsets = [tuple(pair) for pair in encoding["offset_mapping"]]
    starts = [start for start, _ in offsets]
    if any(b < a for a, b in zip(starts, starts[1:], strict=False)):
        raise SysbenchError("the tokenizer returned non-monotonic offsets; cannot map text to tokens")

    def token_at(char: int) -> int:
        # First token starting at or after ``char``: a token straddling a boundary stays with what precedes it.
        return bisect_left(starts, char)

    messages = build_messages(system_prompt, turns, condition)
    offset = 1 if condition == "system" else 0  # index of turn 1's user message
    cursor = 0
    # In control the system text opens the first user message.
    system_chars = _locate(tokenizer, messages, 0, system_prompt, text, cursor, "system")
    cursor = system_chars[1]
    users: list[Span] = []
    replies: list[Span] = []
    reply_ends: list[int] = []
    for position, turn in enumerate(turns):
        user_index = offset + 2 * position
        name = f"distractor {position + 1}" if position < n_prefix else f"turn {turn.index}"
        if condition == "control" and position == 0:
            user_chars = _find(text, turn.user, cursor, f"{name} user")
        else:
            user_chars = _locate(tokenizer, messages, user_index, turn.user, text, cursor, f"{name} user")
        cursor = user_chars[1]
        reply_chars = _locate(tokenizer, messages, user_index + 1, turn.reply, text, cursor, f"{name} reply")
        cursor = reply_chars[1]
        users.append((token_at(user_chars[0]), token_at(user_chars[1])))
        replies.append((token_at(reply_chars[0]), token_at(reply_chars[1])))
        reply_ends.append(token_at(reply_chars[1]))
    system = (token_at(system_chars[0]), token_at(system_chars[1]))
    lead_end = system[0]
    if condition == "control":
        reference = layout_conversation(tokenizer, system_prompt, turns[:1], "system")
        lead_end = min(reference.lead_end, system[0])
    # Turn 1 starts after the system text, or after the last distractor exchange.
    bounds = [reply_ends[n_prefix - 1] if n_prefix else system[1]] + reply_ends[n_prefix:]
    bounds[-1] = len(token_ids)  # the template's closing tokens belong to the last turn
    segments = tuple((bounds[i], bounds[i + 1]) for i in range(len(own_turns)))
    return ConversationLayout(
        condition=condition,
        token_ids=tuple(token_ids),
        system=system,
        users=tuple(users[n_prefix:]),
        replies=tuple(replies[n_prefix:]),
        turns=segments,
        turn_numbers=tuple(turn.index for turn in own_turns),
        lead_end=lead_end,
        distractors=tuple((users[i][0], replies[i][1]) for i in range(n_prefix)),
    )


def fit_layout(
    tokenizer: Any,
    system_prompt: str,
    turns: Sequence[TurnText],
    condition: str,
    max_tokens: int | None,
    prefix: Sequence[TurnText] = (),
) -> ConversationLayout | None:
    """The layout with as many leading turns as fit in ``max_tokens``; None when not even turn 1 fits.

    The ``prefix`` exchanges always stay (they are what the run put before turn 1).
    """
    count = len(turns)
    while count > 0:
        layout = layout_conversation(tokenizer, system_prompt, turns[:count], condition, prefix)
        if max_tokens is None or layout.n_tokens <= max_tokens:
            return layout
        count -= 1
    return None
