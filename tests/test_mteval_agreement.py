"""`judge agreement` on MT-Eval runs: score agreement per judged task, rule tasks as judge-independent; mixed
benchmarks refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from mteval_runs import make_mteval_run, marked

from sysbench_gpu import cli
from sysbench_gpu.benchmarks.mteval.agreement import mteval_agreement, score_block, spearman
from sysbench_gpu.core.records import JudgmentRecord
from sysbench_gpu.core.rundir import RunDir

FOLLOW_UP = "follow-up_multi.jsonl"
CLS = "recollection_single_cls.jsonl"


def _judge(run: RunDir, model: str, score_of) -> None:
    """Judgment records as a 1-10 judge would leave them; ``score_of(key)`` None: unparsed."""
    records = []
    for key in sorted(run.generations.read()):
        score = score_of(key)
        records.append(
            JudgmentRecord(
                system_id=key[0],
                turn=key[1],
                verdicts={},
                parse_status="ok" if score is not None else "unparsed",
                judge_model=model,
                score=float(score) if score is not None else None,
                scorer="judge",
            )
        )
    run.judgments.append(records, existing=set())


def test_spearman_matches_scipy_with_ties() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    a, b = rng.integers(1, 11, 40).astype(float), rng.integers(1, 11, 40).astype(float)
    assert spearman(a, b) == pytest.approx(scipy_stats.spearmanr(a, b).statistic)
    assert spearman(np.array([1.0, 2, 3, 4]), np.array([1.0, 3, 2, 4])) == pytest.approx(0.8)
    assert spearman(np.array([5.0, 5, 5]), np.array([1.0, 2, 3])) is None


def test_score_block_on_known_pairs() -> None:
    block = score_block({1: [(1, 1), (2, 3)], 2: [(3, 2), (4, 7)]}, resamples=200, seed=0)
    assert block["n_dialogues"] == 2 and block["n_turns"] == 4
    assert block["mean_abs_diff"] == pytest.approx((0 + 1 + 1 + 3) / 4)
    assert block["within_one"] == pytest.approx(0.75)
    low, high = block["within_one_ci95"]
    assert 0.5 <= low <= 0.75 <= high <= 1.0


def test_two_judges_on_the_same_replies(tmp_path: Path, mteval_data_dir: Path, capsys) -> None:
    a = make_mteval_run(tmp_path / "a", mteval_data_dir / FOLLOW_UP, [1, 2, 3, 4], marked())
    b = make_mteval_run(tmp_path / "b", mteval_data_dir / FOLLOW_UP, [1, 2, 3, 4], marked())
    _judge(a, "judge-a", lambda key: 1 + (key[0] * 3 + key[1]) % 10)
    # B agrees up to one point, except that it fails to parse one turn.
    _judge(b, "judge-b", lambda key: None if key == (1, 3) else min(10, 1 + (key[0] * 3 + key[1]) % 10 + key[1] % 2))
    report = mteval_agreement(a.path, b.path, resamples=200)
    block = report["judged_tasks"]["follow-up"]
    assert (report["judge_a"], report["judge_b"]) == ("judge-a", "judge-b")
    assert block["n_dialogues"] == 4 and block["n_turns"] == 11 and block["n_unparsed_left_out"] == 1
    assert block["within_one"] == 1.0 and 0 < block["mean_abs_diff"] <= 1 and block["spearman"] > 0.8
    assert all(len(block[f"{m}_ci95"]) == 2 for m in ("spearman", "mean_abs_diff", "within_one"))

    assert cli.main(["judge", "agreement", str(a.path), str(b.path)]) == 0
    out = capsys.readouterr().out
    assert "follow-up" in out and "Spearman rho" in out and "(1 unparsed left out)" in out
    assert cli.main(["judge", "agreement", str(a.path), str(b.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bootstrap"]["unit"] == "dialogue"


def test_rule_scored_tasks_are_judge_independent(tmp_path: Path, mteval_data_dir: Path, capsys) -> None:
    reply = lambda session, turn: session.turn(turn).reference.upper() + "!"  # noqa: E731
    a = make_mteval_run(tmp_path / "a", mteval_data_dir / CLS, [1, 2, 3], reply)
    b = make_mteval_run(tmp_path / "b", mteval_data_dir / CLS, [1, 2, 3], reply)
    assert cli.main(["judge", str(a.path)]) == 0 and cli.main(["judge", str(b.path), "--rules", "lenient"]) == 0
    report = mteval_agreement(a.path, b.path)
    assert report["judged_tasks"] == {}
    assert report["judge_independent_tasks"] == {"recollection-cls": {"scorer": "cls", "n_turns": 3, "same_verdict": 3}}
    capsys.readouterr()
    assert cli.main(["judge", "agreement", str(a.path), str(b.path)]) == 0
    assert "judge-independent (cls rule): 3 of 3" in capsys.readouterr().out


def test_different_replies_are_refused(tmp_path: Path, mteval_data_dir: Path, capsys) -> None:
    a = make_mteval_run(tmp_path / "a", mteval_data_dir / FOLLOW_UP, [1], marked("good"))
    b = make_mteval_run(tmp_path / "b", mteval_data_dir / FOLLOW_UP, [1], marked("other"))
    _judge(a, "j", lambda key: 5)
    _judge(b, "j", lambda key: 5)
    assert cli.main(["judge", "agreement", str(a.path), str(b.path)]) == 2
    assert "judge different responses" in capsys.readouterr().err


def test_a_sysbench_run_and_an_mteval_run_are_different_benchmarks(
    tmp_path: Path, shared_dir: Path, mteval_data_dir: Path, capsys
) -> None:
    from sysbench_gpu.benchmarks.sysbench.upstream import import_workbook

    sysbench = tmp_path / "sysbench"
    import_workbook(shared_dir / "upstream-results" / "gpt4o" / "gpt4o_analysis.xlsx", sysbench)
    mteval = make_mteval_run(tmp_path / "mteval", mteval_data_dir / FOLLOW_UP, [1], marked())
    for pair in ((sysbench, mteval.path), (mteval.path, sysbench)):
        capsys.readouterr()
        assert cli.main(["judge", "agreement", str(pair[0]), str(pair[1])]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "judge different responses" not in err
        assert "SysBench" in err and "MT-Eval" in err and "give runs of one benchmark at a time" in err
        assert err.startswith("error: judge agreement: cannot mix ")  # not "cannot judge agreement SysBench runs"
    # MT-Eval's judge options are refused on a SysBench run, in one line.
    assert cli.main(["judge", str(sysbench), "--rules", "lenient"]) == 2
    assert "--rules does not apply to SysBench runs" in capsys.readouterr().err
