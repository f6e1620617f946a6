"""metrics and compare on MT-Eval run directories: hand-checked scores, partial runs, paired and unpaired
comparisons."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mteval_runs import make_mteval_run
from test_judge_support import make_run
from test_mteval_judge_stage import _global_inst_reply

from sysbench_gpu import cli
from sysbench_gpu.benchmarks.runs import compare_runs, run_metrics
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.records import JudgmentRecord
from sysbench_gpu.judging.stage import judge_run

REPO_ROOT = Path(__file__).resolve().parent.parent
GLOBAL_INST = "recollection_multi_global-inst.jsonl"
CLS_MULTI = "recollection_multi_cls.jsonl"
CLS_SINGLE = "recollection_single_cls.jsonl"


def _json(capsys, argv: list[str]) -> dict:
    assert cli.main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_global_inst_judge_then_metrics_without_any_judge_model(tmp_path, mteval_data_dir):
    """The done-when case: hand-written replies, `judge RUN` with no judge options, `metrics RUN --json`.

    Dialogue 1 (start with 'o') follows on 3 of its 10 answered turns, dialogue 21 (no commas) on 6,
    dialogue 17 (all capitals) on 10: 19 turns of 30 score 10, the rest 0, so recollection is
    190 / 30 = 6.333. By answered-turn index: turns 1-3 all three follow (10.0), turns 4-6 two of
    three (6.667), turns 7-10 one of three (3.333).
    """
    run = make_mteval_run(tmp_path / "gi", mteval_data_dir / GLOBAL_INST, [1, 17, 21], _global_inst_reply)
    code = (
        "import json, sys; from sysbench_gpu.cli import main; "
        f"assert main(['judge', {str(run.path)!r}]) == 0; "
        f"assert main(['metrics', {str(run.path)!r}, '--json', '--resamples', '200']) == 0; "
        "heavy = [m for m in ('openai', 'torch', 'vllm', 'transformers') if m in sys.modules]; "
        "print('HEAVY', heavy)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "scored by rule 30; requests 0" in lines[0]
    assert lines[-1] == "HEAVY []"  # no judge model, no API client, no GPU library
    result = json.loads("\n".join(lines[1:-1]))
    assert result["benchmark"] == "mteval" and (result["n_sessions"], result["n_turns"]) == (3, 30)
    recollection = result["categories"]["recollection"]
    assert recollection["score"] == pytest.approx(190 / 30)
    assert result["tasks"]["recollection-global-inst"]["score"] == pytest.approx(190 / 30)
    assert result["tasks"]["recollection-global-inst"]["scorer"] == "ifeval"
    assert result["overall"] == pytest.approx(190 / 30) and result["leaderboard_complete"] is False
    assert recollection["by_turn"] == pytest.approx([10.0] * 3 + [20 / 3] * 3 + [10 / 3] * 4)
    assert result["partial"] is False and result["n_unparsed_turns"] == 0 and result["scorers"] == ["ifeval"]
    assert result["history"] == "model" and result["settings"] == ["multi"]
    low, high = recollection["ci95"]
    assert 0 <= low <= 190 / 30 <= high <= 10


def test_metrics_text_names_categories_tasks_and_turns(tmp_path, mteval_data_dir, capsys):
    run = make_mteval_run(tmp_path / "gi", mteval_data_dir / GLOBAL_INST, [1, 17, 21], _global_inst_reply)
    judge_run(run, None, None, show_progress=False)
    assert cli.main(["metrics", str(run.path), "--resamples", "50"]) == 0
    out = capsys.readouterr().out
    assert "3 dialogues, 30 answered turns; scores 0-10" in out
    assert "category recollection" in out and " 6.33 " in out
    assert "1: 10.00, 2: 10.00, 3: 10.00, 4: 6.67" in out
    assert "not all four of the leaderboard" in out


def test_unfinished_runs_are_refused_naming_the_turns(tmp_path, mteval_data_dir, capsys):
    generated = [(1, t) for t in range(2, 12)] + [(17, t) for t in range(2, 6)]
    run = make_mteval_run(
        tmp_path / "part", mteval_data_dir / GLOBAL_INST, [1, 17], _global_inst_reply, answered_only=generated
    )
    judge_run(run, None, None, show_progress=False)
    assert cli.main(["metrics", str(run.path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "6 turn(s) were never generated (session 17, turns 6-11)" in err[0]
    result = _json(capsys, ["metrics", str(run.path), "--json", "--allow-partial", "--resamples", "20"])
    assert result["partial"] is True and result["n_ungenerated_turns"] == 6 and result["n_turns"] == 14
    # Judgments missing for a dialogue: refused the same way, then scored as a subset.
    unjudged = make_mteval_run(tmp_path / "unjudged", mteval_data_dir / GLOBAL_INST, [1, 17], _global_inst_reply)
    judge_run(unjudged, None, None, limit=1, show_progress=False)
    with pytest.raises(SysbenchError, match=r"10 expected turn\(s\) have no judgment: session 17, turns 2-11"):
        run_metrics(unjudged.path)
    assert run_metrics(unjudged.path, allow_partial=True, resamples=10)["n_missing_turns"] == 10


def test_unparsed_and_skipped_turns_are_refused_unless_excluded(tmp_path, mteval_data_dir):
    run = make_mteval_run(
        tmp_path / "fu", mteval_data_dir / "follow-up_multi.jsonl", [1], lambda s, t: None if t == 5 else "a reply"
    )
    run.judgments.append(
        [
            JudgmentRecord(1, 3, {}, score=7.0, scorer="judge", judge_model="j"),
            JudgmentRecord(1, 4, {}, parse_status="unparsed", scorer="judge", judge_model="j", raw_reply="?"),
            JudgmentRecord(1, 5, {}, parse_status="skipped", scorer="judge", attempts=0),
        ]
    )
    with pytest.raises(SysbenchError, match=r"1 judgment\(s\) are unparsed .*session 1, turn 4"):
        run_metrics(run.path, exclude_skipped=True)
    with pytest.raises(SysbenchError, match=r"skipped at generation .*session 1, turn 5"):
        run_metrics(run.path, exclude_unparsed=True)
    result = run_metrics(run.path, exclude_unparsed=True, exclude_skipped=True, resamples=10)
    assert result["n_turns"] == 1 and result["categories"]["follow-up"]["score"] == 7.0
    assert (result["n_unparsed_turns"], result["n_skipped_turns"], result["excluded_unparsed"]) == (1, 1, True)


# ---------------------------------------------------------------- compare


def _cls_reply(hit_every: int):
    """The gold label on every ``hit_every``-th answered turn, a miss elsewhere."""

    def reply(session, turn):
        hit = (session.system_id + turn) % hit_every == 0
        return f"Category: {session.turn(turn).reference}" if hit else "No idea."

    return reply


def test_multi_against_gold_history_is_paired(tmp_path, mteval_data_dir, capsys):
    multi = make_mteval_run(
        tmp_path / "multi", mteval_data_dir / CLS_MULTI, [1, 2, 3, 4], _cls_reply(3), label="toy multi"
    )
    gold = make_mteval_run(
        tmp_path / "gold",
        mteval_data_dir / CLS_MULTI,
        [1, 2, 3, 4],
        _cls_reply(2),
        history="reference",
        label="toy gold",
    )
    for run in (multi, gold):
        judge_run(run, None, None, show_progress=False)
    result = compare_runs(multi.path, gold.path, resamples=300)
    assert result["benchmark"] == "mteval"
    comparison = result["comparisons"][0]
    assert comparison["paired"] is True and comparison["bootstrap"]["paired"] is True
    a = run_metrics(multi.path, resamples=10)["overall"]
    b = run_metrics(gold.path, resamples=10)["overall"]
    row = comparison["metrics"]["overall"]
    assert (row["a"], row["b"]) == (pytest.approx(a), pytest.approx(b)) and row["diff"] == pytest.approx(b - a)
    low, high = row["ci95"]
    assert low <= b - a <= high
    assert comparison["metrics"]["category.recollection"]["diff"] == pytest.approx(b - a)
    assert [r["history"] for r in result["runs"]] == ["model", "reference"]
    # A run against itself: no difference and a zero-width paired interval.
    self_diff = compare_runs(multi.path, multi.path, resamples=50)["comparisons"][0]["metrics"]["overall"]
    assert self_diff["diff"] == 0 and self_diff["ci95"] == [0.0, 0.0]
    assert cli.main(["compare", str(multi.path), str(gold.path), "--resamples", "50"]) == 0
    out = capsys.readouterr().out
    assert "toy gold against toy multi: paired" in out and "| overall |" in out


def test_multi_against_single_is_unpaired_and_says_so(tmp_path, mteval_data_dir, capsys):
    multi = make_mteval_run(tmp_path / "multi", mteval_data_dir / CLS_MULTI, [1, 2], _cls_reply(2), label="multi")
    single = make_mteval_run(
        tmp_path / "single", mteval_data_dir / CLS_SINGLE, range(1, 21), _cls_reply(2), label="single"
    )
    gold = make_mteval_run(
        tmp_path / "gold", mteval_data_dir / CLS_MULTI, [1, 2], _cls_reply(1), history="reference", label="gold"
    )
    for run in (multi, single, gold):
        judge_run(run, None, None, show_progress=False)
    result = _json(
        capsys, ["compare", str(multi.path), str(single.path), str(gold.path), "--json", "--resamples", "100"]
    )
    vs_single, vs_gold = result["comparisons"]
    assert vs_single["paired"] is False and "different dialogues" in vs_single["pairing"]
    assert vs_gold["paired"] is True
    assert vs_single["n_sessions"] == {"a": 2, "b": 20}
    assert vs_single["metrics"]["task.recollection-cls"]["ci95"] is not None
    assert [r["settings"] for r in result["runs"]] == [["multi"], ["single"], ["multi"]]
    assert cli.main(["compare", str(multi.path), str(single.path), "--resamples", "50"]) == 0
    out = capsys.readouterr().out
    assert "single against multi: UNPAIRED" in out and "unpaired (different dialogues)" in out


def test_compare_refuses_mixed_benchmarks_and_unfinished_runs(tmp_path, mteval_data_dir, dataset, capsys):
    mteval = make_mteval_run(tmp_path / "m", mteval_data_dir / CLS_MULTI, [1], _cls_reply(2))
    sysbench = make_run(tmp_path / "s", dataset, [1])
    with pytest.raises(SysbenchError, match="compare: cannot mix MT-Eval runs with SysBench runs"):
        compare_runs(mteval.path, sysbench.path)
    with pytest.raises(SysbenchError, match="have no judgment.*compare needs complete runs"):
        compare_runs(mteval.path, mteval.path)
    assert cli.main(["compare", str(sysbench.path), str(sysbench.path), str(sysbench.path)]) == 2
    assert "compare takes two SysBench runs" in capsys.readouterr().err
