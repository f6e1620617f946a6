"""MT-Eval's figures."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sysbench_gpu.core.plotting import Drawn, _panel_grid, _pyplot, _save, _style_cycle


def plot_mteval_by_turn(
    categories: Sequence[str],
    rows: Sequence[tuple[str, dict[str, Sequence[float | None]]]],
    base: Path,
    formats: Sequence[str],
) -> Drawn:
    """MT-Eval: per category, the mean score (0-10) at each answered-turn index, one line per leaderboard row."""
    plt = _pyplot()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig, axes = _panel_grid(plt, len(categories), max_cols=4, width=4.0)
        styles = _style_cycle(len(rows))
        legend: dict[str, Any] = {}
        for ax, category in zip(axes, categories, strict=False):
            longest = 1
            for (label, by_category), style in zip(rows, styles, strict=False):
                row = by_category.get(category) or []
                points = [(k, v) for k, v in enumerate(row, start=1) if v is not None]
                if not points:
                    continue
                longest = max(longest, len(row))
                (line,) = ax.plot(
                    [p[0] for p in points], [p[1] for p in points], linewidth=1.6, markersize=4, label=label, **style
                )
                legend.setdefault(label, line)
            ax.set_xticks(range(1, longest + 1))
            ax.set_ylim(0, 10.3)
            ax.set_xlabel("answered turn")
            ax.set_title(category.capitalize(), fontsize=11)
            ax.grid(alpha=0.3)
            ax.spines[["top", "right"]].set_visible(False)
        if axes:
            axes[0].set_ylabel("score (0-10)")
        fig.legend(
            list(legend.values()),
            list(legend.keys()),
            loc="lower center",
            ncol=min(4, max(1, len(legend))),
            fontsize=9,
            frameon=False,
            bbox_to_anchor=(0.5, 0.0),
        )
        fig.suptitle("MT-Eval: score by answered turn", fontsize=11)
        fig.tight_layout(rect=(0, (0.3 + 0.25 * math.ceil(len(legend) / 4)) / fig.get_figheight(), 1, 1))
        return _save(plt, fig, base, formats, caught)
