"""Which heads carry the system message: a layer x head map of system share and of its correlation with turn pass.

For every captured (layer, head): the mean reply share (lead excluded) over judged turns,
the point-biserial r between that share and the turn's pass (Pearson with a 0/1 outcome),
a 95% CI that resamples whole sessions, a two-sided p from a session permutation test
(whole sessions' pass/fail vectors exchanged between sessions, ``core.stats``) and its
Benjamini-Hochberg q over all heads of the map (scipy). Turns cluster within sessions, so
neither the CI nor the p treats them as independent. The top heads go to ``top_heads.json``
in the form ``generate --steer-heads FILE`` reads, each with its q and whether it passes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sysbench_gpu.attention.analysis.figures import pyplot, save_figure
from sysbench_gpu.attention.analysis.head_table import HeadTable
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.stats import session_permutation_p
from sysbench_gpu.modeling.steering import SESSION_AWARE_P

ALPHA = 0.05  # the FDR level that marks a head in the map and in the summary
DEFAULT_PERMUTATIONS = 10000
P_METHOD = SESSION_AWARE_P  # what `--steer-heads` looks for to trust a file's q


@dataclass
class HeadMap:
    layers: list[int]
    layer_labels: list[str]
    mean_share: np.ndarray  # [L, H]
    r: np.ndarray  # [L, H], NaN where a head's share or the outcome is constant
    ci_low: np.ndarray  # [L, H]
    ci_high: np.ndarray  # [L, H]
    p: np.ndarray  # [L, H], session permutation test
    q: np.ndarray  # [L, H], Benjamini-Hochberg over the finite p
    n_turns: int
    n_sessions: int
    pass_rate: float
    replicates: int  # bootstrap replicates with both classes (the CI's)
    permutations: int
    seed: int
    exchangeable_sessions: int  # sessions whose labels a permutation can move
    strata: int

    @property
    def n_tests(self) -> int:
        return int(np.isfinite(self.p).sum())

    @property
    def significant(self) -> np.ndarray:
        """[L, H] bool: q < ALPHA."""
        return np.nan_to_num(self.q, nan=1.0) < ALPHA


def columnwise_r(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson r of every column of x [N, K] with y [N]; NaN where a column or y is constant."""
    xc = x - x.mean(axis=0)
    yc = y - y.mean()
    denominator = np.sqrt((xc**2).sum(axis=0) * (yc**2).sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (xc * yc[:, None]).sum(axis=0) / denominator
    return np.where(denominator > 0, r, np.nan)


def r_of_outcomes(x: np.ndarray, y: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """The statistic of the permutation test: r of every column of x [N, K] with each outcome vector [B, N].

    A permutation keeps the multiset of outcomes, so each vector's mean and spread are y's and
    its r is one matrix product; with them fixed, r is a linear function of the head's pass
    minus fail mean share, so the test of r is the test of that difference.
    """
    xc = x - x.mean(axis=0)
    y_mean = y.mean()
    denominator = np.sqrt((xc**2).sum(axis=0) * ((y - y_mean) ** 2).sum())
    scale = np.where(denominator > 0, 1.0 / np.where(denominator > 0, denominator, 1.0), np.nan)

    def statistic(outcomes: np.ndarray) -> np.ndarray:
        return ((outcomes - y_mean) @ xc) * scale

    return statistic


def bh_q_values(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg q of the finite p-values (scipy's false_discovery_control); NaN stays NaN."""
    from scipy import stats

    q = np.full_like(p, np.nan)
    finite = np.isfinite(p)
    if finite.any():
        q[finite] = stats.false_discovery_control(p[finite], method="bh")
    return q


def session_bootstrap_r(
    session_ids: np.ndarray, x: np.ndarray, y: np.ndarray, n_boot: int, seed: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """95% percentile CI per column of r, resampling whole sessions; (low, high, replicates with both classes)."""
    unique = np.unique(session_ids)
    rows = [np.flatnonzero(session_ids == sid) for sid in unique]
    rng = np.random.default_rng(seed)
    estimates = []
    for _ in range(n_boot):
        index = np.concatenate([rows[i] for i in rng.integers(0, unique.size, unique.size)])
        if np.ptp(y[index]) == 0:
            continue  # a resample with one class has no correlation
        estimates.append(columnwise_r(x[index], y[index]))
    nan = np.full(x.shape[1], np.nan)
    if unique.size < 3 or len(estimates) < n_boot // 2:
        return nan, nan, len(estimates)
    stacked = np.asarray(estimates)
    with np.errstate(invalid="ignore"):
        low, high = np.nanpercentile(stacked, [2.5, 97.5], axis=0)
    return low, high, len(estimates)


def head_map(table: HeadTable, n_boot: int = 1000, seed: int = 0, permutations: int = DEFAULT_PERMUTATIONS) -> HeadMap:
    """The map over the judged turns of ``table``; refuses a table with no judged turn."""
    judged = table.judged()
    n, n_layers, n_heads = judged.shares.shape
    if n == 0:
        raise SysbenchError("heads: no measured turn has a pass or fail verdict (judge the run first)")
    x = judged.shares.reshape(n, n_layers * n_heads)
    y = judged.passed
    nan = np.full(x.shape[1], np.nan)
    two_classes = bool(np.ptp(y) > 0)
    r = columnwise_r(x, y) if two_classes else nan
    low, high, used = nan, nan, 0
    p, drawn, exchangeable, strata = nan, 0, 0, 0
    if two_classes:  # one class has no correlation to test
        low, high, used = session_bootstrap_r(judged.session_ids, x, y, n_boot, seed)
        test = session_permutation_p(judged.session_ids, judged.turns, y, r_of_outcomes(x, y), permutations, seed)
        p, drawn, exchangeable, strata = test.p, test.permutations, test.exchangeable_sessions, test.strata
    shape = (n_layers, n_heads)
    return HeadMap(
        layers=table.layers,
        layer_labels=table.layer_labels,
        mean_share=x.mean(axis=0).reshape(shape),
        r=r.reshape(shape),
        ci_low=low.reshape(shape),
        ci_high=high.reshape(shape),
        p=p.reshape(shape),
        q=bh_q_values(p).reshape(shape),
        n_turns=n,
        n_sessions=int(np.unique(judged.session_ids).size),
        pass_rate=float(y.mean()),
        replicates=used,
        permutations=drawn,
        seed=seed,
        exchangeable_sessions=exchangeable,
        strata=strata,
    )


def _grid(values: np.ndarray) -> list[list[float | None]]:
    return [[float(v) if np.isfinite(v) else None for v in row] for row in values]


def p_value_json(result: HeadMap) -> dict[str, Any]:
    """How the p-values were found (``heads.json`` and ``top_heads.json`` carry it; ``--steer-heads`` looks for it)."""
    return {
        "method": P_METHOD,
        "statistic": "point-biserial r of the head's share with turn pass (two-sided, |r|)",
        "exchanged": "whole sessions' pass/fail vectors, between sessions judged on the same turn numbers",
        "permutations": result.permutations,
        "seed": result.seed,
        "smallest_p": 1.0 / (result.permutations + 1) if result.permutations else None,
        "exchangeable_sessions": result.exchangeable_sessions,
        "strata": result.strata,
    }


def head_map_json(result: HeadMap, metric: str) -> dict[str, Any]:
    """``heads.json``: every grid is [layer position][head], layers as in ``layers``."""
    return {
        "metric": metric,
        "condition": "system",
        "outcome": "turn pass (1) or fail (0), from the benchmark's turn_view",
        "layers": result.layers,
        "layer_labels": result.layer_labels,
        "n_heads": int(result.r.shape[1]),
        "n_turns": result.n_turns,
        "n_sessions": result.n_sessions,
        "pass_rate": result.pass_rate,
        "bootstrap_replicates": result.replicates,
        "bootstrap_seed": result.seed,
        "p_value": p_value_json(result),
        "fdr": {"method": "benjamini-hochberg", "alpha": ALPHA, "n_tests": result.n_tests},
        "n_significant": int(result.significant.sum()),
        "mean_share": _grid(result.mean_share),
        "r_point_biserial": _grid(result.r),
        "ci95_low": _grid(result.ci_low),
        "ci95_high": _grid(result.ci_high),
        "p": _grid(result.p),
        "q": _grid(result.q),
    }


def top_heads(result: HeadMap, k: int) -> dict[str, Any]:
    """The ``k`` heads with the largest positive r, significant or not (``generate --steer-heads`` reads ``heads``).

    Each head's ``q`` is the session-aware one and ``significant`` says q < ``alpha``;
    ``--steer-heads`` warns when it steers a head that is not.
    """
    order = [
        (float(result.r[i, j]), i, j)
        for i in range(result.r.shape[0])
        for j in range(result.r.shape[1])
        if np.isfinite(result.r[i, j]) and result.r[i, j] > 0
    ]
    order.sort(key=lambda item: -item[0])
    chosen = order[:k]
    return {
        "heads": [[result.layers[i], j] for _, i, j in chosen],
        "criterion": (
            f"top {k} heads by point-biserial r (> 0) between the head's reply share of the system text "
            f"(lead excluded, system condition) and turn pass, over {result.n_turns} turns of "
            f"{result.n_sessions} sessions; p: session permutation test ({result.permutations} permutations); "
            f"q: Benjamini-Hochberg over {result.n_tests} heads; significant: q < {ALPHA}"
        ),
        "alpha": ALPHA,
        "p_value": p_value_json(result),
        "n_listed_significant": int(sum(bool(result.significant[i, j]) for _, i, j in chosen)),
        "details": [
            {
                "layer": result.layers[i],
                "head": j,
                "r": r,
                "ci95": [_finite(result.ci_low[i, j]), _finite(result.ci_high[i, j])],
                "p": _finite(result.p[i, j]),
                "q": _finite(result.q[i, j]),
                "significant": bool(result.significant[i, j]),
                "mean_share": float(result.mean_share[i, j]),
            }
            for r, i, j in chosen
        ],
    }


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def summary_lines(result: HeadMap, top: dict[str, Any]) -> list[str]:
    lines = [
        f"heads: {result.r.size} heads over {result.n_turns} judged turns of {result.n_sessions} sessions "
        f"(pass rate {result.pass_rate:.2f}); {int(result.significant.sum())} with q < {ALPHA} "
        f"(Benjamini-Hochberg on session-permutation p, {result.permutations} permutations, seed {result.seed})"
    ]
    if not np.isfinite(result.r).any():
        lines.append("heads: every judged turn has the same outcome; no correlation")
    lines += permutation_notes(result)
    for item in top["details"][:5]:
        ci = item["ci95"]
        ci_text = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if None not in ci else ""
        q_text = "n/a" if item["q"] is None else f"{item['q']:.3f}"
        lines.append(
            f"  layer {item['layer']:>3} head {item['head']:>3}: r = {item['r']:.3f}{ci_text}, "
            f"q = {q_text}, mean share {item['mean_share']:.4f}"
        )
    return lines


def permutation_notes(result: HeadMap) -> list[str]:
    """What limits the test: sessions no permutation can move, and too few permutations for BH over many heads."""
    notes = []
    if not result.permutations:
        return notes
    fixed = result.n_sessions - result.exchangeable_sessions
    if fixed:
        notes.append(
            f"heads: {fixed} of {result.n_sessions} sessions share their judged turn numbers with no other session "
            "and keep their labels in every permutation"
        )
    if result.n_tests and 1.0 / (result.permutations + 1) > ALPHA / result.n_tests:
        needed = int(np.ceil(result.n_tests / ALPHA))
        notes.append(
            f"heads: the smallest p of {result.permutations} permutations, 1/{result.permutations + 1}, is above "
            f"{ALPHA}/{result.n_tests} heads: one head alone cannot pass BH (use --permutations {needed} or more)"
        )
    return notes


def plot_head_map(result: HeadMap, base: Path, title: str) -> list[Path]:
    """Two heat maps, layer x head: mean system share, and r with turn pass (* marks q < ALPHA)."""
    plt = pyplot()
    n_layers, n_heads = result.r.shape
    fig, axes = plt.subplots(
        1, 2, figsize=(3.0 + 0.9 * n_heads, 1.8 + 0.45 * n_layers), squeeze=False, layout="constrained"
    )
    left, right = axes[0]
    image = left.imshow(result.mean_share, aspect="auto", cmap="viridis", vmin=0)
    fig.colorbar(image, ax=left, label="mean share")
    left.set_title("system share (reply, lead excluded)", fontsize=9)
    limit = float(np.nanmax(np.abs(result.r))) if np.isfinite(result.r).any() else 1.0
    image = right.imshow(np.ma.masked_invalid(result.r), aspect="auto", cmap="RdBu", vmin=-limit, vmax=limit)
    fig.colorbar(image, ax=right, label="point-biserial r")
    right.set_title(f"r with turn pass (* BH q < {ALPHA})", fontsize=9)
    for i in range(n_layers):
        for j in range(n_heads):
            if np.isfinite(result.q[i, j]) and result.q[i, j] < ALPHA:
                right.text(j, i, "*", ha="center", va="center", color="black", fontsize=10)
    for ax in (left, right):
        ax.set_xticks(range(n_heads))
        ax.set_yticks(range(n_layers))
        ax.set_yticklabels([str(layer) for layer in result.layers])
        ax.set_xlabel("head")
    left.set_ylabel("layer")
    fig.suptitle(title, fontsize=10)
    paths = save_figure(fig, base)
    plt.close(fig)
    return paths
