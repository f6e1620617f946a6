"""Figures of ``sysbench-gpu profile``: per call, tokens/s against the bound, cache hit rate and eta.

Drawn from the profile's JSON with matplotlib on the Agg backend (imported lazily
through :mod:`sysbench_gpu.core.plotting`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sysbench_gpu.core.plotting import _pyplot, _save


def _labels(calls: Sequence[Mapping[str, Any]]) -> list[str]:
    turns = [str(c["turn"]) for c in calls]
    # Repeated turn labels (a resumed run) stay distinct by call number.
    return turns if len(set(turns)) == len(turns) else [f"{c['index']}:{c['turn']}" for c in calls]


def plot_profile(data: Mapping[str, Any], out_dir: Path, formats: Sequence[str] = ("png",)) -> list[Path]:
    """Three figures under ``out_dir``; returns the files written."""
    calls = list(data["calls"])
    if not calls:
        return []
    plt = _pyplot()
    labels = _labels(calls)
    x = list(range(len(calls)))
    paths: list[Path] = []
    device = data["device"]["name"]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig, ax = plt.subplots(figsize=(max(4.0, 0.7 * len(calls) + 2), 3.2))
        bound = [c["bound_output_tokens_per_s"] or 0.0 for c in calls]
        ax.plot(x, bound, marker="s", linestyle="--", label=f"bound ({device})")
        if any(c["output_tokens_per_s"] is not None for c in calls):
            measured = [c["output_tokens_per_s"] or 0.0 for c in calls]
            ax.plot(x, measured, marker="o", label="measured")
        ax.set_yscale("log")
        ax.set_xticks(x, labels)
        ax.set_xlabel("turn")
        ax.set_ylabel("output tokens/s")
        ax.set_title("Throughput per call against the roofline bound")
        ax.legend()
        paths += _save(plt, fig, out_dir / "fig_profile_throughput", formats, caught).paths

        fig, ax = plt.subplots(figsize=(max(4.0, 0.7 * len(calls) + 2), 3.2))
        rates = [c["cache_hit_rate"] for c in calls]
        ax.bar(x, [r or 0.0 for r in rates], color="tab:green")
        ax.set_ylim(0, 1)
        ax.set_xticks(x, labels)
        ax.set_xlabel("turn")
        ax.set_ylabel("prompt tokens from the prefix cache")
        title = "Prefix-cache hit rate"
        if all(r is None for r in rates):
            title += " (not reported by the engine)"
        ax.set_title(title)
        paths += _save(plt, fig, out_dir / "fig_profile_cache_hits", formats, caught).paths

        fig, ax = plt.subplots(figsize=(max(4.0, 0.7 * len(calls) + 2), 3.2))
        etas = [c["efficiency"] for c in calls]
        ax.bar(x, [e or 0.0 for e in etas], color="tab:orange")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        if any(e for e in etas) and max(e for e in etas if e) < 0.05:
            ax.set_yscale("log")
        ax.set_xticks(x, labels)
        ax.set_xlabel("turn")
        ax.set_ylabel("efficiency η = bound / measured")
        ax.set_title("Efficiency per call" + ("" if any(etas) else " (no measured time)"))
        paths += _save(plt, fig, out_dir / "fig_profile_efficiency", formats, caught).paths
    return paths
