"""`generate` on MT-Eval: only answered turns, one engine call per answered-turn index, given context, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_engine import FakeEngine, Interrupted

from sysbench_gpu.benchmarks.mteval.tasks import DEFAULT_SYSTEM_MESSAGE
from sysbench_gpu.benchmarks.registry import load_dataset, load_run_sessions
from sysbench_gpu.cli import main
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.engines.base import SamplingSpec
from sysbench_gpu.generation.run import run_generation
from sysbench_gpu.generation.settings import GenerateSettings

SETTINGS = GenerateSettings(model="fake-model", engine="hf", sampling=SamplingSpec(max_tokens=10))


def _turn(user: str, sys: str, answered: bool) -> dict:
    return {"user": user, "sys": sys, "id": user, "do_inference": answered}


# Dialogue 1: context, answered, context, answered (the shape of follow-up).
# Dialogue 2: answered, answered, context, answered. Dialogue 3: one answered turn.
DIALOGUES = [
    {
        "id": "a",
        "conv": [_turn("a1", "A1", False), _turn("a2", "A2", True), _turn("a3", "A3", False), _turn("a4", "A4", True)],
    },
    {
        "id": "b",
        "conv": [_turn("b1", "B1", True), _turn("b2", "B2", True), _turn("b3", "B3", False), _turn("b4", "B4", True)],
    },
    {"id": "c", "conv": [_turn("c1", "C1", True)]},
]
ANSWERED = {1: [2, 4], 2: [1, 2, 4], 3: [1]}


def _write(tmp_path: Path, dialogues: list[dict] = DIALOGUES, name: str = "follow-up_multi.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(d) + "\n" for d in dialogues), encoding="utf-8")
    return path


def _m(role: str, content: str) -> dict:
    return {"role": role, "content": content}


SYSTEM = _m("system", DEFAULT_SYSTEM_MESSAGE)


def test_call_k_holds_the_kth_answered_turns_with_own_replies_and_given_context(tmp_path):
    data = load_dataset(_write(tmp_path))
    engine = FakeEngine()
    run = RunDir(tmp_path / "run")
    summary = run_generation(engine, data, list(data.sessions), run, SETTINGS, progress=False)
    records = run.generations.read()
    # Only answered turns get records, keyed by their position in conv.
    assert sorted(records) == sorted((sid, t) for sid, turns in ANSWERED.items() for t in turns)
    assert summary.total_records == 6
    # Call k: the k-th answered turn of every dialogue that has one, in file order.
    assert engine.session_keys == [["1", "2", "3"], ["1", "2"], ["2"]]
    assert [[c[-1]["content"] for c in call] for call in engine.calls] == [["a2", "b1", "c1"], ["a4", "b2"], ["b4"]]
    reply = {key: record.response for key, record in records.items()}
    # Each history holds the model's own earlier replies and the given sys of context turns.
    assert engine.calls[0][0] == [SYSTEM, _m("user", "a1"), _m("assistant", "A1"), _m("user", "a2")]
    assert engine.calls[1][0] == [
        SYSTEM,
        _m("user", "a1"),
        _m("assistant", "A1"),
        _m("user", "a2"),
        _m("assistant", reply[(1, 2)]),
        _m("user", "a3"),
        _m("assistant", "A3"),
        _m("user", "a4"),
    ]
    assert engine.calls[2][0] == [
        SYSTEM,
        _m("user", "b1"),
        _m("assistant", reply[(2, 1)]),
        _m("user", "b2"),
        _m("assistant", reply[(2, 2)]),
        _m("user", "b3"),
        _m("assistant", "B3"),
        _m("user", "b4"),
    ]
    assert engine.calls[0][2] == [SYSTEM, _m("user", "c1")]
    assert all(r.history == "model" and r.user == data.by_id()[r.system_id].turn(r.turn).user for r in records.values())
    stats = json.loads(run.stats_path.read_text())
    assert [(c["turn"], c["requests"]) for c in stats["calls"]] == [(1, 3), (2, 2), (3, 1)]
    stage = run.read_manifest()["stages"]["generate"]
    assert {
        k: stage[k]
        for k in ("benchmark", "task", "history", "distractor_turns", "distractor_seed", "system_message", "n_records")
    } == {
        "benchmark": "mteval",
        "task": "follow-up",
        "history": "model",
        "distractor_turns": 0,
        "distractor_seed": None,
        "system_message": DEFAULT_SYSTEM_MESSAGE,
        "n_records": 6,
    }
    # The snapshot is MT-Eval JSON Lines and reads back equal.
    assert load_run_sessions(run) == list(data.sessions)


def test_killed_between_calls_then_rerun_gives_identical_records(tmp_path):
    data = load_dataset(_write(tmp_path))
    clean = RunDir(tmp_path / "clean")
    run_generation(FakeEngine(), data, list(data.sessions), clean, SETTINGS, progress=False)
    run = RunDir(tmp_path / "killed")
    with pytest.raises(Interrupted):
        run_generation(FakeEngine(fail_on_call=2), data, list(data.sessions), run, SETTINGS, progress=False)
    assert sorted(run.generations.read()) == [(1, 2), (2, 1), (3, 1)]  # call 1 kept, call 2 lost in flight
    resumed = FakeEngine()
    assert run_generation(resumed, data, list(data.sessions), run, SETTINGS, progress=False).new_records == 3
    assert len(resumed.calls) == 2
    assert run.generations.read() == clean.generations.read()
    lines = run.generations.path.read_text(encoding="utf-8").splitlines()
    keys = [(json.loads(line)["system_id"], json.loads(line)["turn"]) for line in lines]
    assert len(keys) == len(set(keys)) == 6
    assert [c["turn"] for c in json.loads(run.stats_path.read_text())["calls"]] == [1, 2, 3]


def test_reference_history_is_one_call_with_sys_everywhere(tmp_path):
    data = load_dataset(_write(tmp_path))
    engine = FakeEngine()
    settings = GenerateSettings(
        model="fake-model", engine="hf", history="reference", sampling=SamplingSpec(max_tokens=10)
    )
    run = RunDir(tmp_path / "run")
    run_generation(engine, data, list(data.sessions), run, settings, progress=False)
    assert len(engine.calls) == 1 and len(engine.calls[0]) == 6
    assert engine.calls[0][4] == [  # dialogue 2, turn 4
        SYSTEM,
        _m("user", "b1"),
        _m("assistant", "B1"),
        _m("user", "b2"),
        _m("assistant", "B2"),
        _m("user", "b3"),
        _m("assistant", "B3"),
        _m("user", "b4"),
    ]
    assert {r.history for r in run.generations.read().values()} == {"reference"}
    assert json.loads(run.stats_path.read_text())["calls"][0]["turn"] == "all"


def test_reference_history_needs_sys_of_earlier_turns(tmp_path):
    no_gold = json.loads(json.dumps(DIALOGUES))
    no_gold[1]["conv"][1]["sys"] = ""  # dialogue 2, turn 2: answered, no reference (as in global-inst)
    data = load_dataset(_write(tmp_path, no_gold))
    settings = GenerateSettings(model="fake-model", engine="hf", history="reference")
    with pytest.raises(SysbenchError, match=r"session 2: turns 2\)"):
        run_generation(FakeEngine(), data, list(data.sessions), tmp_path / "run", settings, progress=False)
    skip = GenerateSettings(model="fake-model", engine="hf", history="reference", skip_missing_reference=True)
    run = RunDir(tmp_path / "skip")
    assert run_generation(FakeEngine(), data, list(data.sessions), run, skip, progress=False).skipped_sessions == [2]
    assert sorted(run.generations.read()) == [(1, 2), (1, 4), (3, 1)]


def test_system_message_is_used_recorded_and_locked(tmp_path):
    path = _write(tmp_path)
    terse = load_dataset(path, system_message="Be terse.")
    engine = FakeEngine()
    run = RunDir(tmp_path / "run")
    run_generation(engine, terse, list(terse.sessions), run, SETTINGS, progress=False)
    assert {c[0]["content"] for call in engine.calls for c in call} == {"Be terse."}
    assert run.read_manifest()["stages"]["generate"]["system_message"] == "Be terse."
    default = load_dataset(path)
    with pytest.raises(SysbenchError, match="field 'system_message' was 'Be terse.' in this run"):
        run_generation(FakeEngine(), default, list(default.sessions), run, SETTINGS, progress=False)
    none = load_dataset(path, system_message="")
    engine = FakeEngine()
    run = RunDir(tmp_path / "none")
    run_generation(engine, none, list(none.sessions), run, SETTINGS, progress=False)
    assert engine.calls[0][2] == [_m("user", "c1")]  # "" sends no system message
    assert run.read_manifest()["stages"]["generate"]["system_message"] == ""


def test_sysbench_ablations_are_refused_on_mteval(tmp_path):
    data = load_dataset(_write(tmp_path))
    single = GenerateSettings(model="fake-model", engine="hf", history="single-turn")
    with pytest.raises(SysbenchError, match="single-turn is a SysBench ablation; MT-Eval's single-turn setting"):
        run_generation(FakeEngine(), data, list(data.sessions), tmp_path / "a", single, progress=False)
    distract = GenerateSettings(model="fake-model", engine="hf", distractor_turns=2)
    with pytest.raises(SysbenchError, match="--distractor-turns is a SysBench ablation"):
        run_generation(FakeEngine(), data, list(data.sessions), tmp_path / "b", distract, progress=False)


def test_cli_follow_up_limit_two_is_six_records_in_three_calls(mteval_data_dir, smollm2_path, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(
        [
            "generate",
            "--data",
            str(mteval_data_dir / "follow-up_multi.jsonl"),
            "--model",
            "smollm2",
            "--engine",
            "hf",
            "--limit",
            "2",
            "--max-tokens",
            "1",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    assert "6 records (6 new, 0 skipped)" in capsys.readouterr().out
    run = RunDir(out)
    assert sorted(run.generations.read()) == [(1, 3), (1, 4), (1, 5), (2, 3), (2, 4), (2, 5)]
    stats = json.loads(run.stats_path.read_text())
    assert [(c["turn"], c["requests"]) for c in stats["calls"]] == [(1, 2), (2, 2), (3, 2)]
    stage = run.read_manifest()["stages"]["generate"]
    assert stage["benchmark"] == "mteval" and stage["task"] == "follow-up"
    assert stage["system_message"] == DEFAULT_SYSTEM_MESSAGE and stage["history"] == "model"
    # The --system-message of a rerun must match the run's.
    assert (
        main(
            [
                "generate",
                "--data",
                str(mteval_data_dir / "follow-up_multi.jsonl"),
                "--model",
                "smollm2",
                "--engine",
                "hf",
                "--limit",
                "2",
                "--max-tokens",
                "1",
                "--out",
                str(out),
                "--system-message",
                "Be terse.",
            ]
        )
        == 2
    )
    assert "field 'system_message'" in capsys.readouterr().err
