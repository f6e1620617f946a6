"""The turn-synchronous scheduler, exercised with a small deterministic fake engine."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from fake_engine import FakeEngine, Interrupted

from sysbench_gpu.benchmarks.registry import demo_data_path, load_dataset, load_run_sessions, resolve_data_path
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.messages import (
    SYSTEM_FOLD_SEPARATOR,
    conversation_for_turn,
    drop_oldest_turns,
    fold_system_message,
)
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.core.sessions import parse_session_ids
from sysbench_gpu.engines.base import SamplingSpec
from sysbench_gpu.generation.cli import engine_options_from_args, register
from sysbench_gpu.generation.plan import missing_references
from sysbench_gpu.generation.run import run_generation
from sysbench_gpu.generation.settings import GenerateSettings

SETTINGS = GenerateSettings(model="fake-model", engine="hf", sampling=SamplingSpec(max_tokens=10))


@pytest.fixture(scope="module")
def demo():
    return load_dataset("demo")


def records_by_key(run: RunDir) -> dict:
    return run.generations.read()


def jsonl_keys(run: RunDir) -> list[tuple[int, int]]:
    lines = run.generations.path.read_text(encoding="utf-8").splitlines()
    return [(json.loads(line)["system_id"], json.loads(line)["turn"]) for line in lines]


# ------------------------------------------------------------------ demo data


def test_demo_set_loads_with_all_types_and_references(demo):
    assert resolve_data_path("demo") == demo_data_path()
    assert 4 <= len(demo.sessions) <= 6
    assert all(len(s.turns) == 5 for s in demo.sessions)
    assert {c.type for s in demo.sessions for t in s.turns for c in t.constraints} == {
        "action",
        "content",
        "background",
        "role",
        "format",
        "style",
    }
    assert {t.alignment for s in demo.sessions for t in s.turns} == {"aligned", "misaligned"}
    assert {s.group for s in demo.sessions} == {"dependent", "parallel"}
    assert missing_references(demo.sessions) == {}
    assert all(t.reference for s in demo.sessions for t in s.turns)


# ------------------------------------------------------------------ model history


def test_model_history_one_call_per_turn_with_own_replies(demo, tmp_path):
    engine = FakeEngine()
    run = RunDir(tmp_path / "run")
    summary = run_generation(engine, demo, list(demo.sessions), run, SETTINGS, progress=False)
    n = len(demo.sessions)
    assert summary.total_records == summary.new_records == 5 * n
    assert [len(call) for call in engine.calls] == [n] * 5  # one batched call per turn, all sessions
    records = records_by_key(run)
    for turn, call in enumerate(engine.calls, start=1):
        for session, conversation in zip(demo.sessions, call, strict=False):
            assert conversation == conversation_for_turn(
                session, turn, {i: records[(session.system_id, i)].response for i in range(1, turn)}
            )
            assert conversation[0] == {"role": "system", "content": session.system_prompt}
            assert [m["content"] for m in conversation if m["role"] == "assistant"] == [
                records[(session.system_id, i)].response for i in range(1, turn)
            ]
    first = records[(demo.sessions[0].system_id, 1)]
    assert first.status == "ok" and first.history == "model" and first.model == "fake-model"
    assert first.prompt_tokens and first.output_tokens == 4 and first.finish_reason == "stop"
    # Snapshot, manifest and stats.
    assert [s.system_id for s in load_run_sessions(run)] == [s.system_id for s in demo.sessions]
    stage = run.read_manifest()["stages"]["generate"]
    assert stage["status"] == "complete" and stage["sampling"] == {"max_tokens": 10}
    assert stage["sampling_defaults"] == {"max_tokens": 10} and stage["system_folded"] is False
    stats = json.loads(run.stats_path.read_text())
    assert [c["turn"] for c in stats["calls"]] == [1, 2, 3, 4, 5]
    assert all(c["requests"] == n and c["output_tokens"] == 4 * n for c in stats["calls"])
    assert stats["calls"][0]["finish_reasons"] == {"stop": n}
    assert stats["totals"]["requests"] == 5 * n and stats["totals"]["output_tokens"] == 20 * n
    # A rerun has nothing left to do and calls nothing.
    again = FakeEngine()
    assert run_generation(again, demo, list(demo.sessions), run, SETTINGS, progress=False).new_records == 0
    assert again.calls == []


def test_reference_history_one_call(demo, tmp_path):
    engine = FakeEngine()
    settings = GenerateSettings(
        model="fake-model", engine="hf", history="reference", sampling=SamplingSpec(max_tokens=10)
    )
    run = RunDir(tmp_path / "run")
    run_generation(engine, demo, list(demo.sessions[:3]), run, settings, progress=False)
    assert len(engine.calls) == 1 and len(engine.calls[0]) == 15
    conversation = engine.calls[0][4]  # session 1, turn 5
    session = demo.sessions[0]
    assert [m["content"] for m in conversation if m["role"] == "assistant"] == [t.reference for t in session.turns[:4]]
    assert all(r.history == "reference" for r in records_by_key(run).values())


def _demo_with_null_reference(tmp_path: Path) -> Path:
    raw = json.loads(demo_data_path().read_text(encoding="utf-8"))
    raw[1]["messages"][4]["content"] = None  # session 2, turn 2 reference
    raw[3]["messages"][2]["content"] = None  # session 4, turn 1 reference
    path = tmp_path / "with-nulls.json"
    path.write_text(json.dumps(raw, ensure_ascii=False), encoding="utf-8")
    return path


def test_reference_history_missing_references(tmp_path):
    data = load_dataset(_demo_with_null_reference(tmp_path))
    settings = GenerateSettings(model="fake-model", engine="hf", history="reference")
    with pytest.raises(SysbenchError) as error:
        run_generation(FakeEngine(), data, list(data.sessions), tmp_path / "a", settings, progress=False)
    assert "session 2: turns 2" in str(error.value) and "session 4: turns 1" in str(error.value)
    assert "--skip-missing-reference" in str(error.value)
    skip = GenerateSettings(model="fake-model", engine="hf", history="reference", skip_missing_reference=True)
    run = RunDir(tmp_path / "b")
    summary = run_generation(FakeEngine(), data, list(data.sessions), run, skip, progress=False)
    assert summary.skipped_sessions == [2, 4]
    assert {k[0] for k in records_by_key(run)} == {1, 3, 5}
    assert run.read_manifest()["stages"]["generate"]["skipped_sessions_missing_reference"] == [2, 4]
    assert [s.system_id for s in load_run_sessions(run)] == [1, 3, 5]


def test_reference_history_on_shared_file_lists_sessions(dataset, tmp_path):
    settings = GenerateSettings(model="fake-model", engine="hf", history="reference")
    sessions = dataset.select(limit=3)
    with pytest.raises(SysbenchError) as error:
        run_generation(FakeEngine(), dataset, sessions, tmp_path / "run", settings, progress=False)
    for session in sessions:
        assert f"session {session.system_id}: turns 3, 4" in str(error.value)


# ------------------------------------------------------------------ resume


def test_resume_after_kill_matches_uninterrupted_run(demo, tmp_path):
    sessions = list(demo.sessions)
    clean = RunDir(tmp_path / "clean")
    run_generation(FakeEngine(), demo, sessions, clean, SETTINGS, progress=False)

    for torn in (False, True):
        run = RunDir(tmp_path / f"killed-{torn}")
        with pytest.raises(Interrupted):
            run_generation(FakeEngine(fail_on_call=3), demo, sessions, run, SETTINGS, progress=False)
        assert {k[1] for k in records_by_key(run)} == {1, 2}  # turns 1-2 kept, turn 3 lost in flight
        if torn:
            with open(run.generations.path, "ab") as handle:
                handle.write(b'{"system_id": 1, "turn": 3, "user": "half a li')
        resumed = FakeEngine()
        summary = run_generation(resumed, demo, sessions, run, SETTINGS, progress=False)
        assert summary.new_records == 3 * len(sessions)
        assert len(resumed.calls) == 3  # continues at turn 3 with the stored replies as history
        assert records_by_key(run) == records_by_key(clean)
        keys = jsonl_keys(run)
        assert len(keys) == len(set(keys)) == 5 * len(sessions)
        stats = json.loads(run.stats_path.read_text())
        assert [c["turn"] for c in stats["calls"]] == [1, 2, 3, 4, 5]


def test_resume_mid_session_when_some_sessions_are_ahead(demo, tmp_path):
    run = RunDir(tmp_path / "run")
    run_generation(FakeEngine(), demo, list(demo.sessions[:2]), run, SETTINGS, progress=False)
    engine = FakeEngine()
    run_generation(engine, demo, list(demo.sessions), run, SETTINGS, progress=False)
    assert [len(call) for call in engine.calls] == [3] * 5
    clean = RunDir(tmp_path / "clean")
    run_generation(FakeEngine(), demo, list(demo.sessions), clean, SETTINGS, progress=False)
    assert records_by_key(run) == records_by_key(clean)
    assert len(load_run_sessions(run)) == len(demo.sessions)


def test_changed_settings_in_existing_run_are_errors(demo, tmp_path):
    run = RunDir(tmp_path / "run")
    sessions = list(demo.sessions[:1])
    run_generation(FakeEngine(), demo, sessions, run, SETTINGS, progress=False)
    changes = {
        "sampling.max_tokens": GenerateSettings(model="fake-model", engine="hf", sampling=SamplingSpec(max_tokens=16)),
        "sampling.temperature": GenerateSettings(
            model="fake-model", engine="hf", sampling=SamplingSpec(max_tokens=10, temperature=0.7)
        ),
        "'model'": GenerateSettings(model="other", engine="hf", sampling=SamplingSpec(max_tokens=10)),
        "'engine'": GenerateSettings(model="fake-model", engine="vllm", sampling=SamplingSpec(max_tokens=10)),
        "'history'": GenerateSettings(
            model="fake-model", engine="hf", history="reference", sampling=SamplingSpec(max_tokens=10)
        ),
    }
    for field_name, settings in changes.items():
        with pytest.raises(SysbenchError, match=field_name.replace(".", r"\.")):
            run_generation(FakeEngine(), demo, sessions, run, settings, progress=False)


# ------------------------------------------------------------------ over-length


def _long_dataset(tmp_path: Path):
    """One synthetic session whose history outgrows a small context: 40-word turns, 30-word replies."""
    raw = json.loads(demo_data_path().read_text(encoding="utf-8"))[:1]
    session = raw[0]
    session["system_prompt"] = session["messages"][0]["content"] = " ".join(["sys"] * 20)
    infos = {}
    for i, info in enumerate(session["prompt_infos"].values()):
        user = f"question {i + 1} " + " ".join(["word"] * 38)
        session["messages"][1 + 2 * i]["content"] = user
        infos[user] = info
    session["prompt_infos"] = infos
    path = tmp_path / "long.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    return load_dataset(path)


def test_overflow_error_names_session_turn_and_numbers(tmp_path):
    data = _long_dataset(tmp_path)
    run = RunDir(tmp_path / "run")
    with pytest.raises(SysbenchError) as error:
        run_generation(FakeEngine(context=120), data, list(data.sessions), run, SETTINGS, progress=False)
    message = str(error.value)
    # turn 1: 23 + 43 = 66 prompt tokens; turn 2 adds a 7-token reply and 43 -> 116 + 10 > 120
    assert "session 1, turn 2" in message and "116 tokens + 10 max tokens" in message and "120" in message
    assert set(records_by_key(run)) == {(1, 1)}  # the finished turn is kept


def test_overflow_truncate_history_drops_oldest_turns_keeps_system(tmp_path):
    data = _long_dataset(tmp_path)
    settings = GenerateSettings(
        model="fake-model", engine="hf", sampling=SamplingSpec(max_tokens=10), on_overflow="truncate-history"
    )
    engine = FakeEngine(context=120)
    run = RunDir(tmp_path / "run")
    run_generation(engine, data, list(data.sessions), run, settings, progress=False)
    records = records_by_key(run)
    assert [records[(1, t)].overflow for t in range(1, 6)] == [None] + [
        "truncated-history:1",
        "truncated-history:2",
        "truncated-history:3",
        "truncated-history:4",
    ]
    assert all(r.status == "ok" for r in records.values())
    session = data.sessions[0]
    for turn, call in enumerate(engine.calls, start=1):
        (conversation,) = call
        assert conversation[0]["role"] == "system" and conversation[-1]["content"] == session.turn(turn).user
        assert engine.count_prompt_tokens(conversation) + 10 <= 120
    stats = json.loads(run.stats_path.read_text())
    assert [c["truncated"] for c in stats["calls"]] == [0, 1, 1, 1, 1]


def test_overflow_skip_skips_the_rest_of_the_session(tmp_path, demo):
    data = _long_dataset(tmp_path)
    settings = GenerateSettings(
        model="fake-model", engine="hf", sampling=SamplingSpec(max_tokens=10), on_overflow="skip"
    )
    engine = FakeEngine(context=120)
    run = RunDir(tmp_path / "run")
    summary = run_generation(engine, data, list(data.sessions), run, settings, progress=False)
    records = records_by_key(run)
    assert records[(1, 1)].status == "ok"
    assert records[(1, 2)].status == "skipped" and records[(1, 2)].response is None
    assert records[(1, 2)].overflow == "skipped"
    assert all(records[(1, t)].status == "skipped" and records[(1, t)].overflow is None for t in (3, 4, 5))
    assert "history turn 2 was skipped" in records[(1, 3)].extra["skip_reason"]
    assert len(engine.calls) == 1 and summary.skipped_records == 4
    assert run.read_manifest()["stages"]["generate"]["n_skipped_records"] == 4


def test_drop_oldest_turns_and_fold_helpers():
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "u3"},
    ]
    assert drop_oldest_turns(messages, 1) == [messages[0]] + messages[3:]
    assert drop_oldest_turns(messages, 2) == [messages[0], messages[5]]
    folded = fold_system_message(messages)
    assert folded[0] == {"role": "user", "content": "S" + SYSTEM_FOLD_SEPARATOR + "u1"} and len(folded) == 5


# ------------------------------------------------------------------ system folding, ranks, CLI options


def test_system_role_folding(demo, tmp_path):
    engine = FakeEngine(system_role=False)
    run = RunDir(tmp_path / "run")
    run_generation(engine, demo, list(demo.sessions[:2]), run, SETTINGS, progress=False)
    for call in engine.calls:
        for session, conversation in zip(demo.sessions, call, strict=False):
            assert all(m["role"] != "system" for m in conversation)
            assert conversation[0]["content"] == session.system_prompt + SYSTEM_FOLD_SEPARATOR + session.turn(1).user
    stage = run.read_manifest()["stages"]["generate"]
    assert stage["system_folded"] is True and stage["system_fold_separator"] == SYSTEM_FOLD_SEPARATOR


def test_only_the_primary_writes(demo, tmp_path):
    engine = FakeEngine(is_primary=False)
    run = RunDir(tmp_path / "run")
    summary = run_generation(engine, demo, list(demo.sessions[:2]), run, SETTINGS, progress=False)
    assert len(engine.calls) == 5 and summary.new_records == 10  # it still takes part in every call
    assert not run.path.exists()


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["generate", "--data", "demo", "--model", "m", "--out", "o"] + argv)


def test_engine_options_and_session_ids():
    args = _parse(
        ["--engine", "vllm", "--tensor-parallel-size", "4", "--no-prefix-caching", "--seed", "3", "--dtype", "bfloat16"]
    )
    assert engine_options_from_args("vllm", args) == {
        "tensor_parallel_size": 4,
        "enable_prefix_caching": False,
        "seed": 3,
        "dtype": "bfloat16",
    }
    args = _parse(["--engine", "hf", "--batch-size", "8", "--device-map", "auto"])
    assert engine_options_from_args("hf", args) == {"batch_size": 8, "device_map": "auto"}
    args = _parse(["--engine", "openai", "--base-url", "http://x/v1", "--concurrency", "4", "--seed", "1"])
    assert engine_options_from_args("openai", args) == {"base_url": "http://x/v1", "concurrency": 4}
    with pytest.raises(SysbenchError, match="--tensor-parallel-size is a flag of the vllm engine"):
        engine_options_from_args("hf", _parse(["--engine", "hf", "--tensor-parallel-size", "2"]))
    assert parse_session_ids("1,2,5-7,2") == [1, 2, 5, 6, 7]
    with pytest.raises(SysbenchError, match="--sessions"):
        parse_session_ids("3-x")
