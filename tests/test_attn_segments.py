"""Token boundaries of system text, user turns and replies agree with the chat template."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("transformers")

from sysbench_gpu.attention.capture.segments import (  # noqa: E402
    CONTROL_JOINER,
    TurnText,
    build_messages,
    fit_layout,
    layout_conversation,
)
from sysbench_gpu.core.errors import SysbenchError  # noqa: E402

# Written for these tests: a Llama-3-style header template that trims contents and adds a BOS.
HEADER_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
HEADER_TOKENS = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
# A Qwen2-style ChatML template that inserts a default system message when none is given.
DEFAULT_SYSTEM_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SYSTEM = "你是一名旅行顾问。回答时请使用列表格式，不超过三条。"
TURNS = [
    TurnText(1, "推荐三个适合秋天去的城市。", "1. 北京\n2. 杭州\n3. 成都"),
    TurnText(2, "  第二个城市有什么美食？ ", "杭州有西湖醋鱼、龙井虾仁。"),
    TurnText(3, "Any English tips?", "Book early."),
]


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


def _with_template(tokenizer, template, special=()):
    clone = copy.deepcopy(tokenizer)
    clone.chat_template = template
    if special:
        clone.add_tokens(list(special), special_tokens=True)
    return clone


def _template_ids(tokenizer, messages):
    encoded = tokenizer.apply_chat_template(messages, tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def _decode(tokenizer, ids, span):
    return tokenizer.decode(list(ids[span[0] : span[1]]))


@pytest.mark.parametrize("template", ["chatml", "header"])
def test_boundaries_agree_with_the_template(tokenizer, template):
    if template == "header":
        tokenizer = _with_template(tokenizer, HEADER_TEMPLATE, HEADER_TOKENS)
    layout = layout_conversation(tokenizer, SYSTEM, TURNS, "system")
    messages = build_messages(SYSTEM, TURNS, "system")
    ids = _template_ids(tokenizer, messages)
    assert list(layout.token_ids) == ids
    # Each span holds its text; a token merging text with the template's next characters
    # stays in the span (the template here has no special tokens in this vocabulary).
    for text, span in [(SYSTEM, layout.system)] + [
        (piece, span)
        for turn, u, r in zip(TURNS, layout.users, layout.replies, strict=False)
        for piece, span in ((turn.user, u), (turn.reply, r))
    ]:
        if template == "chatml":
            assert _decode(tokenizer, ids, span).strip() == text.strip()
        else:  # the template trims contents; spans are tight around the trimmed text
            assert text.strip() in _decode(tokenizer, ids, span)
            assert text.strip() not in _decode(tokenizer, ids, (span[0] + 1, span[1]))
            assert text.strip() not in _decode(tokenizer, ids, (span[0], span[1] - 1))
    # Incremental rendering: each prefix conversation is a token prefix, and turn i ends
    # where the rendering up to reply i ends (within the template's closing tokens).
    for position, (start, end) in enumerate(layout.turns):
        prefix = _template_ids(tokenizer, messages[: 2 * position + 3])
        assert ids[: len(prefix)] == prefix
        assert layout.replies[position][1] <= len(prefix)
        assert start <= layout.replies[position][0] and layout.replies[position][1] <= end
    assert layout.turns[0][0] == layout.system[1] and layout.turns[-1][1] == len(ids)
    assert all(a[1] == b[0] for a, b in zip(layout.turns, layout.turns[1:], strict=False))
    lead = _decode(tokenizer, ids, layout.lead)
    assert lead.endswith("system\n") or lead.endswith("system<|end_header_id|>\n\n")


@pytest.mark.parametrize("template", ["chatml", "default-system"])
def test_control_puts_the_same_text_under_a_user_role(tokenizer, template):
    if template == "default-system":
        tokenizer = _with_template(tokenizer, DEFAULT_SYSTEM_TEMPLATE)
    system = layout_conversation(tokenizer, SYSTEM, TURNS, "system")
    control = layout_conversation(tokenizer, SYSTEM, TURNS, "control")
    ids = control.token_ids
    assert _decode(tokenizer, ids, control.system) == SYSTEM
    before = _decode(tokenizer, ids, (0, control.system[0]))
    assert before.endswith("<|im_start|>user\n")
    # Both conditions exclude the same leading tokens (a default system message is not excluded wholesale).
    assert control.lead == system.lead and system.lead[1] == system.system[0]
    assert list(control.token_ids[: control.lead[1]]) == list(system.token_ids[: system.lead[1]])
    assert "<|im_start|>system\n" + SYSTEM not in tokenizer.decode(list(ids))
    # Same replies, same text span length; user 1 follows the joiner inside the same message.
    assert control.system[1] - control.system[0] == system.system[1] - system.system[0]
    for reply_s, reply_c in zip(system.replies, control.replies, strict=False):
        assert reply_s[1] - reply_s[0] == reply_c[1] - reply_c[0]
    between = _decode(tokenizer, ids, (control.system[1], control.users[0][0]))
    assert between == CONTROL_JOINER
    messages = build_messages(SYSTEM, TURNS, "control")
    assert messages[0] == {"role": "user", "content": SYSTEM + CONTROL_JOINER + TURNS[0].user}


@pytest.mark.parametrize("condition", ["system", "control"])
def test_texts_that_also_occur_in_the_template_are_located_exactly(tokenizer, condition):
    # Replies such as "assistant" or "\n" also occur in the template's own headers.
    turns = [TurnText(1, "user", "assistant"), TurnText(2, "system", "im_end"), TurnText(3, "im_start", "user")]
    layout = layout_conversation(tokenizer, "system", turns, condition)
    ids = layout.token_ids
    assert _decode(tokenizer, ids, layout.system) == "system"
    assert [_decode(tokenizer, ids, span) for span in layout.replies] == ["assistant", "im_end", "user"]
    assert [_decode(tokenizer, ids, span) for span in layout.users[1:]] == ["system", "im_start"]
    assert _decode(tokenizer, ids, (0, layout.replies[0][0])).endswith("<|im_start|>assistant\n")


def test_fit_layout_drops_trailing_turns(tokenizer):
    full = layout_conversation(tokenizer, SYSTEM, TURNS, "system")
    fitted = fit_layout(tokenizer, SYSTEM, TURNS, "system", max_tokens=full.n_tokens - 1)
    assert fitted is not None and fitted.turn_numbers == (1, 2)
    assert fit_layout(tokenizer, SYSTEM, TURNS, "system", max_tokens=5) is None


def test_template_that_rewrites_text_is_refused(tokenizer):
    rewriting = _with_template(tokenizer, "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}")
    with pytest.raises(SysbenchError, match="does not contain the turn 3 user text"):
        layout_conversation(rewriting, SYSTEM, TURNS, "system")
