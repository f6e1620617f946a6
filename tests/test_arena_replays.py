"""An arena folder that never mixes its battles: a mode change refused, runs that changed since their battles were
stored (verdicts replayed, judged battles refused until --replay-changed), --retry-unparsed, dropped resamples
counted, runs without a battle shown unrated, and repeated models labelled by run."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sklearn")

from openai_stub import Reply  # noqa: E402
from test_arena_stage import all_pass, arena, fair_judge, first_passes, judged, lines, make_run, none_pass  # noqa: E402

from sysbench_gpu.arena.bt import Battles, fit_with_ci  # noqa: E402
from sysbench_gpu.benchmarks.registry import demo_data_path, load_dataset  # noqa: E402
from sysbench_gpu.cli import main  # noqa: E402

FAST = ("--resamples", "5", "--no-figures")


@pytest.fixture
def runs(tmp_path: Path) -> list[str]:
    return [
        make_run(tmp_path / "strong", "strong", all_pass),
        make_run(tmp_path / "middle", "middle", first_passes),
        make_run(tmp_path / "weak", "weak", none_pass),
    ]


@pytest.fixture
def pair(tmp_path: Path) -> list[str]:
    one_session = list(load_dataset(demo_data_path()).sessions)[:1]
    return [
        make_run(tmp_path / "strong", "strong", all_pass, sessions=one_session),
        make_run(tmp_path / "weak", "weak", none_pass, sessions=one_session),
    ]


def ratings(out: Path) -> list[dict[str, Any]]:
    return json.loads((out / "ratings.json").read_text())["ratings"]


# ----------------------------------------------------------------------------- modes


def test_a_mode_change_in_an_arena_folder_is_refused_naming_both_modes(runs, tmp_path, capsys) -> None:
    out = tmp_path / "arena"
    assert arena(capsys, *runs, "--out", str(out), *FAST)[0] == 0
    before = (out / "battles.jsonl").read_bytes()
    code, _, err = arena(capsys, runs[0], runs[2], "--baseline", runs[1], "--out", str(out), *FAST)
    assert code == 2 and err.count("\n") == 1
    assert str(out) in err and "all-pairs" in err and f"against the baseline {runs[1]}" in err
    assert "no --baseline" in err and "another --out" in err
    assert (out / "battles.jsonl").read_bytes() == before
    assert json.loads((out / "ratings.json").read_text())["fit"]["mode"] == "all-pairs"

    based = tmp_path / "based"
    assert arena(capsys, runs[0], runs[2], "--baseline", runs[1], "--out", str(based), *FAST)[0] == 0
    code, _, err = arena(capsys, *runs, "--out", str(based), *FAST)  # back to all pairs
    assert code == 2 and f"--baseline {runs[1]}" in err
    code, _, err = arena(capsys, runs[1], runs[2], "--baseline", runs[0], "--out", str(based), *FAST)  # other baseline
    assert code == 2 and f"against the baseline {runs[1]}" in err and f"against the baseline {runs[0]}" in err
    code, _, _ = arena(capsys, runs[0], runs[2], "--baseline", runs[1], "--out", str(based), *FAST)
    assert code == 0  # the same mode resumes
    rows = {row["model"]: row for row in ratings(based)}
    assert rows["strong"]["battles"] == rows["weak"]["battles"] == 25  # never against each other


# ----------------------------------------------------------------------------- changed runs


def test_a_run_judged_again_has_its_verdict_battles_replayed(runs, tmp_path, capsys) -> None:
    out = tmp_path / "arena"
    assert arena(capsys, *runs, "--out", str(out), *FAST)[0] == 0
    assert all(len(r["fingerprint_a"]) == len(r["fingerprint_b"]) == 16 for r in lines(out))
    weak = Path(runs[2])
    shutil.rmtree(weak)
    make_run(weak, "weak", all_pass)  # the same replies, new verdicts: it now passes what strong passes
    code, text, _ = arena(capsys, *runs, "--out", str(out), *FAST)
    assert code == 0, text
    replaced = [json.loads(line) for line in (out / "battles.replaced.jsonl").read_text().splitlines()]
    assert replaced and all(str(weak) in (r["a"], r["b"]) for r in replaced)
    assert f"{len(replaced)} stored battle(s) played again" in text
    assert len(lines(out)) == 75  # replaced, not added: one record per battle
    fresh = tmp_path / "fresh"
    assert arena(capsys, *runs, "--out", str(fresh), *FAST)[0] == 0
    assert ratings(out) == ratings(fresh)  # rated on the verdicts the runs hold now
    manifest = json.loads((out / "manifest.json").read_text())["stages"]["arena"]
    assert manifest["battles_replayed_this_call"] == len(replaced)
    code, text, _ = arena(capsys, *runs, "--out", str(out), *FAST)  # nothing changed since: nothing replayed
    assert (
        code == 0
        and "played again" not in text
        and (out / "battles.replaced.jsonl").read_text().count("\n") == len(replaced)
    )


def _change_reply(run: str, system_id: int, turn: int, text: str) -> None:
    path = Path(run) / "generations.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for record in records:
        if (record["system_id"], record["turn"]) == (system_id, turn):
            record["response"] = text
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_judged_battle_on_replies_that_changed_is_refused_until_replay_changed(
    pair, tmp_path, capsys, monkeypatch
) -> None:
    out = tmp_path / "arena"
    assert judged(capsys, monkeypatch, pair, out, fair_judge)[0] == 0
    # New verdicts but the same replies: the judge never saw verdicts, so nothing is asked again.
    weak = Path(pair[1])
    sessions = list(load_dataset(demo_data_path()).sessions)[:1]
    shutil.rmtree(weak)
    make_run(weak, "weak", all_pass, sessions=sessions)
    code, text, stub = judged(capsys, monkeypatch, pair, out, fair_judge)
    assert code == 0 and stub.request_count == 0, text
    # A changed reply at turn 4: turns 4 and 5 (whose conversation shows it) were judged on other text.
    _change_reply(pair[1], sessions[0].system_id, 4, "weak answers turn 4 differently")
    before = (out / "battles.jsonl").read_bytes()
    code, text, stub = judged(capsys, monkeypatch, pair, out, fair_judge)
    assert code == 2 and stub.request_count == 0
    error = text.strip().splitlines()[-1]
    assert f"run {pair[1]}: 4 judged battle(s)" in error and "session 1, turn 4" in error
    assert "--replay-changed" in error
    assert (out / "battles.jsonl").read_bytes() == before
    code, text, stub = judged(capsys, monkeypatch, pair, out, fair_judge, "--replay-changed")
    assert code == 0 and stub.request_count == 4, text  # turns 4 and 5, each in both orders
    records = lines(out)
    assert len(records) == 10 and len({(r["turn"], r["order"]) for r in records}) == 10
    assert len((out / "battles.replaced.jsonl").read_text().splitlines()) == 4
    code, text, stub = judged(capsys, monkeypatch, pair, out, fair_judge)
    assert code == 0 and stub.request_count == 0


def test_replay_and_retry_flags_apply_to_judged_battles_only(runs, tmp_path, capsys) -> None:
    code, _, err = arena(capsys, *runs, "--out", str(tmp_path / "arena"), "--retry-unparsed")
    assert code == 2 and "apply to --by judge" in err


# ----------------------------------------------------------------------------- --retry-unparsed


def _final_replies(body: dict[str, Any]) -> list[str]:
    prompt = body["messages"][-1]["content"]
    return re.findall(r"<Assistant final reply>\n(.*?)\n</Assistant final reply>", prompt, re.DOTALL)


def test_retry_unparsed_asks_only_those_again_and_replaces_their_records(pair, tmp_path, capsys, monkeypatch) -> None:
    out = tmp_path / "arena"
    broken = {"on": True}

    def judge(body: dict[str, Any], n: int) -> Reply:
        if broken["on"] and any(reply.endswith("turn 2") for reply in _final_replies(body)):
            return Reply(text="Both replies are fine.")  # no choice: unparsed
        return fair_judge(body, n)

    code, text, _ = judged(capsys, monkeypatch, pair, out, judge, "--max-retries", "2")
    assert code == 0, text
    assert "2 judged battle record(s) never parsed" in text and "--retry-unparsed" in text
    assert sorted(r["status"] for r in lines(out)).count("unparsed") == 2
    result = json.loads((out / "ratings.json").read_text())
    assert result["unparsed_battle_records"] == 2 and result["fit"]["battles"] == 4
    assert "--retry-unparsed" in (out / "leaderboard.md").read_text()
    # A plain rerun asks nothing again, and says so again.
    code, text, stub = judged(capsys, monkeypatch, pair, out, judge)
    assert code == 0 and stub.request_count == 0 and "--retry-unparsed" in text
    broken["on"] = False
    code, text, stub = judged(capsys, monkeypatch, pair, out, judge, "--retry-unparsed", "--dry-run")
    assert code == 0 and stub.request_count == 0
    assert "questions           2 (0 from cache)" in text and "asked again         2 unparsed" in text
    code, text, stub = judged(capsys, monkeypatch, pair, out, judge, "--retry-unparsed")
    assert code == 0 and stub.request_count == 2, text  # the two, not from the reply cache
    assert "2 unparsed battle record(s) asked again" in text and "never parsed" not in text
    records = lines(out)
    assert len(records) == 10 and {r["status"] for r in records} == {"ok"}
    assert len({(r["turn"], r["order"]) for r in records}) == 10  # no duplicate rows
    replaced = [json.loads(line) for line in (out / "battles.replaced.jsonl").read_text().splitlines()]
    assert [r["status"] for r in replaced] == ["unparsed", "unparsed"]
    result = json.loads((out / "ratings.json").read_text())
    assert result["unparsed_battle_records"] == 0 and result["fit"]["battles"] == 5
    assert json.loads((out / "manifest.json").read_text())["stages"]["arena"]["retry_rounds"] == 1


def test_no_outcome_at_all_names_retry_unparsed(pair, tmp_path, capsys, monkeypatch) -> None:
    code, text, _ = judged(
        capsys, monkeypatch, pair, tmp_path / "arena", lambda body, n: Reply(text="Hmm."), "--max-retries", "1"
    )
    assert code == 2 and "no battle has an outcome yet" in text and "--retry-unparsed" in text
    assert f"{tmp_path / 'arena' / 'battles.jsonl'}: no battle" in text  # the file that holds the unparsed records


# ----------------------------------------------------------------------------- dropped resamples


def test_resamples_without_a_finite_fit_are_counted() -> None:
    # Two sessions: player 0 wins all of the first, player 1 all of the second. A resample that draws one
    # session twice has a winner of every battle: no finite fit, so it is left out and counted.
    battles = Battles.of([0] * 10, [1] * 10, [1.0] * 5 + [0.0] * 5, [0] * 5 + [1] * 5, 2)
    fit = fit_with_ci(battles, anchor=None, resamples=200, seed=0)
    assert 60 < fit.failed < 140  # about half
    assert fit.ci_resamples == [200 - fit.failed] * 2
    assert fit.ratings == pytest.approx([1000.0, 1000.0], abs=1e-3)


def test_dropped_resamples_are_reported_in_ratings_and_leaderboard(tmp_path, capsys) -> None:
    sessions = list(load_dataset(demo_data_path()).sessions)[:2]
    first = sessions[0].system_id
    a = make_run(tmp_path / "a", "a", lambda sid, turn, item: sid == first, sessions=sessions)
    b = make_run(tmp_path / "b", "b", lambda sid, turn, item: sid != first, sessions=sessions)
    out = tmp_path / "arena"
    code, text, _ = arena(capsys, a, b, "--out", str(out), "--resamples", "100", "--no-figures")
    assert code == 0, text
    result = json.loads((out / "ratings.json").read_text())
    failed = result["fit"]["resamples_failed"]
    assert 20 < failed < 80
    assert all(row["ci_resamples"] == 100 - failed for row in result["ratings"])
    assert f"note: {failed} of 100 resamples had no finite fit" in text
    assert f"{failed} of 100 resamples had no finite fit" in (out / "leaderboard.md").read_text()


# ----------------------------------------------------------------------------- unrated runs and labels


def test_a_run_without_battles_is_unrated_not_1000(runs, tmp_path, capsys) -> None:
    (Path(runs[1]) / "judgments.jsonl").write_text("")  # answered but never judged: no verdict battle
    out = tmp_path / "arena"
    code, text, _ = arena(capsys, *runs, "--out", str(out), *FAST)
    assert code == 0, text
    result = json.loads((out / "ratings.json").read_text())
    rows = {row["model"]: row for row in result["ratings"]}
    silent = rows["middle"]
    assert silent["rating"] is None and silent["ci"] is None and silent["online_elo"] is None
    assert silent["battles"] == 0 and "no turn answered and judged" in silent["unrated"]
    assert result["ratings"][-1]["model"] == "middle"  # after every rated run
    # The mean anchor is over the rated runs only, and the MM check agrees with that.
    assert (rows["strong"]["rating"] + rows["weak"]["rating"]) / 2 == pytest.approx(1000.0, abs=0.1)
    assert result["fit"]["mm_check"]["max_abs_difference"] < 1.0
    assert "unrated" in re.search(r"^\s+3\. middle.*$", text, re.MULTILINE).group(0)
    board = (out / "leaderboard.md").read_text()
    assert "| 3 | middle | unrated | - |" in board and "Unrated: middle: no battles" in board


def test_runs_of_one_model_are_labelled_by_run(tmp_path, capsys) -> None:
    runs = [
        make_run(tmp_path / "first", "same", all_pass),
        make_run(tmp_path / "second", "same", none_pass),
        make_run(tmp_path / "other", "other", first_passes),
    ]
    out = tmp_path / "arena"
    code, text, _ = arena(capsys, *runs, "--out", str(out), *FAST)
    assert code == 0, text
    result = json.loads((out / "ratings.json").read_text())
    labels = {row["run"]: row["label"] for row in result["ratings"]}
    assert labels == {runs[0]: f"same ({runs[0]})", runs[1]: f"same ({runs[1]})", runs[2]: "other"}
    assert sorted(result["win_rates"]["models"]) == sorted(labels.values())
    board = (out / "leaderboard.md").read_text()
    assert f"| same ({runs[0]}) |" in board and f"| same ({runs[1]}) |" in board and "| other |" in board
    assert f"same ({runs[0]})" in text and f"same ({runs[1]})" in text
    site = tmp_path / "site"
    assert main(["explore", "--arena", str(out), "--out", str(site)]) == 0
    index = (site / "data" / "arena" / "index.js").read_text()
    assert f'"label":"same ({runs[0]})"' in index and '"label":"other"' in index
