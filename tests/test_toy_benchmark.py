"""A third benchmark, kept in tests, through every stage by the real CLI: adding a benchmark is one folder.

``toy_benchmark/benchmark.py`` registers ``ToyKeywords`` with ``@register_benchmark`` when it is
imported, as the built-ins do; the fixture imports it and keeps it registered for one test
only (``registered``), so no other test sees it. Data, generation (``--benchmark toy``, an
OpenAI-compatible stub that echoes the user), rule judging (no judge options), metrics,
compare, report and explore all go through the shared stages, which never name it.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
from openai_stub import OpenAIStub, Reply

from sysbench_gpu.benchmarks.registry import REGISTRY, load_run_sessions, registered, save_run_sessions
from sysbench_gpu.cli import main
from sysbench_gpu.core.rundir import RunDir

KEY_ENV = "SYSBENCH_TOY_TEST_KEY"

# 3 sessions x 2 turns. The stub echoes the user's message, so a turn scores 10 exactly
# when its user message names the keyword: session 1 [10, 0], 2 [10, 10], 3 [10, 0].
SESSIONS = [
    {
        "id": 1,
        "topic": "fruit",
        "system": "Answer in one line.",
        "turns": [
            {"user": "Name a yellow fruit: banana?", "keyword": "banana"},
            {"user": "And a red one?", "keyword": "cherry"},
        ],
    },
    {
        "id": 2,
        "topic": "colour",
        "system": "Answer in one word.",
        "turns": [{"user": "Say Blue.", "keyword": "blue"}, {"user": "Now say green.", "keyword": "green"}],
    },
    {
        "id": 3,
        "topic": "animal",
        "system": "Answer in one line.",
        "turns": [
            {"user": "Which animal barks? A dog?", "keyword": "dog"},
            {"user": "Which animal meows?", "keyword": "cat"},
        ],
    },
]
SCORES = {(1, 1): 10.0, (1, 2): 0.0, (2, 1): 10.0, (2, 2): 10.0, (3, 1): 10.0, (3, 2): 0.0}
USER = {(s["id"], i): t["user"] for s in SESSIONS for i, t in enumerate(s["turns"], start=1)}


@pytest.fixture
def toy():
    """The toy benchmark, registered for this test only (the first import registers it, as the built-ins do)."""
    module = importlib.import_module("toy_benchmark.benchmark")
    with registered(module.ToyKeywords) as benchmark:
        yield benchmark
    assert "toy" not in REGISTRY.names()


@pytest.fixture
def toy_data(tmp_path: Path) -> Path:
    path = tmp_path / "toy.jsonl"
    lines = [{"toy_benchmark": 1}, *SESSIONS]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def echo(body: dict[str, Any], n: int) -> Reply:
    return Reply(text=f"You said: {body['messages'][-1]['content']}", prompt_tokens=12, completion_tokens=6)


def silent(body: dict[str, Any], n: int) -> Reply:
    return Reply(text="I would rather not say.", prompt_tokens=12, completion_tokens=6)


def generate(data: Path, out: Path, responder, monkeypatch, *extra: str) -> OpenAIStub:
    monkeypatch.setenv(KEY_ENV, "sk-toy-test")
    with OpenAIStub(responder) as stub:
        code = main(
            [
                "generate",
                "--benchmark",
                "toy",
                "--data",
                str(data),
                "--engine",
                "openai",
                "--model",
                "stub-model",
                "--out",
                str(out),
                "--base-url",
                stub.base_url,
                "--api-key-env",
                KEY_ENV,
                "--max-tokens",
                "32",
                "--no-progress",
                *extra,
            ]
        )
    assert code == 0
    return stub


def cli_json(capsys, *argv: str) -> Any:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_toy_data_is_told_apart_by_content(toy, toy_data, capsys):
    assert toy.claims(toy_data.read_text())
    assert [b.name for b in REGISTRY.all() if b.claims(toy_data.read_text())] == ["toy"]
    stats = cli_json(capsys, "data", "stats", str(toy_data))  # no --benchmark: detected by content
    assert stats["n_sessions"] == 3 and stats["n_turns"] == 6
    assert stats["topics"] == {"animal": 1, "colour": 1, "fruit": 1}
    assert main(["data", "stats", str(toy_data), "--benchmark", "toy"]) == 0
    assert "3 toy sessions, 6 turns; topics: animal 1, colour 1, fruit 1" in capsys.readouterr().out
    assert main(["data", "validate", str(toy_data), "--benchmark", "toy"]) == 0
    assert "3 sessions, valid" in capsys.readouterr().out


def test_toy_runs_through_every_stage(toy, toy_data, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"

    # generate: one engine call per turn, each turn seeing the model's own earlier reply.
    stub = generate(toy_data, run, echo, monkeypatch)
    rundir = RunDir(run)
    records = rundir.generations.read()
    assert set(records) == set(SCORES)
    assert {key: r.response for key, r in records.items()} == {key: f"You said: {USER[key]}" for key in SCORES}
    assert all(r.status == "ok" and r.user == USER[key] for key, r in records.items())
    turn2 = next(r["messages"] for r in stub.requests if r["messages"][-1]["content"] == USER[(1, 2)])
    assert turn2 == [
        {"role": "system", "content": "Answer in one line."},
        {"role": "user", "content": USER[(1, 1)]},
        {"role": "assistant", "content": f"You said: {USER[(1, 1)]}"},
        {"role": "user", "content": USER[(1, 2)]},
    ]
    assert len(stub.requests) == 6
    sessions = load_run_sessions(rundir)  # sessions.json in the toy's own format, detected by content
    assert [s.benchmark for s in sessions] == ["toy"] * 3
    assert rundir.sessions_path.read_text().splitlines()[0] == '{"toy_benchmark": 1}'
    stage = rundir.read_manifest()["stages"]["generate"]
    assert stage["benchmark"] == "toy" and stage["status"] == "complete" and stage["n_records"] == 6
    assert stage["keywords"] == ["banana", "blue", "cat", "cherry", "dog", "green"]  # generation_manifest

    # judge with no judge options: the keyword rule scores every turn.
    capsys.readouterr()
    assert main(["judge", str(run)]) == 0
    assert "scored by rule 6" in capsys.readouterr().out
    judgments = rundir.judgments.read()
    assert {key: j.score for key, j in judgments.items()} == SCORES
    assert {j.scorer for j in judgments.values()} == {"keyword"}
    assert judgments[(1, 2)].reasoning == "the reply does not name 'cherry'"
    assert judgments[(1, 1)].parse_status == "ok" and judgments[(1, 1)].judge_model is None
    judge_stage = rundir.read_manifest()["stages"]["judge"]
    assert judge_stage["backend"] == "rules" and judge_stage["scorers"] == ["keyword"]
    assert main(["judge", str(run)]) == 0  # resumable: nothing left to score
    assert "already judged 6" in capsys.readouterr().out

    # metrics: the toy's numbers, as JSON and as its text.
    metrics = cli_json(capsys, "metrics", str(run))
    assert metrics["benchmark"] == "toy" and metrics["model"] == "stub-model"
    assert (metrics["n_sessions"], metrics["n_turns"]) == (3, 6)
    assert metrics["mean_score"] == pytest.approx(40 / 6, abs=1e-4)
    assert metrics["pass_rate"] == pytest.approx(4 / 6, abs=1e-4)
    assert metrics["by_turn"] == {"1": 10.0, "2": pytest.approx(10 / 3, abs=1e-4)}
    assert metrics["by_session"] == {"1": 5.0, "2": 10.0, "3": 5.0}
    low, high = metrics["mean_score_ci"]
    assert 5.0 <= low <= metrics["mean_score"] <= high <= 10.0
    assert metrics["partial"] is False and metrics["scorers"] == ["keyword"]
    assert main(["metrics", str(run)]) == 0
    text = capsys.readouterr().out
    assert "3 sessions, 6 turns" in text and "mean score  6.67" in text and "pass rate   66.7%" in text

    # compare: a second run whose replies never name a keyword.
    other = tmp_path / "silent"
    generate(toy_data, other, silent, monkeypatch)
    assert main(["judge", str(other)]) == 0
    compared = cli_json(capsys, "compare", str(run), str(other))
    assert compared["baseline"] == "run"
    assert compared["runs"] == [{"label": "silent", "mean_score": 0.0, "delta": pytest.approx(-40 / 6, abs=1e-4)}]

    # report: the files the toy's report writes.
    report = tmp_path / "report"
    capsys.readouterr()
    assert main(["report", str(run), str(other), "--out", str(report), "--formats", "png"]) == 0
    assert f"wrote 2 table files, 1 figure files, report.md and report.json to {report}" in capsys.readouterr().out
    assert sorted(p.relative_to(report).as_posix() for p in report.rglob("*") if p.is_file()) == [
        "figures/toy_scores.png",
        "report.json",
        "report.md",
        "tables/toy_scores.md",
        "tables/toy_scores.tex",
    ]
    summary = json.loads((report / "report.json").read_text())
    assert summary["benchmark"] == "toy" and [r["label"] for r in summary["runs"]] == ["run", "silent"]
    assert [r["mean_score"] for r in summary["runs"]] == [pytest.approx(40 / 6, abs=1e-4), 0.0]
    markdown = (report / "report.md").read_text()
    assert markdown.startswith("# Toy keywords") and "| run | **6.67** | **66.67** |" in markdown
    assert "| silent | 0.00 | 0.00 |" in markdown

    # explore: the site names the toy's sessions, with the rule's scores and the keywords.
    site = tmp_path / "explore"
    assert main(["explore", str(run), "--out", str(site)]) == 0
    from sysbench_gpu.explore.scripts import read_data_file

    index = read_data_file(site / "data" / "index.js")
    assert index["benchmarks"]["toy"]["title"] == "Toy keywords" and index["benchmarks"]["toy"]["outcome"] == "score"
    assert [r["benchmark"] for r in index["runs"]] == ["toy"] and index["runs"][0]["status"] == "complete"
    assert index["order"] == ["toy-1", "toy-2", "toy-3"]
    row = index["sessions"]["toy-1"]
    assert row["topic"] == "fruit" and row["keywords"] == "banana, cherry"
    assert row["runs"][0]["scores"] == [10.0, 0.0] and row["runs"][0]["score"] == 5.0
    detail = read_data_file(site / "data" / "sessions" / "toy-1.js")
    turn = detail["turns"][1]
    assert turn["user"] == USER[(1, 2)] and turn["context"] == [{"label": "Keyword", "text": "cherry"}]
    judgment = turn["runs"][0]["judgment"]
    assert judgment["score"] == 0.0 and judgment["scorer"] == "rule keyword"
    assert judgment["reasoning"] == "the reply does not name 'cherry'"


def test_runs_of_another_benchmark_are_refused_with_a_toy_run(toy, toy_data, tmp_path, monkeypatch, capsys):
    from sysbench_gpu.benchmarks.registry import load_dataset

    run = tmp_path / "toy-run"
    generate(toy_data, run, echo, monkeypatch)
    demo = tmp_path / "demo-run"
    RunDir(demo).path.mkdir()
    RunDir(demo).update_manifest(stage="generate", status="complete")
    save_run_sessions(RunDir(demo), load_dataset("demo").sessions)  # a SysBench run's sessions.json
    capsys.readouterr()
    assert main(["report", str(run), str(demo), "--out", str(tmp_path / "report")]) == 2
    assert "report: cannot mix Toy keywords runs with SysBench runs" in capsys.readouterr().err
    assert main(["judge", str(run), "--judge", "openai", "--judge-model", "gpt-4o-mini"]) == 2
    assert "scored by their keyword rule" in capsys.readouterr().err
