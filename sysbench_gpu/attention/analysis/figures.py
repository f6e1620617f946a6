"""The attention stage's figures, and the matplotlib helpers every analysis figure draws with.

(a) ``plot_token_shares``: per-token system share along one session, each turn on a
normalized unit of the x axis; (b) ``plot_turn_means``: per-turn mean over sessions,
system role solid and user role dashed, one colour per model.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sysbench_gpu.attention.analysis.turn_stats import DEFAULT_METRIC
from sysbench_gpu.attention.files.turn_table import TurnShare, token_series
from sysbench_gpu.core.errors import SysbenchError


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Centered moving average that shrinks its window at the edges."""
    if window <= 1 or values.size == 0:
        return values.astype(np.float64)
    kernel = np.ones(window)
    sums = np.convolve(values, kernel, mode="same")
    counts = np.convolve(np.ones_like(values, dtype=np.float64), kernel, mode="same")
    return sums / counts


def normalized_axis(turns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x positions for the tokens of the turn segments: turn i spans [i - 1, i); returns (token index, x)."""
    tokens, xs = [], []
    for number, (start, end) in enumerate(turns):
        length = max(int(end - start), 1)
        index = np.arange(int(start), int(end))
        tokens.append(index)
        xs.append(number + (index - start) / length)
    if not tokens:
        return np.zeros(0, dtype=int), np.zeros(0)
    return np.concatenate(tokens), np.concatenate(xs)


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, base: Path) -> list[Path]:
    base.parent.mkdir(parents=True, exist_ok=True)
    paths = [base.with_suffix(".png"), base.with_suffix(".pdf")]
    for path in paths:
        fig.savefig(path, dpi=150, bbox_inches="tight")
    return paths


def plot_token_shares(
    series: Sequence[tuple[str, Mapping[str, Any]]],
    layer: int,
    base: Path,
    window: int = 21,
    title: str | None = None,
) -> list[Path]:
    """Figure (a): per-token system share (leading tokens excluded) along a session, turns on a normalized axis.

    ``series``: (label, stored session arrays) pairs, e.g. the system and control runs of one session.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.2))
    styles = {"system": "-", "control": "--"}
    n_turns = 0
    for position, (label, stored) in enumerate(series):
        layers = [int(x) for x in stored["layers"]]
        if layer not in layers:
            continue
        meta = json.loads(str(stored["meta"]))
        _, share_excl = token_series(np.asarray(stored["shares"][layers.index(layer)]))
        turns = np.asarray(stored["turns"])
        n_turns = max(n_turns, len(turns))
        index, x = normalized_axis(turns)
        y = share_excl[index]
        color = f"C{position}"
        ax.plot(x, y, color=color, alpha=0.2, linewidth=0.5)
        ax.plot(
            x,
            moving_average(y, window),
            color=color,
            linestyle=styles.get(meta["condition"], "-"),
            linewidth=1.4,
            label=label,
        )
        ax.axhline(float(y.mean()) if y.size else 0.0, color=color, linestyle="-.", linewidth=0.6)
    for boundary in range(1, n_turns):
        ax.axvline(boundary, color="lightgray", linewidth=0.6, linestyle=":")
    ax.set_xticks([i + 0.5 for i in range(n_turns)])
    ax.set_xticklabels([f"T{i + 1}" for i in range(n_turns)])
    ax.set_xlim(0, max(n_turns, 1))
    ax.set_ylim(bottom=0)
    ax.set_ylabel("system share of attention\n(leading tokens excluded)")
    ax.set_xlabel(f"position in the conversation (each turn normalized; moving average of {window} tokens)")
    ax.set_title(title or f"layer {layer}")
    ax.legend(fontsize=8, frameon=False)
    paths = save_figure(fig, base)
    plt.close(fig)
    return paths


def plot_turn_means(
    tables: Sequence[tuple[str, Sequence[TurnShare]]],
    layer_label: str,
    base: Path,
    metric: str = DEFAULT_METRIC,
) -> list[Path]:
    """Figure (b): per-turn mean share over sessions, system role (solid) vs user role (dashed), per model."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    drawn = False
    for position, (model, rows) in enumerate(tables):
        color = f"C{position}"
        for condition, style in (("system", "-"), ("control", "--")):
            by_turn: dict[int, list[float]] = defaultdict(list)
            for row in rows:
                value = getattr(row, metric)
                if row.layer_label == layer_label and row.condition == condition and value is not None:
                    by_turn[row.turn].append(value)
            if not by_turn:
                continue
            turns = sorted(by_turn)
            means = [float(np.mean(by_turn[t])) for t in turns]
            role = "as system" if condition == "system" else "as user"
            ax.plot(turns, means, color=color, linestyle=style, marker="o", markersize=3, label=f"{model} {role}")
            drawn = True
    if not drawn:
        plt.close(fig)
        raise SysbenchError(f"no per-turn shares for layer {layer_label!r} to plot")
    ax.set_xlabel("turn")
    ax.set_xticks(sorted({row.turn for _, rows in tables for row in rows}))
    ax.set_ylabel(f"mean {metric.replace('_', ' ')}")
    ax.set_title(f"system text's share of attention ({layer_name(layer_label)})")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, frameon=False)
    paths = save_figure(fig, base)
    plt.close(fig)
    return paths


def layer_name(label: str, index: int | None = None) -> str:
    """'mid' -> 'mid layer (15)', 'layer3' -> 'layer 3'."""
    if label.startswith("layer"):
        return f"layer {label[5:]}"
    return f"{label} layer" + (f" ({index})" if index is not None else "")
