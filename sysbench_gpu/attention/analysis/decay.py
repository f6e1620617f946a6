"""Decay: the system share against turn index and against token distance from the system text.

In the spirit of Li et al. 2024 ("Measuring and controlling instruction (in)stability"):
does attention to the system message fade as the conversation goes on? For each attention
output directory (one per ``generate --history`` mode of the run it measured, read from the
manifest's ``conversation.history``), each condition (system, control) and each captured
layer, two straight-line fits with a 95% band from a session bootstrap (numpy least squares
per resample; whole sessions are resampled, so turns of one session stay together):

* ``turn``: a turn's mean reply share (lead excluded) against the turn number;
* ``distance``: the per-token share (lead excluded) of every token after the system text,
  averaged per session in bins of log2 distance (bin b holds distances 2^b to 2^(b+1) - 1:
  1, 2-3, 4-7, ...), against the bin number. Each forward counts from its own system text (single-turn runs).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sysbench_gpu.attention.analysis.figures import pyplot, save_figure
from sysbench_gpu.attention.analysis.turn_stats import DEFAULT_METRIC
from sysbench_gpu.attention.files.store import TURN_TABLE, load_session, read_manifest
from sysbench_gpu.attention.files.turn_table import read_turn_table, token_series
from sysbench_gpu.core.errors import SysbenchError

GRID_POINTS = 25


@dataclass
class Trend:
    """share = intercept + slope * x, with session-bootstrap CIs and a band on ``grid``."""

    n_points: int
    n_sessions: int
    slope: float | None
    intercept: float | None
    slope_ci95: list[float] | None
    grid: list[float]
    band_low: list[float]
    band_high: list[float]
    means: dict[str, float]  # x -> mean y over sessions, for the figure's markers


@dataclass
class DecaySeries:
    history: str
    condition: str
    layer_label: str
    turn: Trend
    distance: Trend


def fit_trend(session_ids: np.ndarray, x: np.ndarray, y: np.ndarray, n_boot: int, seed: int) -> Trend:
    """Least-squares line of y on x; the CI and band come from refitting on session resamples."""
    means = {f"{value:g}": float(y[x == value].mean()) for value in np.unique(x)}
    empty = Trend(int(x.size), int(np.unique(session_ids).size), None, None, None, [], [], [], means)
    if x.size < 2 or np.ptp(x) == 0:
        return empty
    slope, intercept = np.polyfit(x, y, 1)
    grid = np.linspace(float(x.min()), float(x.max()), GRID_POINTS)
    unique = np.unique(session_ids)
    rows = [np.flatnonzero(session_ids == sid) for sid in unique]
    rng = np.random.default_rng(seed)
    fits = []
    for _ in range(n_boot if unique.size >= 3 else 0):
        index = np.concatenate([rows[i] for i in rng.integers(0, unique.size, unique.size)])
        if np.ptp(x[index]) > 0:
            fits.append(np.polyfit(x[index], y[index], 1))
    trend = Trend(
        int(x.size), int(unique.size), float(slope), float(intercept), None, [float(g) for g in grid], [], [], means
    )
    if len(fits) >= max(n_boot // 2, 1):
        coefficients = np.asarray(fits)
        trend.slope_ci95 = [float(v) for v in np.percentile(coefficients[:, 0], [2.5, 97.5])]
        lines = coefficients[:, :1] * grid[None, :] + coefficients[:, 1:]
        low, high = np.percentile(lines, [2.5, 97.5], axis=0)
        trend.band_low, trend.band_high = [float(v) for v in low], [float(v) for v in high]
    return trend


def history_of(out: Path) -> str:
    """The history mode of the run an attention directory measured (its manifest's ``conversation.history``)."""
    conversation = read_manifest(out).get("conversation") or {}
    return str(conversation.get("history") or "model")


def distance_points(stored: dict[str, np.ndarray], position: int) -> tuple[np.ndarray, np.ndarray]:
    """(bin, mean share) per log2 distance bin of one session at one layer position (bin b: 2^b to 2^(b+1) - 1)."""
    _, excl = token_series(np.asarray(stored["shares"][position]))
    n_tokens = excl.size
    if "forwards" in stored:
        forwards = np.asarray(stored["forwards"])
        system_ends = np.asarray(stored["forward_spans"])[:, 1, 1]
    else:
        forwards = np.asarray([[0, n_tokens]])
        system_ends = np.asarray([np.asarray(stored["system"])[1]])
    distances, values = [], []
    for (_, end), system_end in zip(forwards, system_ends, strict=False):
        index = np.arange(int(system_end), int(end))
        distances.append(index - int(system_end) + 1)
        values.append(excl[index])
    distance = np.concatenate(distances) if distances else np.zeros(0)
    value = np.concatenate(values) if values else np.zeros(0)
    bins = np.floor(np.log2(np.maximum(distance, 1))).astype(int)
    centres, means = [], []
    for b in np.unique(bins):
        pick = bins == b
        centres.append(float(b))
        means.append(float(value[pick].mean()))
    return np.asarray(centres), np.asarray(means)


def decay_of_dir(out: Path, n_boot: int, seed: int, metric: str = DEFAULT_METRIC) -> list[DecaySeries]:
    """Both fits for every (condition, layer) of one attention output directory."""
    manifest = read_manifest(out)
    history = history_of(out)
    rows = read_turn_table(out / TURN_TABLE)
    if not rows:
        raise SysbenchError(f"{out / TURN_TABLE}: no per-turn rows (rerun `attention` to merge the table)")
    turn_points: dict[tuple[str, str], list[tuple[int, float, float]]] = defaultdict(list)
    for row in rows:
        value = getattr(row, metric)
        if value is not None:
            turn_points[(row.condition, row.layer_label)].append((row.system_id, float(row.turn), float(value)))
    labels = {int(index): label for label, index in (manifest.get("layer_labels") or {}).items()}
    distance_data: dict[tuple[str, str], list[tuple[int, float, float]]] = defaultdict(list)
    for path in sorted((out / "sessions").glob("*.npz")):
        stored = load_session(path)
        meta = json.loads(str(stored["meta"]))
        for position, layer in enumerate(int(x) for x in stored["layers"]):
            label = meta.get("layer_labels_by_index", {}).get(str(layer), labels.get(layer, f"layer{layer}"))
            for centre, mean in zip(*distance_points(stored, position), strict=False):
                distance_data[(meta["condition"], label)].append((int(meta["system_id"]), centre, mean))
    series = []
    for key in sorted(set(turn_points) | set(distance_data)):
        condition, label = key

        def fit(points: list[tuple[int, float, float]]) -> Trend:
            array = np.asarray(points, dtype=np.float64).reshape(-1, 3)
            return fit_trend(array[:, 0].astype(np.int64), array[:, 1], array[:, 2], n_boot, seed)

        series.append(DecaySeries(history, condition, label, fit(turn_points[key]), fit(distance_data[key])))
    return series


def decay_json(series: list[DecaySeries], metric: str) -> dict[str, Any]:
    """``decay.json``: one entry per history mode, condition and layer."""
    from dataclasses import asdict

    return {
        "metric": metric,
        "turn_fit": f"{metric} of a turn ~ a + b * turn",
        "distance_fit": (
            "share_excl_lead of a token, averaged per session in log2 distance bins, ~ a + b * floor(log2(distance))"
        ),
        "ci": "95% session bootstrap of the refitted line",
        "series": [asdict(item) for item in series],
    }


def summary_lines(series: list[DecaySeries]) -> list[str]:
    lines = []
    for item in series:
        parts = []
        for name, trend, unit in (("turn", item.turn, "per turn"), ("distance", item.distance, "per doubling")):
            if trend.slope is None:
                parts.append(f"{name}: no fit")
                continue
            ci = f" [{trend.slope_ci95[0]:+.4f}, {trend.slope_ci95[1]:+.4f}]" if trend.slope_ci95 else ""
            parts.append(f"{name} slope {trend.slope:+.4f}{ci} {unit}")
        lines.append(f"decay: {item.history:<11} {item.condition:<7} {item.layer_label:>7}: " + "; ".join(parts))
    return lines


def plot_decay(series: list[DecaySeries], layer_label: str, base: Path, title: str) -> list[Path]:
    """Two panels: share vs turn and share vs log2 distance; colour per history mode, system solid, control dashed."""
    chosen = [item for item in series if item.layer_label == layer_label]
    if not chosen:
        return []
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), layout="constrained")
    colors = {history: f"C{i}" for i, history in enumerate(sorted({item.history for item in chosen}))}
    # System arm first in each history's legend entries; control markers hollow, as its lines are dashed.
    for item in sorted(chosen, key=lambda entry: (entry.history, entry.condition != "system")):
        color = colors[item.history]
        style = "-" if item.condition == "system" else "--"
        role = "as system" if item.condition == "system" else "as user"
        for ax, trend in ((axes[0], item.turn), (axes[1], item.distance)):
            xs = sorted(float(k) for k in trend.means)
            face = color if item.condition == "system" else "none"
            ys = [trend.means[f"{x:g}"] for x in xs]
            ax.plot(xs, ys, "o", color=color, markerfacecolor=face, markersize=4, alpha=0.7)
            if trend.slope is None:
                continue
            grid = np.asarray(trend.grid)
            ax.plot(
                grid, trend.intercept + trend.slope * grid, color=color, linestyle=style, label=f"{item.history} {role}"
            )
            if trend.band_low:
                ax.fill_between(grid, trend.band_low, trend.band_high, color=color, alpha=0.12, linewidth=0)
    axes[0].set_xticks(sorted({int(float(k)) for item in chosen for k in item.turn.means}))
    axes[0].set_xlabel("turn")
    axes[0].set_ylabel("system share (reply, lead excluded)")
    bins = sorted({int(float(k)) for item in chosen for k in item.distance.means})
    axes[1].set_xticks(bins)
    axes[1].set_xticklabels([str(2**b) for b in bins], fontsize=8)
    axes[1].set_xlabel("tokens after the system text (log2 bins, lower edge)")
    axes[1].set_ylabel("system share (token, lead excluded)")
    for ax in axes:
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=10)
    paths = save_figure(fig, base)
    plt.close(fig)
    return paths
