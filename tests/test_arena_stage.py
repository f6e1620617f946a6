"""The arena stage end to end on small runs: verdict battles, outputs, modes, refusals, resumption, the lock,
a scored benchmark through the protocol, and judged battles against the local OpenAI stub."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sklearn")

from openai_stub import OpenAIStub, Reply  # noqa: E402

from sysbench_gpu.arena.battles import BattleStore  # noqa: E402
from sysbench_gpu.arena.judged import ArenaTask, judge_questions, questions  # noqa: E402
from sysbench_gpu.arena.prompt import ArenaReply, load_template  # noqa: E402
from sysbench_gpu.arena.runs import load_runs  # noqa: E402
from sysbench_gpu.benchmarks.registry import demo_data_path, load_dataset, registered, save_run_sessions  # noqa: E402
from sysbench_gpu.cli import main  # noqa: E402
from sysbench_gpu.core.locks import stage_lock  # noqa: E402
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord, Verdict  # noqa: E402
from sysbench_gpu.core.rundir import RunDir  # noqa: E402
from sysbench_gpu.core.sessions import Session  # noqa: E402
from sysbench_gpu.engines.base import Completion  # noqa: E402
from sysbench_gpu.judging.rounds import JudgeSettings  # noqa: E402

KEY_ENV = "ARENA_TEST_KEY"
Passes = Callable[[int, int, int], bool]


def make_run(path: Path, model: str, passes: Passes, sessions: list[Session] | None = None) -> str:
    """A judged SysBench-format run of the packaged demo sessions: one reply and its verdicts per turn."""
    dataset = load_dataset(demo_data_path())
    sessions = sessions if sessions is not None else list(dataset.sessions)
    run = RunDir(path)
    path.mkdir(parents=True)
    run.update_manifest(model=model, label=model)
    save_run_sessions(run, sessions, dataset)
    generations, judgments = [], []
    for session in sessions:
        for turn in session.turns:
            text = f"{model} answers turn {turn.index}" + " in detail" * (len(model) % 3)
            generations.append(GenerationRecord(session.system_id, turn.index, turn.user, text, model=model))
            verdicts = {}
            for item in turn.constraints:
                value = "yes" if passes(session.system_id, turn.index, item.id) else "no"
                verdicts[str(item.id)] = Verdict(raw=value, value=value, type=item.type)
            judgments.append(JudgmentRecord(session.system_id, turn.index, verdicts, judge_model="stub-judge"))
    run.generations.append(generations)
    run.judgments.append(judgments)
    return str(path)


def passing(share: int, offset: int) -> Passes:
    """Passes about ``share`` in 10 constraints, spread over turns, so no run wins or loses every battle."""

    def passes(sid: int, turn: int, item: int) -> bool:
        return (sid * 7 + turn * 3 + item * 5 + offset) % 10 < share

    return passes


all_pass, first_passes, none_pass = passing(8, 0), passing(5, 3), passing(3, 6)


@pytest.fixture
def three(tmp_path: Path) -> list[str]:
    return [
        make_run(tmp_path / "strong", "strong", all_pass),
        make_run(tmp_path / "middle", "middle", first_passes),
        make_run(tmp_path / "weak", "weak", none_pass),
    ]


def arena(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["arena", *argv, "--no-progress"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / "battles.jsonl").read_text().splitlines()]


def test_verdict_arena_writes_ratings_leaderboards_figures_and_manifest(three, tmp_path, capsys) -> None:
    out = tmp_path / "arena"
    code, text, _ = arena(capsys, *three, "--out", str(out), "--resamples", "50", "--length-control")
    assert code == 0, text
    ratings = json.loads((out / "ratings.json").read_text())
    rows = ratings["ratings"]
    assert [row["model"] for row in rows] == ["strong", "middle", "weak"]
    assert [row["run"] for row in rows] == [three[0], three[1], three[2]]  # as given
    assert all(row["ci"][0] <= row["rating"] <= row["ci"][1] for row in rows)
    assert sum(row["rating"] for row in rows) / 3 == pytest.approx(1000.0, abs=0.1)  # the mean is the anchor
    assert rows[0]["battles"] == 50  # 25 turns against each of two runs
    assert rows[0]["wins"] > rows[0]["losses"] > 0 and "warning" not in ratings["fit"]
    assert "rating_length_controlled" in rows[0] and "length_control" in ratings
    assert ratings["fit"]["mm_check"]["max_abs_difference"] < 1.0
    assert ratings["win_rates"]["matrix"][0][2] > 0.5
    assert len(lines(out)) == 75 and {r["by"] for r in lines(out)} == {"verdicts"}
    assert "strong" in (out / "leaderboard.md").read_text()
    assert "\\begin{tabular}" in (out / "leaderboard.tex").read_text()
    assert (out / "figures" / "ratings.png").is_file() and (out / "figures" / "win_rates.png").is_file()
    section = json.loads((out / "manifest.json").read_text())["stages"]["arena"]
    assert section["mode"] == "all-pairs" and section["by"] == "verdicts" and section["seeds"]["bootstrap"] == 0
    assert "strong" in text


def test_adding_a_run_plays_only_its_new_pairs(three, tmp_path, capsys) -> None:
    out = tmp_path / "arena"
    assert arena(capsys, three[0], three[1], "--out", str(out), "--resamples", "5", "--no-figures")[0] == 0
    assert len(lines(out)) == 25
    code, text, _ = arena(capsys, *three, "--out", str(out), "--resamples", "5", "--no-figures", "--json")
    assert code == 0
    assert len(lines(out)) == 75  # 50 new: the third run against each of the two
    assert json.loads(text)["fit"]["battles"] == 75


def test_baseline_mode_anchors_the_baseline_and_plays_only_against_it(three, tmp_path, capsys) -> None:
    out = tmp_path / "arena"
    code, text, _ = arena(
        capsys, three[0], three[2], "--baseline", three[1], "--out", str(out), "--resamples", "5", "--no-figures"
    )
    assert code == 0, text
    rows = {row["model"]: row for row in json.loads((out / "ratings.json").read_text())["ratings"]}
    assert rows["middle"]["rating"] == 1000.0
    assert rows["strong"]["battles"] == 25 and rows["weak"]["battles"] == 25  # strong never met weak
    assert json.loads((out / "manifest.json").read_text())["stages"]["arena"]["mode"] == "baseline"


def test_runs_of_other_sessions_are_refused_naming_the_run_and_field(tmp_path, capsys) -> None:
    sessions = list(load_dataset(demo_data_path()).sessions)
    changed = [sessions[0].__class__(**{**vars(sessions[0]), "system_prompt": "Something else."}), *sessions[1:]]
    a = make_run(tmp_path / "a", "a", all_pass)
    b = make_run(tmp_path / "b", "b", none_pass, sessions=changed)
    code, _, err = arena(capsys, a, b, "--out", str(tmp_path / "arena"))
    assert code == 2
    assert err.count("\n") == 1
    assert f"{b}/sessions.json" in err and "session 1" in err and "field system_prompt" in err
    fewer = make_run(tmp_path / "c", "c", none_pass, sessions=sessions[:3])
    code, _, err = arena(capsys, a, fewer, "--out", str(tmp_path / "arena"))
    assert code == 2 and "field system_id" in err and fewer in err


def test_imported_style_runs_with_different_dataset_checksums_still_match(three, tmp_path, capsys) -> None:
    # Imported runs record their workbook's checksum as the dataset: the arena compares sessions, not that.
    RunDir(three[1]).update_manifest(dataset={"sha256": "0" * 64, "path": "x.xlsx"})
    assert (
        arena(capsys, three[0], three[1], "--out", str(tmp_path / "arena"), "--resamples", "5", "--no-figures")[0] == 0
    )


def test_a_second_arena_on_the_same_directory_is_refused(three, tmp_path, capsys) -> None:
    out = tmp_path / "arena"
    with stage_lock(out, "arena"):
        code, _, err = arena(capsys, *three, "--out", str(out), "--no-figures")
    assert code == 2 and "another `arena`" in err
    assert not (out / "battles.jsonl").exists()


def test_a_scored_benchmark_battles_by_its_scores_through_the_protocol(tmp_path, capsys) -> None:
    toy_module = importlib.import_module("toy_benchmark.benchmark")
    with registered(toy_module.ToyKeywords) as toy:
        data = "\n".join(
            [
                json.dumps({"toy_benchmark": 1}),
                json.dumps(
                    {
                        "id": 1,
                        "topic": "fruit",
                        "system": "Be brief.",
                        "turns": [{"user": "A fruit?", "keyword": "banana"}],
                    }
                ),
                json.dumps(
                    {
                        "id": 2,
                        "topic": "color",
                        "system": "Be brief.",
                        "turns": [{"user": "A color?", "keyword": "red"}],
                    }
                ),
            ]
        )
        sessions = toy.parse(data + "\n", tmp_path / "toy.jsonl")
        paths = []
        for model, answers in (("knows", {1: "banana", 2: "red"}), ("guesses", {1: "apple", 2: "red"})):
            run = RunDir(tmp_path / model)
            run.path.mkdir()
            run.update_manifest(model=model)
            save_run_sessions(run, sessions)
            run.generations.append(
                [GenerationRecord(s.system_id, 1, s.turns[0].user, answers[s.system_id]) for s in sessions]
            )
            run.judgments.append([toy_module.rule_record(s, 1, answers[s.system_id]) for s in sessions])
            paths.append(str(run.path))
        code, text, _ = arena(
            capsys, *paths, "--out", str(tmp_path / "arena"), "--resamples", "5", "--no-figures", "--json"
        )
    assert code == 0, text
    rows = {row["model"]: row for row in json.loads(text)["ratings"]}
    assert (rows["knows"]["wins"], rows["knows"]["ties"], rows["knows"]["losses"]) == (1, 1, 0)


# ----------------------------------------------------------------------------- judged battles


def _conversations(prompt: str) -> tuple[str, str]:
    first = prompt.index("[Conversation with assistant A]")
    second = prompt.index("[Conversation with assistant B]")
    return prompt[first:second], prompt[second:]


def fair_judge(body: dict[str, Any], n: int) -> Reply:
    """Prefers the conversation whose final reply comes from 'strong', wherever it is shown."""
    shown_a, _ = _conversations(body["messages"][-1]["content"])
    winner = "A" if "strong answers" in shown_a else "B"
    return Reply(text=json.dumps({"reason": "follows the system message", "winner": winner}))


def first_position_judge(body: dict[str, Any], n: int) -> Reply:
    return Reply(text='{"reason": "the first one", "winner": "A"}')


def judged(capsys, monkeypatch, runs: list[str], out: Path, responder, *extra: str) -> tuple[int, str, OpenAIStub]:
    monkeypatch.setenv(KEY_ENV, "sk-arena-test")
    with OpenAIStub(responder) as stub:
        code, text, err = arena(
            capsys,
            *runs,
            "--out",
            str(out),
            "--by",
            "judge",
            "--judge",
            "openai",
            "--judge-model",
            "stub-judge",
            "--base-url",
            stub.base_url,
            "--api-key-env",
            KEY_ENV,
            "--resamples",
            "5",
            "--no-figures",
            *extra,
        )
    return code, text + err, stub


@pytest.fixture
def two(tmp_path: Path) -> list[str]:
    one_session = list(load_dataset(demo_data_path()).sessions)[:1]
    return [
        make_run(tmp_path / "strong", "strong", all_pass, sessions=one_session),
        make_run(tmp_path / "weak", "weak", none_pass, sessions=one_session),
    ]


def test_judged_battles_ask_both_orders_and_resume_without_asking_again(two, tmp_path, capsys, monkeypatch) -> None:
    out = tmp_path / "arena"
    code, text, stub = judged(capsys, monkeypatch, two, out, fair_judge)
    assert code == 0, text
    assert stub.request_count == 10  # 5 turns, each in both orders
    records = lines(out)
    assert sorted(r["order"] for r in records) == ["ab"] * 5 + ["ba"] * 5
    assert {r["answer"] for r in records if r["order"] == "ab"} != {r["answer"] for r in records if r["order"] == "ba"}
    assert all(r["reason"] == "follows the system message" for r in records)
    result = json.loads((out / "ratings.json").read_text())
    assert result["position_consistency"]["rate"] == 1.0
    rows = {row["model"]: row for row in result["ratings"]}
    assert rows["strong"]["wins"] == 5
    assert "won or lost every battle" in result["fit"]["warning"]  # no finite maximum-likelihood rating
    prompt = stub.requests[0]["messages"][-1]["content"]
    assert "[System message]" in prompt and "<User>" in prompt  # the system message and the user turns
    manifest = json.loads((out / "manifest.json").read_text())["stages"]["arena"]
    assert manifest["judge"]["model"] == "stub-judge" and len(manifest["template"]["sha256"]) == 64
    assert (out / "judge_ledger.json").is_file()
    code, text, stub = judged(capsys, monkeypatch, two, out, fair_judge)
    assert code == 0 and stub.request_count == 0


def test_a_judge_that_always_prefers_position_a_has_consistency_0_and_only_ties(
    two, tmp_path, capsys, monkeypatch
) -> None:
    out = tmp_path / "arena"
    code, text, _ = judged(capsys, monkeypatch, two, out, first_position_judge)
    assert code == 0, text
    result = json.loads((out / "ratings.json").read_text())
    assert result["position_consistency"]["rate"] == 0.0
    assert result["position_consistency"]["first_position_share"] == 1.0
    assert all(row["ties"] == row["battles"] == 5 for row in result["ratings"])
    assert all(row["rating"] == pytest.approx(1000.0) for row in result["ratings"])


def test_dry_run_estimates_and_sends_nothing(two, tmp_path, capsys, monkeypatch) -> None:
    code, text, stub = judged(capsys, monkeypatch, two, tmp_path / "arena", fair_judge, "--dry-run")
    assert code == 0 and stub.request_count == 0
    assert "questions           10" in text and "est. prompt tokens" in text


def test_verdict_and_judged_battles_are_not_mixed(two, tmp_path, capsys, monkeypatch) -> None:
    out = tmp_path / "arena"
    assert arena(capsys, *two, "--out", str(out), "--resamples", "5", "--no-figures")[0] == 0
    code, text, stub = judged(capsys, monkeypatch, two, out, fair_judge)
    assert code == 2 and "field by" in text and stub.request_count == 0


class BatchedStub:
    """A local judge as the batched backends are driven (one ``chat`` per round); always answers 'tie'."""

    name, model, is_primary = "hf", "local-stub", True

    def __init__(self) -> None:
        self.calls: list[int] = []

    def chat(self, conversations: Any, sampling: Any) -> list[Completion]:
        self.calls.append(len(conversations))
        return [Completion(text='{"reason": "both fine", "winner": "tie"}') for _ in conversations]

    def context_length(self) -> int | None:
        return None

    def count_prompt_tokens(self, messages: Any) -> int | None:
        return None

    def close(self) -> None:
        pass


def test_local_judges_are_asked_in_batches(two, tmp_path) -> None:
    runs = load_runs(two)
    pending = questions([(runs[0], runs[1]) if runs[0].key < runs[1].key else (runs[1], runs[0])], set())
    engine = BatchedStub()
    settings = JudgeSettings(backend="hf", model="local-stub", template=None, cache_dir=tmp_path / "cache")
    store = BattleStore(tmp_path)
    summary = judge_questions(pending, load_template(None), settings, lambda: engine, tmp_path, store, False)
    assert engine.calls == [10] and summary.judged == 10
    assert {r.winner for r in store.read().values()} == {"tie"}


def test_vllm_guided_decoding_holds_the_answer_to_a_b_or_tie() -> None:
    task = ArenaTask(
        system_id=0, turn=1, prompt="p", constraints=(), template_sha256="h", score_kind="arena", reply=ArenaReply()
    )
    schema = JudgeSettings(backend="vllm", model="m", template=None).sampling(0, task).json_schema
    assert schema["properties"]["winner"]["enum"] == ["A", "B", "tie"]
    assert schema["properties"]["reason"]["maxLength"] <= 600
    assert JudgeSettings(backend="openai", model="m", template=None).sampling(0, task).json_schema is None


@pytest.mark.parametrize(
    ("text", "score", "reason"),
    [
        ('{"reason": "B keeps the format", "winner": "B"}', 0.0, "B keeps the format"),
        ('Sure.\n```json\n{"winner": "tie", "reason": "same"}\n```', 0.5, "same"),
        ("A. It follows the role.", 1.0, "It follows the role."),
    ],
)
def test_judge_replies_are_read_as_text(text: str, score: float, reason: str) -> None:
    reading = ArenaReply().read(text)
    assert reading.ok and reading.score == score and reading.reasoning == reason


@pytest.mark.parametrize("text", ["", "Both are good.", '{"winner": "C"}', '{"winner": 1}'])
def test_replies_without_a_choice_are_invalid(text: str) -> None:
    assert not ArenaReply().read(text).ok


def test_explore_arena_shows_both_replies_with_the_verdict_and_reason(two, tmp_path, capsys, monkeypatch) -> None:
    arena_dir = tmp_path / "arena"
    assert judged(capsys, monkeypatch, two, arena_dir, fair_judge)[0] == 0
    site = tmp_path / "site"
    capsys.readouterr()
    assert main(["explore", "--arena", str(arena_dir), "--out", str(site)]) == 0
    assert "5 battles in 1 sessions" in capsys.readouterr().out  # a battle once, both orders inside it
    assert all((site / name).is_file() for name in ("arena.html", "explore_arena.js", "explore.css"))
    text = (site / "data" / "arena" / "s1.js").read_text()
    detail = json.loads(text.rstrip().rsplit("\n", 1)[-1].split(" = ", 1)[1].rstrip(";"))
    battle = detail["battles"][0]
    assert {r["order"] for r in battle["records"]} == {"ab", "ba"}
    assert battle["records"][0]["reason"] == "follows the system message"
    replies = {detail["replies"][str(i)]["1"] for i in (battle["a"], battle["b"])}
    assert replies == {"strong answers turn 1", "weak answers turn 1 in detail"}
    assert "innerHTML" not in (site / "explore_arena.js").read_text()
