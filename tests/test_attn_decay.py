"""Decay fits on synthetic data: a known slope is recovered with a CI around it; token distances bin by log2."""

from __future__ import annotations

import numpy as np

from sysbench_gpu.attention.analysis.decay import DecaySeries, distance_points, fit_trend, summary_lines


def test_fit_trend_recovers_a_known_slope_with_a_session_bootstrap_ci():
    rng = np.random.default_rng(0)
    sessions = np.repeat(np.arange(20), 5)
    turn = np.tile(np.arange(1, 6), 20).astype(float)
    share = 0.5 - 0.03 * turn + rng.normal(0, 0.01, turn.size) + np.repeat(rng.normal(0, 0.02, 20), 5)
    trend = fit_trend(sessions, turn, share, n_boot=300, seed=0)
    assert abs(trend.slope + 0.03) < 0.005
    assert trend.slope_ci95[0] < -0.03 < trend.slope_ci95[1] and trend.slope_ci95[1] < 0
    assert len(trend.grid) == len(trend.band_low) == len(trend.band_high)
    assert all(low <= high for low, high in zip(trend.band_low, trend.band_high, strict=True))
    assert set(trend.means) == {"1", "2", "3", "4", "5"}
    # Two sessions: a line, but no CI.
    few = fit_trend(sessions[:10], turn[:10], share[:10], n_boot=50, seed=0)
    assert few.slope is not None and few.slope_ci95 is None
    series = [DecaySeries("model", "system", "mid", trend, few)]
    line = summary_lines(series)[0]
    assert line.startswith("decay: model       system      mid: turn slope -0.0") and line.endswith("per doubling")


def test_distance_points_bin_each_forward_from_its_own_system_text():
    shares = np.zeros((1, 12, 2))
    shares[0, :, 1] = np.arange(12) / 100  # system share rises along the tokens; lead share 0
    one = {"shares": shares, "system": np.array([1, 3])}
    bins, means = distance_points(one, 0)
    # Tokens 3..11 are 1..9 tokens after the system text: bins 0 (1), 1 (2-3), 2 (4-7), 3 (8-9).
    assert bins.tolist() == [0, 1, 2, 3]
    assert np.allclose(means, [0.03, 0.045, 0.075, 0.105])
    two = dict(one, forwards=np.array([[0, 6], [6, 12]]), forward_spans=np.array([[[0, 1], [1, 3]], [[6, 7], [7, 9]]]))
    bins, means = distance_points(two, 0)
    # Forward 1: tokens 3-5 (distances 1-3); forward 2: tokens 9-11 (distances 1-3).
    assert bins.tolist() == [0, 1]
    assert np.allclose(means, [(0.03 + 0.09) / 2, (0.04 + 0.05 + 0.10 + 0.11) / 4])
