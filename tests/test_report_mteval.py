"""report on MT-Eval runs: the leaderboard layout (hand-worked averages through judge and metrics), tasks and
per-turn tables, runs of one model side by side with paired or unpaired CIs, and what the report refuses."""

from __future__ import annotations

import json

import pytest
from mteval_runs import judge_with_markers, make_mteval_run
from test_judge_support import make_run
from test_mteval_judge_stage import _global_inst_reply
from test_report import _assert_figure, _row

from sysbench_gpu.cli import main
from sysbench_gpu.judging.stage import judge_run


def _cls_even(session, turn):
    """The gold label on even turns: turns 2, 4, ..., 10 of dialogue 1's answered turns 2-11 (5 of 10)."""
    return f"It is {session.turn(turn).reference}." if turn % 2 == 0 else "Unsure."


def _scored(value):
    return lambda session, turn: f"A reply. SCORE{value}"


@pytest.fixture(scope="module")
def toy(tmp_path_factory, mteval_data_dir):
    """Model toy on every leaderboard task, plus a gold-history and a single-turn refinement run.

    cls 5 of 10 turns hit, global-inst 19 of 30: recollection pools them, (50 + 190) / 40 = 6.0
    (not the mean 5.67 of the two task means); expansion 8, refinement 6, follow-up 9;
    average (6.0 + 8 + 6 + 9) / 4 = 7.25. Gold-history refinement scores 7, single-turn 5.
    """
    root = tmp_path_factory.mktemp("mteval")
    data = mteval_data_dir
    runs = {
        "cls": make_mteval_run(root / "cls", data / "recollection_multi_cls.jsonl", [1], _cls_even, model="toy"),
        "gi": make_mteval_run(
            root / "gi", data / "recollection_multi_global-inst.jsonl", [1, 17, 21], _global_inst_reply, model="toy"
        ),
        "exp": make_mteval_run(root / "exp", data / "expansion_multi.jsonl", [1], _scored(8), model="toy"),
        "ref": make_mteval_run(root / "ref", data / "refinement_multi.jsonl", [1, 2], _scored(6), model="toy"),
        "fu": make_mteval_run(root / "fu", data / "follow-up_multi.jsonl", [1], _scored(9), model="toy"),
        "gold": make_mteval_run(
            root / "gold", data / "refinement_multi.jsonl", [1, 2], _scored(7), model="toy", history="reference"
        ),
        "single": make_mteval_run(
            root / "single", data / "refinement_single.jsonl", range(1, 11), _scored(5), model="toy"
        ),
    }
    for name, run in runs.items():
        if name in ("cls", "gi"):
            judge_run(run, None, None, show_progress=False)
        else:
            judge_with_markers(run)
    return {name: run.path for name, run in runs.items()}


def test_leaderboard_averages_by_hand(toy, tmp_path, capsys):
    out = tmp_path / "report"
    order = ["cls", "gi", "exp", "ref", "fu", "gold", "single"]
    rc = main(["report", *(str(toy[k]) for k in order), "--out", str(out), "--resamples", "200", "--formats", "png"])
    assert rc == 0, capsys.readouterr().err
    meta = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert meta["benchmark"] == "mteval"
    rows = {row["label"]: row for row in meta["rows"]}
    assert list(rows) == ["toy", "toy (gold history)", "toy (single)"]
    toy_row = rows["toy"]["metrics"]
    categories = {c: b["score"] for c, b in toy_row["categories"].items()}
    assert categories == pytest.approx({"recollection": 6.0, "expansion": 8.0, "refinement": 6.0, "follow-up": 9.0})
    assert toy_row["tasks"]["recollection-cls"]["score"] == pytest.approx(5.0)
    assert toy_row["tasks"]["recollection-global-inst"]["score"] == pytest.approx(190 / 30)
    assert toy_row["overall"] == pytest.approx(7.25) and toy_row["leaderboard_complete"] is True
    board = (out / "mteval_leaderboard.md").read_text(encoding="utf-8")
    cells = _row(board, "toy")
    assert [c.split(" [")[0] for c in cells] == ["7.25", "6.00", "8.00", "6.00", "9.00"]
    assert _row(board, "GPT-4 (published)") == ["9.03", "9.61", "9.07", "7.85", "9.60"]
    assert _row(board, "toy (gold history)")[0].startswith("7.00*")
    tex = (out / "mteval_leaderboard.tex").read_text(encoding="utf-8")
    assert "7.25 & 6.00 & 8.00 & 6.00 & 9.00" in tex
    tasks = (out / "mteval_tasks.md").read_text(encoding="utf-8")
    assert _row(tasks, "toy (single)") == ["5.00", "–", "–", "–", "–"]
    by_turn = (out / "mteval_by_turn_follow-up.md").read_text(encoding="utf-8")
    assert _row(by_turn, "toy") == ["9.00", "9.00", "9.00"]
    _assert_figure(out / "fig_mteval_by_turn.png")
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "# MT-Eval report" in md and "toy = cls, gi, exp, ref, fu" in md
    assert "rows without all four leaderboard categories" in capsys.readouterr().err


def test_side_by_side_is_paired_for_gold_history_and_unpaired_for_single(toy, tmp_path, capsys):
    out = tmp_path / "report"
    rc = main(
        [
            "report",
            str(toy["ref"]),
            str(toy["gold"]),
            str(toy["single"]),
            "--out",
            str(out),
            "--resamples",
            "200",
            "--no-figures",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    meta = json.loads((out / "report.json").read_text(encoding="utf-8"))
    gold, single = meta["side_by_side"][0]["comparisons"]
    assert gold["label"] == "gold history - multi" and gold["paired"] is True
    assert gold["metrics"]["task.refinement"]["diff"] == pytest.approx(1.0)
    assert gold["metrics"]["task.refinement"]["ci95"] == pytest.approx([1.0, 1.0])  # every turn gains exactly 1
    assert single["paired"] is False and single["metrics"]["task.refinement"]["diff"] == pytest.approx(-1.0)
    side = (out / "mteval_side_by_side.md").read_text(encoding="utf-8")
    assert "gold history - multi: paired" in side and "single - multi: unpaired (different dialogues)" in side


def test_report_refusals(toy, tmp_path, dataset, capsys):
    sysbench = make_run(tmp_path / "sb", dataset, [1])
    rc = main(["report", str(toy["ref"]), str(sysbench.path), "--out", str(tmp_path / "r1")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "report: cannot mix MT-Eval runs with SysBench runs" in err[0]
    rc = main(["report", str(toy["ref"]), "--gt-pair", f"{toy['gold']}={toy['ref']}", "--out", str(tmp_path / "r2")])
    assert rc == 2 and "--gt-pair applies to SysBench runs" in capsys.readouterr().err
    rc = main(["report", str(toy["ref"]), str(toy["ref"]), "--out", str(tmp_path / "r3"), "--no-figures"])
    assert rc == 2 and "both score task refinement for toy" in capsys.readouterr().err
