"""MT-Eval conversations: exact message lists under model and reference history, and the engine-call order."""

from __future__ import annotations

import json

import pytest

from sysbench_gpu.benchmarks.mteval.conversation import (
    conversation_for_answered_turn,
    engine_calls,
    history_for_turn,
)
from sysbench_gpu.benchmarks.mteval.data import parse_dialogues
from sysbench_gpu.benchmarks.mteval.tasks import DEFAULT_SYSTEM_MESSAGE
from sysbench_gpu.core.errors import SysbenchError

# context, answered, context, answered: the shape of follow-up and of the irrelevant-context ablation
DIALOGUE = {
    "id": "d",
    "conv": [
        {"user": "U1", "sys": "S1", "id": "1", "do_inference": False},
        {"user": "U2", "sys": "S2", "id": "2", "do_inference": True},
        {"user": "U3", "sys": "S3", "id": "3", "do_inference": False},
        {"user": "U4", "sys": "S4", "id": "4", "do_inference": True},
    ],
}
SINGLE = {"id": "s", "conv": [{"user": "Only", "sys": "", "id": "s", "do_inference": True}]}


def _session(obj: dict = DIALOGUE, **kwargs):
    return parse_dialogues(json.dumps(obj), task="follow-up", **kwargs)[0]


def _m(role: str, content: str) -> dict:
    return {"role": role, "content": content}


SYSTEM = _m("system", DEFAULT_SYSTEM_MESSAGE)


def test_model_history_uses_own_replies_for_answered_and_sys_for_context_turns() -> None:
    session = _session()
    assert conversation_for_answered_turn(session, 2, "model") == [
        SYSTEM,
        _m("user", "U1"),
        _m("assistant", "S1"),
        _m("user", "U2"),
    ]
    assert conversation_for_answered_turn(session, 4, "model", {2: "mine"}) == [
        SYSTEM,
        _m("user", "U1"),
        _m("assistant", "S1"),
        _m("user", "U2"),
        _m("assistant", "mine"),
        _m("user", "U3"),
        _m("assistant", "S3"),
        _m("user", "U4"),
    ]


def test_reference_history_uses_sys_everywhere() -> None:
    session = _session()
    assert conversation_for_answered_turn(session, 4, "reference", {2: "ignored"}) == [
        SYSTEM,
        _m("user", "U1"),
        _m("assistant", "S1"),
        _m("user", "U2"),
        _m("assistant", "S2"),
        _m("user", "U3"),
        _m("assistant", "S3"),
        _m("user", "U4"),
    ]


def test_system_message_override_and_none() -> None:
    assert conversation_for_answered_turn(_session(system_message="Be terse."), 2)[0] == _m("system", "Be terse.")
    assert conversation_for_answered_turn(_session(system_message=""), 2) == [
        _m("user", "U1"),
        _m("assistant", "S1"),
        _m("user", "U2"),
    ]


def test_single_turn_dialogue_is_one_user_message() -> None:
    session = parse_dialogues(json.dumps(SINGLE), task="follow-up_single")[0]
    assert session.mteval.setting == "single" and session.turn(1).reference is None
    assert conversation_for_answered_turn(session, 1) == [SYSTEM, _m("user", "Only")]


def test_errors() -> None:
    session = _session()
    with pytest.raises(SysbenchError, match="turn 2: no reply yet"):
        conversation_for_answered_turn(session, 4, "model", {})
    with pytest.raises(SysbenchError, match="turn 3: a context turn"):
        conversation_for_answered_turn(session, 3)
    with pytest.raises(SysbenchError, match="--history must be one of model, reference"):
        history_for_turn(session, 4, "single-turn")
    no_gold = json.loads(json.dumps(DIALOGUE))
    no_gold["conv"][1]["sys"] = ""  # an answered turn without a reference (global-inst, *_single)
    with pytest.raises(SysbenchError, match="turn 2, field 'sys': no reference reply"):
        conversation_for_answered_turn(_session(no_gold), 4, "reference")


def test_engine_calls_group_by_answered_turn_index() -> None:
    short = {"id": "e", "conv": [{"user": "X", "sys": "Y", "id": "x", "do_inference": True}]}
    sessions = parse_dialogues(json.dumps(DIALOGUE) + "\n" + json.dumps(short), task="follow-up")
    assert engine_calls(sessions, "model") == [[(1, 2), (2, 1)], [(1, 4)]]
    assert engine_calls(sessions, "reference") == [[(1, 2), (1, 4), (2, 1)]]


def test_follow_up_limit_two_is_six_requests_in_three_calls() -> None:
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent.parent / "shared" / "mteval" / "data" / "follow-up_multi.jsonl"
    if not path.is_file():
        pytest.skip("shared MT-Eval data not found")
    from sysbench_gpu.benchmarks.registry import load_dataset

    sessions = load_dataset(path).select(limit=2)
    calls = engine_calls(sessions, "model")
    assert [len(c) for c in calls] == [2, 2, 2]
    assert calls[0] == [(1, 3), (2, 3)]


def test_generate_plan_follows_the_same_calls_and_messages() -> None:
    from sysbench_gpu.generation.plan import GenerationPlan

    short = {"id": "e", "conv": [{"user": "X", "sys": "Y", "id": "x", "do_inference": True}]}
    sessions = parse_dialogues(json.dumps(DIALOGUE) + "\n" + json.dumps(short), task="follow-up")
    for mode in ("model", "reference"):
        plan = GenerationPlan("mteval", mode)
        assert [keys for _, keys in plan.calls(sessions)] == engine_calls(sessions, mode)
        assert plan.messages(sessions[0], 4, {2: "mine"}) == conversation_for_answered_turn(
            sessions[0], 4, mode, {2: "mine"}
        )
    assert GenerationPlan("mteval", "model").depends_on(sessions[0], 4) == [2]
    assert GenerationPlan("mteval", "reference").depends_on(sessions[0], 4) == []
