"""`attention` on single-turn, distractor and MT-Eval runs: it measures the conversations generation used."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from fake_engine import FakeEngine  # noqa: E402

from sysbench_gpu.attention.capture.conversation import (  # noqa: E402
    RunConversations,
    concat_forwards,
    conversation_turns,
)
from sysbench_gpu.attention.capture.segments import (  # noqa: E402
    CONTROL_JOINER,
    TurnText,
    build_messages,
    layout_conversation,
)
from sysbench_gpu.attention.files.turn_table import read_turn_table  # noqa: E402
from sysbench_gpu.benchmarks.registry import load_dataset
from sysbench_gpu.benchmarks.sysbench.schema import session_to_upstream  # noqa: E402
from sysbench_gpu.cli import main  # noqa: E402
from sysbench_gpu.core.errors import SysbenchError  # noqa: E402
from sysbench_gpu.core.rundir import RunDir, write_json_atomic  # noqa: E402
from sysbench_gpu.engines.base import SamplingSpec  # noqa: E402
from sysbench_gpu.generation.run import run_generation
from sysbench_gpu.generation.settings import GenerateSettings


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="module")
def short_data(tmp_path_factory, dataset):
    """The whole shared file with shortened texts (small CPU forwards; the distractor pool stays the whole file)."""

    def short(session):
        turns = tuple(
            dataclasses.replace(t, user=t.user[:40], reference=None if t.reference is None else t.reference[:50])
            for t in session.turns
        )
        return dataclasses.replace(session, system_prompt=session.system_prompt[:90], turns=turns)

    path = tmp_path_factory.mktemp("data") / "short.json"
    write_json_atomic(path, [session_to_upstream(short(s)) for s in dataset.sessions])
    return load_dataset(path)


def _generate(data, sessions, run_path: Path, **settings) -> RunDir:
    run = RunDir(run_path)
    full = GenerateSettings(model="smollm2", engine="hf", sampling=SamplingSpec(max_tokens=8), **settings)
    run_generation(FakeEngine(), data, sessions, run, full, progress=False)
    return run


def _attention(run: RunDir, out: Path, *extra: str) -> dict[str, np.ndarray]:
    assert (
        main(
            [
                "attention",
                str(run.path),
                "--model",
                "smollm2",
                "--out",
                str(out),
                "--layers",
                "mid",
                "--limit",
                "1",
                "--no-figures",
                "--bootstrap",
                "10",
                *extra,
            ]
        )
        == 0
    )
    return dict(np.load(next((out / "sessions").glob("*.system.npz"))))


def _ids(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _span_text(tokenizer, messages, ids, span) -> str:
    """The characters of the rendered conversation that the token span covers."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return text[offsets[span[0]][0] : offsets[span[1] - 1][1]]


def _plan(data, settings: dict):
    return GenerateSettings(model="smollm2", engine="hf", **settings).plan(data)


def test_single_turn_run_is_one_forward_per_turn(short_data, tokenizer, tmp_path):
    session = short_data.sessions[0]
    run = _generate(short_data, [session], tmp_path / "run", history="single-turn")
    stored = _attention(run, tmp_path / "attn")
    meta = json.loads(str(stored["meta"]))
    assert meta["n_forwards"] == 5 and meta["history"] == "single-turn" and meta["turns_measured"] == [1, 2, 3, 4, 5]
    assert stored["forwards"].shape == (5, 2) and stored["shares"].shape[:2] == (1, stored["forwards"][-1][1])
    records = run.generations.read()
    plan = _plan(short_data, {"history": "single-turn"})
    for position, ((start, end), (lead, system)) in enumerate(
        zip(stored["forwards"], stored["forward_spans"], strict=False)
    ):
        turn = position + 1
        # Each forward is exactly what generation sent for the turn, plus its reply.
        messages = plan.messages(session, turn) + [{"role": "assistant", "content": records[(1, turn)].response}]
        assert messages[:2] == [
            {"role": "system", "content": session.system_prompt},
            {"role": "user", "content": session.turn(turn).user},
        ]
        ids = _ids(tokenizer, messages)
        assert list(stored["token_ids"][start:end]) == ids
        # The system span is the system text where the template puts it: right after the leading tokens.
        assert lead[0] == start and system[0] == lead[1]
        assert _span_text(tokenizer, messages, ids, system - start).strip() == session.system_prompt.strip()
        assert start <= stored["turns"][position][0] and stored["turns"][position][1] == end
    rows = read_turn_table(tmp_path / "attn" / "turn_shares.jsonl")
    assert [row.turn for row in rows] == [1, 2, 3, 4, 5]
    assert all(0.0 < row.reply_share < 1.0 for row in rows)
    manifest = json.loads((tmp_path / "attn" / "manifest.json").read_text())
    assert manifest["conversation"] == {"history": "single-turn", "distractor_turns": 0}


def test_distractor_run_puts_the_exchanges_between_system_and_turn_one(short_data, tokenizer, tmp_path):
    session = short_data.sessions[0]
    run = _generate(short_data, [session], tmp_path / "run", distractor_turns=2)
    stored = _attention(run, tmp_path / "attn")
    records = run.generations.read()
    plan = _plan(short_data, {"distractor_turns": 2})
    replies = {turn: records[(1, turn)].response for turn in range(1, 6)}
    # The whole forward is generation's conversation of turn 5 plus the reply to it.
    messages = plan.messages(session, 5, replies) + [{"role": "assistant", "content": replies[5]}]
    ids = _ids(tokenizer, messages)
    assert list(stored["token_ids"]) == ids
    (lead0, lead1), (system0, system1) = stored["spans"]
    distractors = stored["distractors"]
    assert distractors.shape == (2, 2)
    assert lead0 == 0 and lead1 == system0 and system1 <= distractors[0][0]
    assert _span_text(tokenizer, messages, ids, (system0, system1)).strip() == session.system_prompt.strip()
    exchanges = plan.distractors(session)
    for (start, end), exchange in zip(distractors, exchanges, strict=False):
        covered = _span_text(tokenizer, messages, ids, (start, end))
        assert covered.startswith(exchange.user.strip()) and covered.endswith(exchange.reply.strip())
    # Turn 1 starts after the last exchange; the distractors belong to no turn.
    assert stored["turns"][0][0] == distractors[-1][1] and stored["users"][0][0] >= distractors[-1][1]
    assert _span_text(tokenizer, messages, ids, stored["users"][0]).strip() == session.turn(1).user.strip()
    meta = json.loads(str(stored["meta"]))
    assert meta["distractor_turns"] == 2 and meta["turns_measured"] == [1, 2, 3, 4, 5]
    assert len(read_turn_table(tmp_path / "attn" / "turn_shares.jsonl")) == 5


def test_control_with_distractors_opens_the_first_exchange(short_data, tokenizer):
    session = short_data.sessions[0]
    exchanges = _plan(short_data, {"distractor_turns": 2}).distractors(session)
    prefix = [TurnText(0, e.user, e.reply) for e in exchanges]
    turns = [TurnText(1, session.turn(1).user, "ok")]
    messages = build_messages(session.system_prompt, prefix + turns, "control")
    assert messages[0] == {"role": "user", "content": session.system_prompt + CONTROL_JOINER + exchanges[0].user}
    layout = layout_conversation(tokenizer, session.system_prompt, turns, "control", prefix)
    assert len(layout.distractors) == 2 and layout.turns[0][0] == layout.distractors[-1][1]
    assert layout.system[1] <= layout.distractors[0][1]


def test_mteval_conversation_has_context_turns_with_given_sys(tokenizer, tmp_path):
    def turn(user, sys, answered):
        return {"user": user, "sys": sys, "id": user, "do_inference": answered}

    dialogue = {
        "id": "a",
        "conv": [
            turn("Tell me about tea.", "Tea is a drink.", False),
            turn("Summarise it.", "", True),
            turn("And coffee?", "Coffee is a drink too.", False),
            turn("Compare them.", "", True),
            turn("Thanks.", "You are welcome.", False),
        ],
    }
    path = tmp_path / "follow-up_multi.jsonl"
    path.write_text(json.dumps(dialogue) + "\n", encoding="utf-8")
    data = load_dataset(path)
    run = _generate(data, list(data.sessions), tmp_path / "run")
    records = run.generations.read()
    session = data.sessions[0]
    turns, stop = conversation_turns(session, "generations", records)
    assert stop is None
    # Context turns with their given sys, answered turns with the run's replies; the trailing context turn is dropped.
    assert [(t.index, t.reply) for t in turns] == [
        (1, "Tea is a drink."),
        (2, records[(1, 2)].response),
        (3, "Coffee is a drink too."),
        (4, records[(1, 4)].response),
    ]
    stored = _attention(run, tmp_path / "attn")
    plan = _plan(data, {})
    messages = plan.messages(session, 4, {2: records[(1, 2)].response}) + [
        {"role": "assistant", "content": records[(1, 4)].response}
    ]
    assert list(stored["token_ids"]) == _ids(tokenizer, messages)
    assert list(stored["turn_numbers"]) == [1, 2, 3, 4]
    # A run without a system message has nothing to measure: one line.
    silent = load_dataset(path, system_message="")
    with pytest.raises(SysbenchError, match="sends no system message"):
        RunConversations().forwards(silent.sessions[0], "generations", records)


def test_concat_forwards_shifts_spans():
    part = {
        "token_ids": np.arange(4),
        "shares": np.zeros((1, 4, 2)),
        "spans": np.array([[0, 1], [1, 2]]),
        "users": np.array([[2, 3]]),
        "replies": np.array([[3, 4]]),
        "turns": np.array([[2, 4]]),
        "turn_numbers": np.array([1]),
        "distractors": np.zeros((0, 2), dtype=np.int64),
    }
    second = {**part, "turn_numbers": np.array([2])}
    out = concat_forwards([part, second])
    assert out["forwards"].tolist() == [[0, 4], [4, 8]] and out["turns"].tolist() == [[2, 4], [6, 8]]
    assert out["forward_spans"].tolist() == [[[0, 1], [1, 2]], [[4, 5], [5, 6]]] and out["shares"].shape == (1, 8, 2)
    assert out["spans"].tolist() == [[0, 1], [1, 2]] and out["turn_numbers"].tolist() == [1, 2]
