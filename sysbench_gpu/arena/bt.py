"""Bradley-Terry ratings of battles: the maximum-likelihood fit, its session bootstrap, and two checks.

The fit is a logistic regression without penalty on a +1/-1 design (player A +1, player B
-1), as Chatbot Arena fits it, done by scikit-learn (the ``arena`` extra). A tie counts as
half a win each way (Arena-Hard). Battles are first summed into distinct rows (pair,
outcome, rounded covariate) with weights, so a fit costs the same for 200 battles or
200 000, and a bootstrap replicate only re-weights the rows by how often each session was
drawn. Ratings are on the Elo scale, ``400 * log10`` of the strength, anchored at 1000.

:func:`fit_mm` (Hunter 2004's minorise-maximise iterations) and :func:`online_elo`
(llmuses' sequential Elo, K=32) do not use scikit-learn: the first checks the fit, the
second is shown beside it for comparison.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.stats import bootstrap_index, percentile_ci

ANCHOR = 1000.0
ELO_SCALE = 400.0 / math.log(10.0)  # natural-log strength to Elo points
COVARIATE_STEP = 0.02  # the length covariate is rounded to this, so battles sum into few rows
INSTALL_HINT = "the arena's Bradley-Terry fit needs scikit-learn: pip install 'sysbench-gpu[arena]'"


@dataclass(frozen=True)
class Battles:
    """Battles as arrays, one entry per battle: player indices, A's score (1, 0.5, 0), covariate, session."""

    a: np.ndarray
    b: np.ndarray
    score: np.ndarray
    session: np.ndarray
    n_players: int
    n_sessions: int
    covariate: np.ndarray | None = None  # e.g. the reply-length difference, A minus B, in [-1, 1]

    @classmethod
    def of(
        cls,
        a: Sequence[int],
        b: Sequence[int],
        score: Sequence[float],
        session: Sequence[int],
        n_players: int,
        covariate: Sequence[float] | None = None,
    ) -> Battles:
        sessions = np.asarray(session, dtype=np.int64)
        return cls(
            a=np.asarray(a, dtype=np.int64),
            b=np.asarray(b, dtype=np.int64),
            score=np.asarray(score, dtype=np.float64),
            session=sessions,
            n_players=n_players,
            n_sessions=int(sessions.max()) + 1 if sessions.size else 0,
            covariate=None if covariate is None else np.asarray(covariate, dtype=np.float64),
        )


@dataclass(frozen=True)
class Rows:
    """Distinct (a, b, score, covariate) rows, and which row each battle falls in."""

    a: np.ndarray
    b: np.ndarray
    score: np.ndarray
    covariate: np.ndarray | None
    of_battle: np.ndarray

    def weights(self, battle_weights: np.ndarray) -> np.ndarray:
        return np.bincount(self.of_battle, weights=battle_weights, minlength=len(self.a))


@dataclass(frozen=True)
class Fit:
    ratings: np.ndarray  # Elo scale, anchored
    coefficient: float | None = None  # the covariate's, in Elo points per unit (length control)


def rows_of(battles: Battles, with_covariate: bool) -> Rows:
    x = battles.covariate if with_covariate and battles.covariate is not None else None
    columns = [battles.a.astype(np.float64), battles.b.astype(np.float64), battles.score]
    if x is not None:
        columns.append(np.round(x / COVARIATE_STEP) * COVARIATE_STEP)
    table = np.stack(columns, axis=1) if battles.a.size else np.zeros((0, len(columns)))
    unique, inverse = np.unique(table, axis=0, return_inverse=True)
    return Rows(
        a=unique[:, 0].astype(np.int64),
        b=unique[:, 1].astype(np.int64),
        score=unique[:, 2],
        covariate=unique[:, 3] if x is not None else None,
        of_battle=np.asarray(inverse).reshape(-1),
    )


def _logistic() -> type:
    try:
        from sklearn.linear_model import LogisticRegression
    except ImportError:
        raise SysbenchError(INSTALL_HINT) from None
    return LogisticRegression


def _unpenalised(logistic: type) -> object:
    import sklearn

    major, minor = (int(part) for part in sklearn.__version__.split(".")[:2])
    # scikit-learn 1.8 deprecated penalty=None for C=inf; older versions want penalty=None.
    options = {"C": np.inf} if (major, minor) >= (1, 8) else {"penalty": None}
    return logistic(fit_intercept=False, max_iter=1000, tol=1e-10, solver="lbfgs", **options)


def fit_rows(rows: Rows, weights: np.ndarray, n_players: int, anchor: int | None = None) -> Fit:
    """Maximum likelihood on the weighted rows; a tie row is split into half a win and half a loss."""
    keep = weights > 0
    a, b, score, w = rows.a[keep], rows.b[keep], rows.score[keep], weights[keep]
    x = rows.covariate[keep] if rows.covariate is not None else None
    # Each row once as A's win (weight w * score) and once as A's loss (w * (1 - score)).
    design = np.zeros((2 * len(a), n_players + (1 if x is not None else 0)))
    for half in (0, 1):
        block = slice(half * len(a), (half + 1) * len(a))
        design[block][np.arange(len(a)), a] = 1.0
        design[block][np.arange(len(a)), b] = -1.0
        if x is not None:
            design[block, n_players] = x
    labels = np.concatenate([np.ones(len(a)), np.zeros(len(a))])
    sample = np.concatenate([w * score, w * (1.0 - score)])
    used = sample > 0
    if len(set(labels[used].tolist())) < 2:
        return Fit(ratings=np.full(n_players, np.nan))  # one side won every battle: no finite fit
    model = _unpenalised(_logistic())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a replicate near separation stops at max_iter; its ratings stay usable
        model.fit(design[used], labels[used], sample_weight=sample[used])  # type: ignore[attr-defined]
    coef = np.asarray(model.coef_).reshape(-1)  # type: ignore[attr-defined]
    strengths = coef[:n_players] * ELO_SCALE
    present = np.zeros(n_players, dtype=bool)
    present[a] = present[b] = True
    return Fit(
        ratings=anchored(strengths, anchor, present),
        coefficient=float(coef[n_players] * ELO_SCALE) if x is not None else None,
    )


def anchored(strengths: np.ndarray, anchor: int | None, present: np.ndarray | None = None) -> np.ndarray:
    """Shift so that player ``anchor`` (the baseline) or, with None, the mean of the players present sits at 1000.

    A player with no battle (``present`` False) has no rating: NaN, and it is left out of the mean, where its
    untouched coefficient of 0 would otherwise pull every rating (and sit at 1000 with an interval of no width).
    """
    present = np.ones(len(strengths), dtype=bool) if present is None else present
    if not present.any() or (anchor is not None and not present[anchor]):
        return np.full(len(strengths), np.nan)
    base = strengths[anchor] if anchor is not None else float(np.mean(strengths[present]))
    return np.where(present, strengths - base + ANCHOR, np.nan)


@dataclass(frozen=True)
class Ratings:
    ratings: np.ndarray
    ci: list[list[float] | None]
    coefficient: float | None
    coefficient_ci: list[float] | None
    failed: int = 0  # resamples with no finite fit (one side won every battle drawn): left out of every CI
    ci_resamples: list[int] | None = None  # per player, the resamples whose fit rated it: its CI's sample


def fit_with_ci(
    battles: Battles, *, anchor: int | None, resamples: int, seed: int, with_covariate: bool = False
) -> Ratings:
    """The fit on every battle, and 95% percentile intervals from resampling sessions (not battles)."""
    _logistic()  # the one-line install hint before anything else
    from threadpoolctl import threadpool_limits  # installed with scikit-learn

    rows = rows_of(battles, with_covariate)
    ones = np.ones(len(battles.a))
    draws = np.full((resamples, battles.n_players), np.nan)
    coefficients = np.full(resamples, np.nan)
    # Fits this small are ten times slower when BLAS spreads them over threads (measured on 2 shared cores).
    with threadpool_limits(limits=1):
        point = fit_rows(rows, rows.weights(ones), battles.n_players, anchor)
        if resamples > 0 and battles.n_sessions > 0:
            for index, drawn in enumerate(bootstrap_index(battles.n_sessions, resamples, seed)):
                times = np.bincount(drawn, minlength=battles.n_sessions).astype(np.float64)
                fit = fit_rows(rows, rows.weights(times[battles.session]), battles.n_players, anchor)
                draws[index] = fit.ratings
                if fit.coefficient is not None:
                    coefficients[index] = fit.coefficient
    # percentile_ci keeps finite draws only: count what it leaves out, so a reader sees how many are missing.
    failed = int(np.sum(~np.isfinite(draws).any(axis=1))) if resamples > 0 and battles.n_sessions > 0 else 0
    ci = [percentile_ci(draws[:, player]) for player in range(battles.n_players)]
    coefficient_ci = percentile_ci(coefficients) if point.coefficient is not None else None
    counts = [int(np.isfinite(draws[:, player]).sum()) for player in range(battles.n_players)]
    return Ratings(point.ratings, ci, point.coefficient, coefficient_ci, failed, counts)


def fit_mm(battles: Battles, anchor: int | None = None, tol: float = 1e-12, max_iter: int = 100_000) -> np.ndarray:
    """Hunter (2004)'s MM iterations for the same likelihood (ties as half wins); Elo scale, anchored."""
    n = battles.n_players
    wins = np.bincount(battles.a, weights=battles.score, minlength=n) + np.bincount(
        battles.b, weights=1.0 - battles.score, minlength=n
    )
    games = np.zeros((n, n))
    np.add.at(games, (battles.a, battles.b), 1.0)
    games = games + games.T
    p = np.ones(n)
    for _ in range(max_iter):
        denominator = (games / (p[:, None] + p[None, :])).sum(axis=1)
        new = np.where(denominator > 0, wins / np.where(denominator > 0, denominator, 1.0), p)
        new = np.maximum(new, 1e-300)  # a player with no win heads to 0: its rating is unbounded below
        new = new / math.exp(float(np.mean(np.log(new))))
        done = float(np.max(np.abs(np.log(new) - np.log(p)))) < tol
        p = new
        if done:
            break
    return anchored(np.log(p) * ELO_SCALE, anchor, games.sum(axis=1) > 0)


def unbounded(battles: Battles) -> list[int]:
    """Players who won every battle or lost every one: their maximum-likelihood rating is infinite."""
    n = battles.n_players
    points = np.bincount(battles.a, weights=battles.score, minlength=n) + np.bincount(
        battles.b, weights=1.0 - battles.score, minlength=n
    )
    games = np.bincount(battles.a, minlength=n) + np.bincount(battles.b, minlength=n)
    return [i for i in range(n) if games[i] > 0 and (points[i] == 0 or points[i] == games[i])]


def online_elo(battles: Battles, k: float = 32.0, start: float = ANCHOR) -> np.ndarray:
    """llmuses' sequential Elo: battles in the order given, each moving both ratings by K * (S - E)."""
    ratings = np.full(battles.n_players, start)
    for a, b, score in zip(battles.a.tolist(), battles.b.tolist(), battles.score.tolist(), strict=True):
        expected = 1.0 / (1.0 + 10.0 ** ((ratings[b] - ratings[a]) / 400.0))
        ratings[a] += k * (score - expected)
        ratings[b] -= k * (score - expected)
    return ratings


def win_rates(battles: Battles) -> np.ndarray:
    """Row player's share of its battles against the column player (ties half); NaN where they never met."""
    n = battles.n_players
    points = np.zeros((n, n))
    games = np.zeros((n, n))
    np.add.at(points, (battles.a, battles.b), battles.score)
    np.add.at(points, (battles.b, battles.a), 1.0 - battles.score)
    np.add.at(games, (battles.a, battles.b), 1.0)
    np.add.at(games, (battles.b, battles.a), 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(games > 0, points / np.where(games > 0, games, 1.0), np.nan)
