"""The report's figures, drawn with matplotlib on the Agg backend.

matplotlib is imported inside ``core.plotting._pyplot``, so importing this module (and
the CLI) stays cheap. Every figure is saved in each requested format; warnings about
glyphs missing from the fonts are collected and handed back, so the report can say
when a label would render as boxes (the data's domain names are Chinese and the
default fonts have no CJK glyphs, hence the English names below).
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.sysbench.data import TYPE_ORDER
from sysbench_gpu.core.plotting import Drawn, _panel_grid, _pyplot, _save, _style_cycle
from sysbench_gpu.core.sessions import Session

# The 22 domains (领域) of SysBench, in English for the figure.
DOMAIN_NAMES_EN: dict[str, str] = {
    "其他": "Other",
    "NLP": "NLP",
    "文化娱乐": "Culture & entertainment",
    "通用生活": "Daily life",
    "教育": "Education",
    "通用工作": "General work",
    "心理情感": "Psychology & emotions",
    "传媒": "Media",
    "游戏": "Games",
    "互联网": "Internet",
    "医疗": "Healthcare",
    "金融": "Finance",
    "旅游": "Travel",
    "招聘": "Recruiting",
    "科技数码": "Tech & gadgets",
    "运动健身": "Sports & fitness",
    "美食": "Food",
    "宗教玄学": "Religion & metaphysics",
    "法律": "Law",
    "汽车": "Automotive",
    "房地产": "Real estate",
    "政务": "Government affairs",
}


def domain_name_en(domain: str | None) -> str:
    """English name of a domain; the raw name when the table has none."""
    if domain is None:
        return "Unknown"
    return DOMAIN_NAMES_EN.get(domain, domain)


def plot_dataset_distribution(sessions: Sequence[Session], base: Path, formats: Sequence[str]) -> Drawn:
    """Sessions per domain (split into dependent / parallel) and constraints per type."""
    plt = _pyplot()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        by_domain = Counter(domain_name_en(s.domain) for s in sessions)
        dependent = Counter(domain_name_en(s.domain) for s in sessions if s.dependent)
        domains = sorted(by_domain, key=lambda d: (by_domain[d], d))  # largest at the top of barh
        by_type = Counter(c.type for s in sessions for t in s.turns for c in t.constraints)
        n_constraints = sum(by_type.values())

        fig, (ax_domain, ax_type) = plt.subplots(
            1, 2, figsize=(13, max(4.5, 0.3 * len(domains) + 1.5)), gridspec_kw={"width_ratios": [1.5, 1]}
        )
        y = range(len(domains))
        dep = [dependent[d] for d in domains]
        par = [by_domain[d] - dependent[d] for d in domains]
        ax_domain.barh(y, dep, color="#4C72B0", label="multi-turn dependent")
        ax_domain.barh(y, par, left=dep, color="#DD8452", label="multi-turn parallel")
        for yi, d in zip(y, domains, strict=False):
            ax_domain.text(by_domain[d] + 0.5, yi, str(by_domain[d]), va="center", fontsize=8)
        ax_domain.set_yticks(list(y))
        ax_domain.set_yticklabels(domains, fontsize=9)
        ax_domain.set_xlabel("sessions")
        ax_domain.set_xlim(0, max(by_domain.values(), default=1) * 1.12)
        ax_domain.set_title(f"Sessions by domain ({len(sessions)} sessions, {len(domains)} domains)")
        ax_domain.legend(loc="lower right", fontsize=9, frameon=False)
        ax_domain.spines[["top", "right"]].set_visible(False)

        types = [t for t in TYPE_ORDER if by_type.get(t)] or list(TYPE_ORDER)
        counts = [by_type.get(t, 0) for t in types]
        bars = ax_type.bar(range(len(types)), counts, color=plt.get_cmap("Set2")(range(len(types))))
        for bar, count in zip(bars, counts, strict=False):
            share = 100.0 * count / n_constraints if n_constraints else 0.0
            ax_type.annotate(
                f"{count}\n({share:.1f}%)",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
                xytext=(0, 2),
                textcoords="offset points",
            )
        ax_type.set_xticks(range(len(types)))
        ax_type.set_xticklabels([t.capitalize() for t in types], rotation=30, ha="right")
        ax_type.set_ylabel("constraints")
        ax_type.set_ylim(0, max(counts, default=1) * 1.2)
        ax_type.set_title(f"Constraints by type ({n_constraints} constraints)")
        ax_type.spines[["top", "right"]].set_visible(False)
        fig.tight_layout()
        return _save(plt, fig, base, formats, caught)


def radar_limits(values: Sequence[float | None]) -> tuple[float, float]:
    """Radial range in percent: from a round number below the smallest value up to 100."""
    present = [v for v in values if v is not None]
    if not present:
        return 0.0, 100.0
    low = max(0.0, math.floor((min(present) - 5.0) / 10.0) * 10.0)
    return low, 100.0


def plot_radar_csr_by_type(
    labels: Sequence[str],
    values: Sequence[Sequence[float | None]],
    axes_names: Sequence[str],
    base: Path,
    formats: Sequence[str],
) -> Drawn:
    """Radar chart of CSR (%) per constraint type, one closed polygon per run."""
    plt = _pyplot()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        n_axes = len(axes_names)
        angles = [2 * math.pi * i / n_axes for i in range(n_axes)]
        low, high = radar_limits([v for row in values for v in row])
        fig, ax = plt.subplots(figsize=(10, 7), subplot_kw={"projection": "polar"})
        ax.set_theta_offset(math.pi / 2)
        ax.set_theta_direction(-1)
        styles = _style_cycle(len(labels))
        fill = len(labels) <= 4  # filled areas only stay readable for a few runs
        for label, row, style in zip(labels, values, styles, strict=False):
            points = [(a, v) for a, v in zip(angles, row, strict=False) if v is not None]
            if not points:
                continue
            closed = points + points[:1] if len(points) == n_axes else points
            xs, ys = [p[0] for p in closed], [p[1] for p in closed]
            ax.plot(xs, ys, linewidth=1.6, markersize=4, label=label, **style)
            if fill:
                ax.fill(xs, ys, color=style["color"], alpha=0.08)
        ax.set_xticks(angles)
        ax.set_xticklabels(axes_names, fontsize=11)
        ax.tick_params(axis="x", pad=10)
        ax.set_ylim(low, high)
        ticks = [t for t in range(int(low), 101, 10) if t > low]
        ax.set_yticks(ticks)
        # Radial labels drawn by hand above the polygons, half-way between the first two axes.
        ax.set_yticklabels([])
        label_angle = math.pi / n_axes
        for tick in ticks:
            ax.text(
                label_angle,
                tick,
                f"{tick}%",
                fontsize=8,
                color="#333333",
                ha="center",
                va="center",
                zorder=10,
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},
            )
        ax.set_title("CSR by constraint type", pad=24, fontsize=13)
        ax.legend(
            loc="center left",
            bbox_to_anchor=(1.12, 0.5),
            fontsize=9,
            frameon=False,
            ncol=1 if len(labels) <= 16 else 2,
            title="run",
        )
        return _save(plt, fig, base, formats, caught)


GROUP_COLORS = {"dependent": "#4C72B0", "parallel": "#DD8452"}
GROUP_NAMES = {"dependent": "multi-turn dependent", "parallel": "multi-turn parallel"}


def plot_gt_history_gain(
    labels: Sequence[str],
    gains_by_group: Sequence[dict[str, Sequence[float | None]]],
    base: Path,
    formats: Sequence[str],
) -> Drawn:
    """Per model, the ISR gain (points) of ground-truth history per turn, dependent and parallel sessions apart.

    As the paper's Figure 5: turn 1 has no history, so its gain is noise; the dashed lines at
    ±|ΔT1| (each group's own turn-1 gain) are that noise band for the later turns.
    """
    plt = _pyplot()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig, axes = _panel_grid(plt, len(labels))
        width = 0.38
        for ax, label, by_group in zip(axes, labels, gains_by_group, strict=False):
            n_turns = max((len(v) for v in by_group.values()), default=5)
            turns = list(range(1, n_turns + 1))
            for offset, group in ((-width / 2, "dependent"), (width / 2, "parallel")):
                values = list(by_group.get(group) or [])
                heights = [0.0 if v is None else v for v in values]
                ax.bar(
                    [t + offset for t in turns[: len(heights)]],
                    heights,
                    width=width * 0.95,
                    color=GROUP_COLORS[group],
                    label=f"{GROUP_NAMES[group]} sessions",
                )
                first = values[0] if values else None
                if first is not None:
                    band = abs(first)
                    for sign in (1, -1):
                        ax.axhline(
                            sign * band,
                            color=GROUP_COLORS[group],
                            linestyle="--" if group == "dependent" else ":",
                            linewidth=1.3,
                            label=f"±|ΔT1| {group}" if sign == 1 else None,
                        )
            ax.axhline(0.0, color="black", linewidth=0.8)
            ax.set_xticks(turns)
            ax.set_xticklabels([f"T{t}" for t in turns])
            ax.set_title(label, fontsize=11)
            ax.grid(axis="y", alpha=0.3)
            ax.set_axisbelow(True)
            ax.spines[["top", "right"]].set_visible(False)
        for ax in axes[:: max(1, min(3, len(axes)))]:
            ax.set_ylabel("ISR gain (points)")
        handles, names = axes[0].get_legend_handles_labels() if axes else ([], [])
        # Bars (the gains) first, then their noise lines.
        order = sorted(range(len(names)), key=lambda i: (names[i].startswith("±"), i))
        fig.legend(
            [handles[i] for i in order],
            [names[i] for i in order],
            loc="lower center",
            ncol=4,
            fontsize=9,
            frameon=False,
            bbox_to_anchor=(0.5, 0.0),
        )
        fig.suptitle(
            "ISR gain per turn with ground-truth history instead of the model's own\n"
            "dashed lines: ±|ΔT1|, the turn-1 gain (turn 1 has no history, so it is noise)",
            fontsize=11,
        )
        fig.tight_layout(rect=(0, 0.5 / fig.get_figheight(), 1, 1))  # room for the legend below
        return _save(plt, fig, base, formats, caught)


# Line style per kind of run in the history-ablation figure (distractor runs share a style, darker with more turns).
KIND_STYLES = {
    "model": {"color": "#1f4e79", "linestyle": "-", "marker": "o"},
    "reference": {"color": "#2ca02c", "linestyle": "-", "marker": "s"},
    "single-turn": {"color": "#ff7f0e", "linestyle": "--", "marker": "^"},
    "distractor": {"color": "#7b4fa0", "linestyle": ":", "marker": "D"},
}


def plot_history_ablation_isr(
    panels: Sequence[tuple[str, Sequence[tuple[str, str, Sequence[float | None]]]]],
    base: Path,
    formats: Sequence[str],
) -> Drawn:
    """Per model, ISR (%) per turn of its runs under each history ablation, in one figure.

    ``panels``: (model, [(kind name for the legend, style key of KIND_STYLES, ISR per turn in %)]).
    """
    plt = _pyplot()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig, axes = _panel_grid(plt, len(panels))
        values = [v for _, lines in panels for _, _, row in lines for v in row if v is not None]
        low = max(0.0, math.floor((min(values, default=0.0) - 5.0) / 10.0) * 10.0)
        legend: dict[str, Any] = {}
        for ax, (model, lines) in zip(axes, panels, strict=False):
            distractors = [name for name, key, _ in lines if key == "distractor"]
            for name, key, row in lines:
                style = dict(KIND_STYLES.get(key, KIND_STYLES["model"]))
                if key == "distractor" and len(distractors) > 1:
                    shade = 0.55 + 0.4 * distractors.index(name) / (len(distractors) - 1)
                    style["color"] = plt.get_cmap("Purples")(shade)
                points = [(t, v) for t, v in enumerate(row, start=1) if v is not None]
                if not points:
                    continue
                (line,) = ax.plot(
                    [p[0] for p in points], [p[1] for p in points], linewidth=1.8, markersize=5, label=name, **style
                )
                legend.setdefault(name, line)
            n_turns = max((len(row) for _, _, row in lines), default=5)
            ax.set_xticks(range(1, n_turns + 1))
            ax.set_xticklabels([f"T{t}" for t in range(1, n_turns + 1)])
            ax.set_ylim(low, 100)
            ax.set_title(model, fontsize=11)
            ax.grid(alpha=0.3)
            ax.spines[["top", "right"]].set_visible(False)
        for ax in axes[:: max(1, min(3, len(axes)))]:
            ax.set_ylabel("ISR (%)")
        fig.legend(
            list(legend.values()),
            list(legend.keys()),
            loc="lower center",
            ncol=min(5, max(1, len(legend))),
            fontsize=9,
            frameon=False,
            bbox_to_anchor=(0.5, 0.0),
        )
        fig.suptitle("ISR per turn under history ablations", fontsize=11)
        fig.tight_layout(rect=(0, 0.5 / fig.get_figheight(), 1, 1))  # room for the legend below
        return _save(plt, fig, base, formats, caught)
