"""`generate --history single-turn` and `--distractor-turns K` on SysBench: exact conversations, calls, manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_engine import FakeEngine, Interrupted

from sysbench_gpu.benchmarks.registry import load_dataset
from sysbench_gpu.cli import main
from sysbench_gpu.core.ablation_files import DISTRACTORS_FILE, Exchange, read_distractors
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.locks import stage_lock
from sysbench_gpu.core.messages import SYSTEM_FOLD_SEPARATOR
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.engines.base import SamplingSpec
from sysbench_gpu.generation.run import run_generation
from sysbench_gpu.generation.settings import GenerateSettings

SAMPLING = SamplingSpec(max_tokens=10)


def _settings(**kwargs) -> GenerateSettings:
    return GenerateSettings(model="smollm2", engine="hf", sampling=SAMPLING, **kwargs)


def _m(role: str, content: str) -> dict:
    return {"role": role, "content": content}


@pytest.fixture(scope="module")
def raw_sessions(sessions_file: Path) -> dict[int, dict]:
    """The shared file read as plain JSON, independently of our loader."""
    return {s["system_id"]: s for s in json.loads(sessions_file.read_text(encoding="utf-8"))}


def _user(raw: dict, turn: int) -> str:
    return raw["messages"][2 * turn - 1]["content"]


def _reference(raw: dict, turn: int) -> str:
    return raw["messages"][2 * turn]["content"]


# ------------------------------------------------------------------ single-turn


def test_single_turn_is_one_call_of_ten_requests(dataset, tmp_path):
    sessions = dataset.select(limit=2)
    engine = FakeEngine()
    run = RunDir(tmp_path / "run")
    run_generation(engine, dataset, sessions, run, _settings(history="single-turn"), progress=False)
    assert len(engine.calls) == 1 and len(engine.calls[0]) == 10
    conversations = iter(engine.calls[0])
    for session in sessions:
        for turn in session.turns:
            assert next(conversations) == [_m("system", session.system_prompt), _m("user", turn.user)]
    # Replica placement: every conversation carries its session id.
    assert engine.session_keys == [[str(s.system_id) for s in sessions for _ in range(5)]]
    records = run.generations.read()
    assert len(records) == 10 and {r.history for r in records.values()} == {"single-turn"}
    stats = json.loads(run.stats_path.read_text())
    assert [(c["turn"], c["requests"]) for c in stats["calls"]] == [("all", 10)]
    stage = run.read_manifest()["stages"]["generate"]
    assert {
        k: stage[k] for k in ("benchmark", "history", "distractor_turns", "distractor_seed", "system_message", "task")
    } == {
        "benchmark": "sysbench",
        "history": "single-turn",
        "distractor_turns": 0,
        "distractor_seed": None,
        "system_message": None,
        "task": None,
    }
    assert not (run.path / DISTRACTORS_FILE).exists()


def test_cli_single_turn_limit_two_is_one_call_of_ten(sessions_file, smollm2_path, tmp_path, capsys):
    out = tmp_path / "run"
    # Sessions 289 and 461 have the shortest prompts of the file (about 5x shorter than sessions 1-2): a fast CPU call.
    assert (
        main(
            [
                "generate",
                "--data",
                str(sessions_file),
                "--model",
                "smollm2",
                "--engine",
                "hf",
                "--sessions",
                "289,461",
                "--limit",
                "2",
                "--history",
                "single-turn",
                "--max-tokens",
                "1",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    assert "10 records (10 new, 0 skipped)" in capsys.readouterr().out
    stats = json.loads((out / "stats.json").read_text())
    assert [(c["turn"], c["requests"]) for c in stats["calls"]] == [("all", 10)]
    assert {r.history for r in RunDir(out).generations.read().values()} == {"single-turn"}


# ------------------------------------------------------------------ distractors


def test_two_distractors_before_turn_one_exact_conversations(dataset, raw_sessions, tmp_path):
    sessions = dataset.select(limit=2)
    engine = FakeEngine()
    run = RunDir(tmp_path / "run")
    run_generation(engine, dataset, sessions, run, _settings(distractor_turns=2), progress=False)
    assert [len(call) for call in engine.calls] == [2] * 5
    records = run.generations.read()
    first = raw_sessions[1]
    # Pinned draw (seed 0, K 2) over the whole file's pool: session 484 turn 2, then session 363 turn 1.
    d1, d2 = raw_sessions[484], raw_sessions[363]
    distractors = [
        _m("user", _user(d1, 2)),
        _m("assistant", _reference(d1, 2)),
        _m("user", _user(d2, 1)),
        _m("assistant", _reference(d2, 1)),
    ]
    assert _user(d2, 1) == "你能告诉我2022年11月的美国中期选举的结果吗？"
    for turn in range(1, 6):
        own = []
        for earlier in range(1, turn):
            own += [_m("user", _user(first, earlier)), _m("assistant", records[(1, earlier)].response)]
        expected = [_m("system", first["system_prompt"])] + distractors + own + [_m("user", _user(first, turn))]
        assert engine.calls[turn - 1][0] == expected
    # Session 2 gets its own draw: sessions 244 (turn 2) and 35 (turn 1).
    second = engine.calls[0][1]
    assert [second[1]["content"], second[3]["content"]] == [_user(raw_sessions[244], 2), _user(raw_sessions[35], 1)]
    # The run records the ablation and the exchanges, so later stages rebuild the same conversations.
    stage = run.read_manifest()["stages"]["generate"]
    assert (stage["history"], stage["distractor_turns"], stage["distractor_seed"]) == ("model", 2, 0)
    assert stage["distractors_file"] == DISTRACTORS_FILE
    count, chosen = read_distractors(run.path / DISTRACTORS_FILE)
    assert count == 2 and sorted(chosen) == [1, 2]
    assert chosen[1] == (
        Exchange(484, 2, _user(d1, 2), _reference(d1, 2)),
        Exchange(363, 1, _user(d2, 1), _reference(d2, 1)),
    )


def test_distractors_with_reference_and_single_turn_history(tmp_path):
    demo = load_dataset("demo")
    session = demo.sessions[0]
    engine = FakeEngine()
    run_generation(
        engine, demo, [session], tmp_path / "ref", _settings(history="reference", distractor_turns=1), progress=False
    )
    (call,) = engine.calls
    exchange = call[0][1:3]
    assert exchange[0]["role"] == "user" and exchange[0]["content"] not in {t.user for t in session.turns}
    assert call[2] == [
        _m("system", session.system_prompt),
        *exchange,
        _m("user", session.turn(1).user),
        _m("assistant", session.turn(1).reference),
        _m("user", session.turn(2).user),
        _m("assistant", session.turn(2).reference),
        _m("user", session.turn(3).user),
    ]
    engine = FakeEngine()
    run_generation(
        engine,
        demo,
        [session],
        tmp_path / "single",
        _settings(history="single-turn", distractor_turns=1),
        progress=False,
    )
    (call,) = engine.calls
    assert call[3] == [_m("system", session.system_prompt), *exchange, _m("user", session.turn(4).user)]


def test_distractor_run_resumes_after_a_kill(dataset, tmp_path):
    sessions = dataset.select(limit=2)
    settings = _settings(distractor_turns=2, distractor_seed=7)
    clean = RunDir(tmp_path / "clean")
    run_generation(FakeEngine(), dataset, sessions, clean, settings, progress=False)
    run = RunDir(tmp_path / "killed")
    with pytest.raises(Interrupted):
        run_generation(FakeEngine(fail_on_call=3), dataset, sessions, run, settings, progress=False)
    resumed = FakeEngine()
    run_generation(resumed, dataset, sessions, run, settings, progress=False)
    assert len(resumed.calls) == 3
    assert run.generations.read() == clean.generations.read()
    assert len(run.generations.path.read_text(encoding="utf-8").splitlines()) == 10
    assert (run.path / DISTRACTORS_FILE).read_text() == (clean.path / DISTRACTORS_FILE).read_text()


def test_overflow_truncates_distractors_first_and_skip_records(tmp_path):
    demo = load_dataset("demo")
    session = demo.sessions[0]
    settings = _settings(history="single-turn", distractor_turns=2, on_overflow="truncate-history")
    probe = FakeEngine()
    run_generation(probe, demo, [session], tmp_path / "probe", settings, progress=False)
    full = probe.calls[0][0]  # turn 1: system, two exchanges, user turn 1
    engine = FakeEngine(context=probe.count_prompt_tokens(full) + 10 - 1)
    run = RunDir(tmp_path / "run")
    run_generation(engine, demo, [session], run, settings, progress=False)
    assert engine.calls[0][0] == [full[0]] + full[3:]  # the first exchange dropped, the system message kept
    assert run.generations.read()[(session.system_id, 1)].overflow == "truncated-history:1"
    skip = _settings(history="single-turn", distractor_turns=2, on_overflow="skip")
    run = RunDir(tmp_path / "skip")
    run_generation(FakeEngine(context=20), demo, [session], run, skip, progress=False)
    assert {(r.status, r.overflow) for r in run.generations.read().values()} == {("skipped", "skipped")}


def test_folded_system_message_goes_into_the_first_distractor(dataset, tmp_path):
    session = dataset.sessions[0]
    engine = FakeEngine(system_role=False)
    run = RunDir(tmp_path / "run")
    run_generation(engine, dataset, [session], run, _settings(distractor_turns=2), progress=False)
    first = engine.calls[0][0]
    assert first[0]["role"] == "user" and first[0]["content"].startswith(session.system_prompt + SYSTEM_FOLD_SEPARATOR)
    assert first[0]["content"].endswith(_user_of(dataset, 484, 2))
    assert run.read_manifest()["stages"]["generate"]["system_folded"] is True


def _user_of(dataset, system_id: int, turn: int) -> str:
    return dataset.by_id()[system_id].turn(turn).user


def test_an_ablation_run_holds_the_stage_lock(dataset, tmp_path):
    run = RunDir(tmp_path / "run")
    with stage_lock(run.path, "generate"), pytest.raises(SysbenchError, match="generate"):
        run_generation(
            FakeEngine(), dataset, dataset.select(limit=1), run, _settings(history="single-turn"), progress=False
        )
    assert not run.generations.path.exists()


# ------------------------------------------------------------------ one ablation per run directory


@pytest.mark.parametrize(
    ("first", "flags", "field"),
    [
        ({"history": "single-turn"}, ["--history", "model"], "history"),
        ({"distractor_turns": 2}, [], "distractor_turns"),
        ({"distractor_turns": 2}, ["--distractor-turns", "2", "--distractor-seed", "1"], "distractor_seed"),
        ({}, ["--distractor-turns", "1"], "distractor_turns"),
    ],
)
def test_mixing_ablations_in_one_out_is_one_line_naming_the_field(
    dataset, sessions_file, tmp_path, capsys, first, flags, field
):
    out = tmp_path / "run"
    run_generation(FakeEngine(), dataset, dataset.select(limit=1), out, _settings(**first), progress=False)
    before = (out / "generations.jsonl").read_bytes()
    code = main(
        [
            "generate",
            "--data",
            str(sessions_file),
            "--model",
            "smollm2",
            "--engine",
            "hf",
            "--limit",
            "1",
            "--max-tokens",
            "10",
            "--out",
            str(out),
            *flags,
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"field '{field}' was" in err and "one run directory holds one ablation" in err
    assert (out / "generations.jsonl").read_bytes() == before


def test_distractor_flag_errors(sessions_file, tmp_path, capsys):
    base = [
        "generate",
        "--data",
        str(sessions_file),
        "--model",
        "smollm2",
        "--engine",
        "hf",
        "--out",
        str(tmp_path / "r"),
    ]
    assert main(base + ["--distractor-seed", "3"]) == 2
    assert "--distractor-seed needs --distractor-turns" in capsys.readouterr().err
    assert main(base + ["--distractor-turns", "-1"]) == 2
    assert "--distractor-turns must be 0 or more" in capsys.readouterr().err
    assert main(base + ["--system-message", "x"]) == 2
    assert "--system-message applies to MT-Eval files only" in capsys.readouterr().err
