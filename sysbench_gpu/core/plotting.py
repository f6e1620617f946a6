"""Figure plumbing shared by every benchmark's figures: a lazy pyplot, saving in several formats, styles."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sysbench_gpu.core.errors import SysbenchError


@dataclass
class Drawn:
    """Files written for one figure and any font warnings raised while drawing it."""

    paths: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, base: Path, formats: Sequence[str], caught: list[warnings.WarningMessage]) -> Drawn:
    drawn = Drawn()
    base.parent.mkdir(parents=True, exist_ok=True)
    for fmt in formats:
        path = base.with_name(f"{base.name}.{fmt}")
        # No dates in the files, so reruns give the same bytes.
        metadata = {"CreationDate": None} if fmt == "pdf" else ({"Date": None} if fmt == "svg" else None)
        fig.savefig(path, dpi=150, bbox_inches="tight", metadata=metadata)
        drawn.paths.append(path)
    plt.close(fig)
    seen = set()
    for item in caught:
        text = str(item.message)
        if "missing from" in text and "font" in text and text not in seen:
            seen.add(text)
            drawn.warnings.append(f"{base.name}: {text}")
    return drawn


def _style_cycle(n: int) -> list[dict[str, Any]]:
    """Distinct colour, line style and marker per series; readable up to ~20 series.

    Beyond ten series the light halves of tab20 come second and dashed, so neighbours
    in the legend never share a hue.
    """
    plt = _pyplot()
    if n <= 10:
        colors = [plt.get_cmap("tab10")(i) for i in range(10)]
    else:
        tab20 = plt.get_cmap("tab20")
        colors = [tab20(2 * i) for i in range(10)] + [tab20(2 * i + 1) for i in range(10)]
    markers = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">"]
    return [
        {
            "color": colors[i % len(colors)],
            "marker": markers[i % len(markers)],
            "linestyle": "-" if i < 10 else "--",
        }
        for i in range(n)
    ]


def _panel_grid(plt: Any, n: int, width: float = 4.4, height: float = 3.4, max_cols: int = 3) -> tuple[Any, list[Any]]:
    """A figure of ``n`` panels sharing the y axis, ``max_cols`` per row; unused slots are hidden."""
    cols = max(1, min(max_cols, n))
    rows = max(1, math.ceil(n / cols))
    if cols == 1:
        width = max(width, 6.5)  # one panel carries the figure's title and legend alone
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols + 0.6, height * rows + 1.3), sharey=True, squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


FIGURE_FORMATS = ("png", "pdf", "svg")


def parse_formats(text: str) -> list[str]:
    formats = [item.strip().lower().lstrip(".") for item in text.split(",") if item.strip()]
    unknown = [item for item in formats if item not in FIGURE_FORMATS]
    if not formats:
        raise SysbenchError(f"--formats: no format given (choose from {', '.join(FIGURE_FORMATS)})")
    if unknown:
        raise SysbenchError(f"--formats: unknown format {', '.join(unknown)} (choose from {', '.join(FIGURE_FORMATS)})")
    return formats
