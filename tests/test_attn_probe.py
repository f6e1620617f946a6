"""The failure probe on synthetic per-head tables: a head that carries the outcome, one class, a one-class fold."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn")

from sysbench_gpu.attention.analysis.head_table import HeadTable  # noqa: E402
from sysbench_gpu.attention.analysis.probe import oof_predictions, probe_json, run_probe, summary_line  # noqa: E402


def table(n_sessions: int = 10, turns: int = 5, seed: int = 0) -> HeadTable:
    rng = np.random.default_rng(seed)
    n = n_sessions * turns
    passed = (rng.random(n) > 0.4).astype(float)
    shares = rng.normal(0.3, 0.05, size=(n, 2, 3))
    shares[:, 1, 2] += 0.2 * passed  # layer position 1, head 2 gives the system text more attention on passing turns
    return HeadTable(
        session_ids=np.repeat(np.arange(1, n_sessions + 1), turns),
        turns=np.tile(np.arange(1, turns + 1), n_sessions),
        reply_tokens=rng.integers(10, 60, n),
        shares=shares,
        passed=passed,
        layers=[4, 8],
        layer_labels=["mid", "last"],
    )


def test_a_head_that_carries_the_outcome_is_found_and_the_baseline_is_not():
    result = run_probe(table(), folds=5, n_boot=200)
    assert result.status == "ok" and result.folds == 5
    assert result.probe.auc > 0.9 and result.probe.ci95[0] > 0.75
    assert 0.2 < result.baseline.auc < 0.8
    line = summary_line(result)
    assert line.startswith("probe: CV AUC ") and "baseline (turn, reply length)" in line
    assert probe_json(result, "reply_share_excl_lead")["probe"]["auc"] == result.probe.auc


def test_unjudged_turns_are_left_out_and_one_class_is_one_line():
    data = table()
    data.passed[:] = 0.0
    data.passed[:3] = np.nan
    result = run_probe(data, n_boot=10)
    assert result.status == "one-class" and result.n_turns == 47
    assert summary_line(result) == "probe: every judged turn fails: the data hold one class, so there is no AUC"


def test_a_training_fold_with_one_class_predicts_its_rate():
    features = np.arange(8, dtype=float)[:, None]
    fail = np.array([1, 1, 1, 1, 0, 0, 1, 1], dtype=float)
    groups = np.array([1, 1, 2, 2, 3, 3, 4, 4])
    predicted = oof_predictions(features, fail, groups, folds=4, seed=0)
    # Holding out session 3 leaves only failing turns to train on.
    assert predicted[4] == predicted[5] == 1.0
    assert np.all((predicted >= 0) & (predicted <= 1))
