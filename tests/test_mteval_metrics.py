"""MT-Eval metrics on a hand-worked example: task, category (recollection pools cls and global-inst), per-turn and
overall scores; bootstrap CIs; paired and unpaired comparisons; the Markdown tables."""

from __future__ import annotations

import json

import pytest

from sysbench_gpu.benchmarks.mteval.data import parse_dialogues
from sysbench_gpu.benchmarks.mteval.metrics import (
    build_turn_scores,
    compare_mteval,
    mteval_metrics,
)
from sysbench_gpu.benchmarks.mteval.tables import (
    leaderboard_markdown,
    side_by_side_markdown,
)
from sysbench_gpu.core.errors import SysbenchError


def _dialogue(did: str, answered: int, context: int = 0, **extra) -> dict:
    conv = [{"user": f"c{i}", "sys": f"cs{i}", "id": f"c{i}", "do_inference": False} for i in range(context)]
    conv += [
        {
            "user": f"Content: doc\n\nInstruction: q{i}" if i == 0 else f"q{i}",
            "sys": "label",
            "id": f"1_sum_{i}",
            "do_inference": True,
            "inst": f"q{i}",
        }
        for i in range(answered)
    ]
    return {"id": did, "conv": conv, **extra}


def _sessions(task: str, *dialogues: dict):
    return parse_dialogues("\n".join(json.dumps(d) for d in dialogues), task=task)


GI = {"inst_name": "punctuation:no_comma", "inst_args": {}}


def _example():
    """Scores per answered turn, by task and dialogue:

    refinement  R1 [8, 6]  R2 [4]        -> (8+6+4)/3            = 6.0
    expansion   E1 [9, 7]                -> 8.0
    follow-up   F1 [10, 10, 7] (2 context turns first) -> 9.0
    cls         C1 [10, 0, 10, 10]  \\
    global-inst G1 [0, 10]           } recollection pools 6 turns: 40/6 = 6.667 (not the mean 6.25 of 7.5 and 5.0)
    overall = mean(6.667, 8.0, 6.0, 9.0) = 7.4167
    """
    parts = {
        "refinement": (_sessions("refinement", _dialogue("R1", 2), _dialogue("R2", 1)), [[8, 6], [4]]),
        "expansion": (_sessions("expansion", _dialogue("E1", 2)), [[9, 7]]),
        "follow-up": (_sessions("follow-up", _dialogue("F1", 3, context=2)), [[10, 10, 7]]),
        "recollection-cls": (_sessions("recollection-cls", _dialogue("C1", 4, context=1)), [[10, 0, 10, 10]]),
        "recollection-global-inst": (
            _sessions("recollection-global-inst", _dialogue("G1", 2, context=1, **GI)),
            [[0, 10]],
        ),
    }
    turns = []
    for sessions, values in parts.values():
        scores = {}
        for session, row in zip(sessions, values, strict=False):
            answered = [t.index for t in session.turns if t.answered]
            scores.update({(session.system_id, index): value for index, value in zip(answered, row, strict=False)})
        turns += build_turn_scores(sessions, scores)
    return parts, turns


def test_hand_worked_category_and_overall_averages() -> None:
    _, turns = _example()
    result = mteval_metrics(turns, resamples=200, seed=1)
    categories = result["categories"]
    assert list(categories) == ["recollection", "expansion", "refinement", "follow-up"]
    assert categories["refinement"]["score"] == pytest.approx(6.0)
    assert categories["expansion"]["score"] == pytest.approx(8.0)
    assert categories["follow-up"]["score"] == pytest.approx(9.0)
    assert categories["recollection"]["score"] == pytest.approx(40 / 6)
    assert result["tasks"]["recollection-cls"]["score"] == pytest.approx(7.5)
    assert result["tasks"]["recollection-global-inst"]["score"] == pytest.approx(5.0)
    assert result["overall"] == pytest.approx((40 / 6 + 8 + 6 + 9) / 4)
    assert result["leaderboard_complete"] is True
    assert (result["n_sessions"], result["n_turns"]) == (6, 14)
    assert (categories["recollection"]["n_sessions"], categories["recollection"]["n_turns"]) == (2, 6)
    # per answered-turn index: recollection turn 1 = (10 + 0) / 2, turn 2 = (0 + 10) / 2, then cls alone
    assert categories["recollection"]["by_turn"] == pytest.approx([5.0, 5.0, 10.0, 10.0])
    assert result["tasks"]["follow-up"]["by_turn"] == pytest.approx([10.0, 10.0, 7.0])  # context turns not counted
    assert result["tasks"]["refinement"]["by_turn"] == pytest.approx([6.0, 6.0])


def test_bootstrap_cis() -> None:
    _, turns = _example()
    result = mteval_metrics(turns, resamples=300, seed=0)
    # a task with one dialogue cannot vary; refinement's two dialogues can
    assert result["categories"]["expansion"]["ci95"] == pytest.approx([8.0, 8.0])
    low, high = result["categories"]["refinement"]["ci95"]
    assert 4.0 <= low < 6.0 < high <= 7.0
    low, high = result["overall_ci95"]
    assert low <= result["overall"] <= high
    assert result["bootstrap"] == {"resamples": 300, "seed": 0, "unit": "dialogue", "stratified_by": "task"}
    assert mteval_metrics(turns, resamples=300, seed=0) == result  # seeded


def test_turn_score_errors() -> None:
    parts, _ = _example()
    sessions = parts["follow-up"][0]
    with pytest.raises(SysbenchError, match=r"2 answered turn\(s\) have no score: session 1 turn 4, session 1 turn 5"):
        build_turn_scores(sessions, {(1, 3): 5})
    assert len(build_turn_scores(sessions, {(1, 3): 5}, allow_missing=True)) == 1
    with pytest.raises(SysbenchError, match="not answered turns: session 1 turn 1"):
        build_turn_scores(sessions, {(1, 1): 5, (1, 3): 5, (1, 4): 5, (1, 5): 5})
    with pytest.raises(SysbenchError, match="outside 0..10"):
        build_turn_scores(sessions, {(1, 3): 11, (1, 4): 5, (1, 5): 5})


def test_paired_comparison_of_model_and_gold_history() -> None:
    _, turns = _example()
    from dataclasses import replace

    gold = [replace(t, score=t.score + 1) if t.task == "refinement" else t for t in turns]
    result = compare_mteval(turns, gold, resamples=200, seed=3)
    assert result["paired"] is True
    refinement = result["metrics"]["category.refinement"]
    assert (refinement["a"], refinement["b"], refinement["diff"]) == pytest.approx((6.0, 7.0, 1.0))
    assert refinement["ci95"] == pytest.approx([1.0, 1.0])  # paired: every resample moves by exactly 1
    assert result["metrics"]["overall"]["diff"] == pytest.approx(0.25)
    assert result["metrics"]["overall"]["ci95"] == pytest.approx([0.25, 0.25])
    assert result["metrics"]["category.expansion"]["diff"] == pytest.approx(0.0)


def test_unpaired_comparison_of_multi_and_single() -> None:
    multi = _sessions("expansion", _dialogue("E1", 2), _dialogue("E2", 2))
    single = _sessions("expansion_single", _dialogue("S1", 1), _dialogue("S2", 1), _dialogue("S3", 1))
    a = build_turn_scores(multi, {(1, 1): 6, (1, 2): 8, (2, 1): 4, (2, 2): 6})
    b = build_turn_scores(single, {(1, 1): 9, (2, 1): 7, (3, 1): 8})
    result = compare_mteval(a, b, resamples=200, seed=0)
    assert result["paired"] is False
    row = result["metrics"]["task.expansion"]
    assert (row["a"], row["b"], row["diff"]) == pytest.approx((6.0, 8.0, 2.0))
    assert row["ci95"][0] < 2.0 < row["ci95"][1]
    assert result["n_sessions"] == {"a": 2, "b": 3}


def test_leaderboard_table() -> None:
    _, turns = _example()
    result = mteval_metrics(turns, resamples=50)
    table = leaderboard_markdown([("example", result)], show_ci=False, published=True)
    lines = table.splitlines()
    assert lines[0] == "| Model | Average | Recollection | Expansion | Refinement | Follow-up |"
    assert lines[2] == "| example | 7.42 | 6.67 | 8.00 | 6.00 | 9.00 |"
    assert lines[3] == "| GPT-4 (published) | 9.03 | 9.61 | 9.07 | 7.85 | 9.60 |"
    partial = mteval_metrics([t for t in turns if t.task == "expansion"], resamples=50)
    table = leaderboard_markdown([("expansion only", partial)])
    assert "| expansion only | 8.00* [8.00, 8.00] | - | 8.00 [8.00, 8.00] | - | - |" in table
    assert "average over the categories the run has" in table


def test_side_by_side_table() -> None:
    _, turns = _example()
    from dataclasses import replace

    gold = [replace(t, score=min(10.0, t.score + 1)) if t.task == "refinement" else t for t in turns]
    multi, gold_metrics = mteval_metrics(turns, resamples=50), mteval_metrics(gold, resamples=50)
    table = side_by_side_markdown(
        [("multi", multi), ("gold", gold_metrics)], [("gold - multi", compare_mteval(turns, gold, resamples=50))]
    )
    lines = table.splitlines()
    assert lines[0] == "| | multi | gold | gold - multi (95% CI) |"
    assert "| overall | 7.42 | 7.67 | +0.25 [+0.25, +0.25] |" in lines
    assert "| category: refinement | 6.00 | 7.00 | +1.00 [+1.00, +1.00] |" in lines
    assert "| task: recollection-cls | 7.50 | 7.50 | +0.00 [+0.00, +0.00] |" in lines
    assert lines[-1] == "gold - multi: paired dialogue bootstrap, 50 resamples"
