"""Session-bootstrap statistics shared by every benchmark's metrics."""

from __future__ import annotations

import numpy as np

from sysbench_gpu.core.errors import SysbenchError


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
