"""Session-level statistics shared by every benchmark's metrics: the session bootstrap, a session permutation test."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sysbench_gpu.core.errors import SysbenchError

PERMUTATION_CHUNK = 256  # permutations evaluated per call of the statistic (bounds the [chunk, N] index array)


def bootstrap_index(n_sessions: int, resamples: int, seed: int) -> np.ndarray:
    """Session indices of each resample (with replacement), from a seeded numpy Generator."""
    if resamples < 1:
        raise SysbenchError(f"--resamples must be at least 1, got {resamples}")
    rng = np.random.default_rng(seed)
    return rng.integers(0, n_sessions, size=(resamples, n_sessions))


def percentile_ci(values: np.ndarray) -> list[float] | None:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return None
    low, high = np.percentile(finite, [2.5, 97.5])
    return [float(low), float(high)]


@dataclass(frozen=True)
class PermutationTest:
    """Two-sided permutation p-values of a statistic, with what the permutations could exchange."""

    p: np.ndarray  # [K]; NaN where the observed statistic is not finite
    permutations: int  # random permutations drawn (the observed labelling is counted once more)
    seed: int
    exchangeable_sessions: int  # sessions that share their positions with at least one other session
    strata: int  # groups of two or more such sessions (labels move only inside a group)


def session_permutation_p(
    session_ids: np.ndarray,
    positions: np.ndarray,
    outcome: np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray],
    permutations: int,
    seed: int,
) -> PermutationTest:
    """p of ``|statistic|`` when whole sessions' outcome vectors are exchanged between sessions.

    Rows are turns: ``session_ids`` [N], ``positions`` [N] (the turn's number in its session),
    ``outcome`` [N]. A permutation hands each session the outcome vector of another session
    with the same positions (the same judged turns), each outcome staying at its turn number;
    a session with no such partner keeps its own. Turns of one session move together, so
    the clustering of outcomes within sessions is in the null distribution, and so is any
    pattern the outcome follows over turn numbers.

    ``statistic`` maps outcome vectors [B, N] to statistics [B, K]. p = (1 + number of
    permutations with |stat| >= |observed|) / (1 + permutations), near-ties counted.
    """
    if permutations < 1:
        raise SysbenchError(f"--permutations must be at least 1, got {permutations}")
    order = np.lexsort((positions, session_ids))
    rows_by_session: dict[int, list[int]] = defaultdict(list)
    for row in order:
        rows_by_session[int(session_ids[row])].append(int(row))
    by_positions: dict[tuple[int, ...], list[list[int]]] = defaultdict(list)
    for rows in rows_by_session.values():
        by_positions[tuple(int(positions[r]) for r in rows)].append(rows)
    strata = [np.asarray(group, dtype=np.int64) for group in by_positions.values() if len(group) >= 2]

    observed = np.asarray(statistic(outcome[None, :]), dtype=np.float64)[0]
    tolerance = 1e-9 * np.abs(observed) + 1e-12  # the same labelling summed in another order must count as a tie
    threshold = np.abs(observed) - tolerance
    extreme = np.zeros(observed.shape, dtype=np.int64)
    rng = np.random.default_rng(seed)
    n = outcome.size
    for start in range(0, permutations, PERMUTATION_CHUNK):
        size = min(PERMUTATION_CHUNK, permutations - start)
        index = np.broadcast_to(np.arange(n), (size, n)).copy()
        for rows in strata:  # rows: [sessions, turns] of one stratum
            shuffled = np.argsort(rng.random((size, rows.shape[0])), axis=1)
            index[:, rows.ravel()] = rows[shuffled].reshape(size, -1)
        values = np.asarray(statistic(outcome[index]), dtype=np.float64)
        with np.errstate(invalid="ignore"):
            extreme += (np.abs(values) >= threshold).sum(axis=0)
    p = np.where(np.isfinite(observed), (1.0 + extreme) / (1.0 + permutations), np.nan)
    return PermutationTest(
        p=p,
        permutations=permutations,
        seed=seed,
        exchangeable_sessions=int(sum(rows.shape[0] for rows in strata)),
        strata=len(strata),
    )
