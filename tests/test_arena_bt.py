"""The arena's Bradley-Terry fit: hand-worked cases, strengths recovered from synthetic battles, an independent
MM fit, session (not battle) resampling, the baseline anchor, online Elo, win rates and length control."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("sklearn")

from sysbench_gpu.arena.bt import Battles, fit_mm, fit_with_ci, online_elo, win_rates  # noqa: E402

ELO = 400.0


def _battles(games: list[tuple[int, int, float]], n: int, sessions: list[int] | None = None) -> Battles:
    a, b, s = zip(*games, strict=True)
    return Battles.of(a, b, s, sessions if sessions is not None else list(range(len(games))), n)


def test_two_players_hand_worked() -> None:
    # A beats B three times and loses once: P(A > B) = 3/4, so R_A - R_B = 400 log10(3) = 190.85; mean anchor 1000.
    fit = fit_with_ci(_battles([(0, 1, 1.0)] * 3 + [(0, 1, 0.0)], 2), anchor=None, resamples=0, seed=0)
    gap = ELO * math.log10(3.0)
    assert fit.ratings == pytest.approx([1000 + gap / 2, 1000 - gap / 2], abs=1e-3)


def test_a_tie_is_half_a_win_each_way() -> None:
    # 2 wins, 1 tie, 1 loss: A scores 2.5 of 4, so the odds are 2.5 / 1.5 and R_A - R_B = 400 log10(5/3).
    games = [(0, 1, 1.0), (0, 1, 1.0), (0, 1, 0.5), (1, 0, 1.0)]
    fit = fit_with_ci(_battles(games, 2), anchor=1, resamples=0, seed=0)
    assert fit.ratings[1] == pytest.approx(1000.0)
    assert fit.ratings[0] - fit.ratings[1] == pytest.approx(ELO * math.log10(5.0 / 3.0), abs=1e-3)


def test_three_players_hand_worked() -> None:
    # Strengths 4 : 2 : 1 predict A>B 2/3, B>C 2/3, A>C 4/5. Battles in exactly those shares make the
    # likelihood equations hold at those strengths, so the MLE is 400 log10(2) = 120.41 points per step.
    games = [(0, 1, 1.0)] * 2 + [(0, 1, 0.0)] + [(1, 2, 1.0)] * 2 + [(1, 2, 0.0)] + [(0, 2, 1.0)] * 4 + [(0, 2, 0.0)]
    battles = _battles(games, 3)
    step = ELO * math.log10(2.0)
    fit = fit_with_ci(battles, anchor=2, resamples=0, seed=0)
    assert fit.ratings == pytest.approx([1000 + 2 * step, 1000 + step, 1000.0], abs=1e-3)
    assert fit_mm(battles, anchor=2) == pytest.approx(fit.ratings, abs=1e-6)


def _synthetic(strengths: np.ndarray, n_battles: int, seed: int, tie_share: float = 0.2) -> Battles:
    rng = np.random.default_rng(seed)
    n = len(strengths)
    a = rng.integers(0, n, n_battles)
    b = (a + rng.integers(1, n, n_battles)) % n
    p = 1.0 / (1.0 + 10.0 ** ((strengths[b] - strengths[a]) / ELO))
    # A win drawn from the model; with ``tie_share`` some battles are ties instead (half a win each way).
    u = rng.random(n_battles)
    score = np.where(u < p, 1.0, 0.0)
    tie = rng.random(n_battles) < tie_share
    score = np.where(tie, 0.5, score)
    return Battles.of(a, b, score, rng.integers(0, 200, n_battles), n)


def test_recovers_known_strengths_from_synthetic_battles() -> None:
    truth = np.array([1150.0, 1080.0, 1000.0, 950.0, 820.0])
    battles = _synthetic(truth, 40_000, seed=1, tie_share=0.0)
    fit = fit_with_ci(battles, anchor=None, resamples=100, seed=0)
    expected = truth - truth.mean() + 1000.0
    assert np.max(np.abs(fit.ratings - expected)) < 15.0
    inside = [low <= value <= high for value, (low, high) in zip(expected, fit.ci, strict=True)]
    assert sum(inside) >= 4  # 95% intervals: at most one of five may miss by chance
    assert [i for i in np.argsort(-fit.ratings)] == [0, 1, 2, 3, 4]


def test_independent_mm_fit_agrees_with_the_logistic_fit() -> None:
    battles = _synthetic(np.array([1100.0, 1040.0, 990.0, 900.0]), 5_000, seed=2)
    logistic = fit_with_ci(battles, anchor=None, resamples=0, seed=0).ratings
    assert fit_mm(battles) == pytest.approx(logistic, abs=1e-3)


def test_intervals_resample_sessions_not_battles() -> None:
    # Every battle in one session: each resample draws that session, so the interval has no width.
    games = [(0, 1, 1.0)] * 30 + [(0, 1, 0.0)] * 10
    one_session = fit_with_ci(_battles(games, 2, [0] * 40), anchor=None, resamples=50, seed=0)
    assert one_session.ci[0][0] == pytest.approx(one_session.ci[0][1])
    many = fit_with_ci(_battles(games, 2), anchor=None, resamples=50, seed=0)
    assert many.ci[0][1] - many.ci[0][0] > 10.0


def test_online_elo_and_win_rates() -> None:
    battles = _battles([(0, 1, 1.0), (1, 0, 0.5)], 2)
    elo = online_elo(battles)
    # 1000 v 1000, A wins: +16 / -16; then a tie at 1016 v 984 moves B up by 32 * (0.5 - E_B).
    expected_b = 1.0 / (1.0 + 10.0 ** ((1016.0 - 984.0) / 400.0))
    assert elo[0] == pytest.approx(1016.0 - 32 * (0.5 - expected_b))
    assert elo[1] == pytest.approx(984.0 + 32 * (0.5 - expected_b))
    rates = win_rates(battles)
    assert rates[0, 1] == pytest.approx(0.75) and rates[1, 0] == pytest.approx(0.25)
    assert math.isnan(rates[0, 0])


def test_length_control_takes_the_win_that_is_only_length() -> None:
    # Two equal players; whoever wrote more wins. Without control the longer-writing one looks better;
    # with the length covariate the ratings come together and the coefficient carries the effect.
    rng = np.random.default_rng(3)
    n = 4000
    a = np.zeros(n, dtype=int)
    b = np.ones(n, dtype=int)
    x = np.clip(rng.normal(0.2, 0.3, n), -0.95, 0.95)  # player 0 usually writes more
    p = 1.0 / (1.0 + np.exp(-4.0 * x))
    score = (rng.random(n) < p).astype(float)
    battles = Battles.of(a, b, score, rng.integers(0, 100, n), 2, covariate=x)
    plain = fit_with_ci(battles, anchor=None, resamples=0, seed=0)
    controlled = fit_with_ci(battles, anchor=None, resamples=20, seed=0, with_covariate=True)
    assert plain.ratings[0] - plain.ratings[1] > 100.0
    assert abs(controlled.ratings[0] - controlled.ratings[1]) < 40.0
    assert controlled.coefficient is not None and controlled.coefficient > 0
    assert controlled.coefficient_ci is not None
