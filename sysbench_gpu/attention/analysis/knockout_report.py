"""Knockout's summary and figure: mean Δ log p per arm (session-bootstrap CI), by turn, and joined with the verdicts.

``knockout_summary.json``::

    {"layers": [...], "arms": {"system": {"n", "n_sessions", "mean_delta", "ci95"}, "control": {...}},
     "by_turn": {"system": {"1": mean, ...}, ...},
     "verdicts": {"system": {"mean_delta_pass", "mean_delta_fail", "n_pass", "n_fail", "n_scored_only",
                             "n_not_judged"}, ...},
     "system_minus_control": {"n", "mean", "ci95"}}

A turn's pass or fail is the benchmark's (``turn_view``, joined as the head table joins it,
``outcomes``): a turn it does not count as judged (an unparsed judgment, no judgment) is in
``n_not_judged``, and one it only scores (MT-Eval) in ``n_scored_only``; neither is split.
``figures/knockout_delta.png|pdf``: mean Δ per turn, one line per arm.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sysbench_gpu.attention.analysis.outcomes import turn_views
from sysbench_gpu.attention.files.knockout_rows import ARMS, KnockoutRow, read_knockout
from sysbench_gpu.attention.files.store import read_manifest
from sysbench_gpu.benchmarks.explorer import TurnView
from sysbench_gpu.core.jsonio import read_json
from sysbench_gpu.core.rundir import write_json_atomic
from sysbench_gpu.core.stats import bootstrap_index, percentile_ci

log = logging.getLogger(__name__)

SUMMARY_FILE = "knockout_summary.json"


def session_mean_ci(rows: Sequence[tuple[int, float]], resamples: int, seed: int = 0) -> dict[str, Any]:
    """Mean of (system_id, value) pairs, with a 95% CI that resamples whole sessions."""
    values = np.asarray([v for _, v in rows], dtype=np.float64)
    sessions = sorted({sid for sid, _ in rows})
    out: dict[str, Any] = {"n": int(values.size), "n_sessions": len(sessions), "mean": None, "ci95": None}
    if not values.size:
        return out
    out["mean"] = float(values.mean())
    if len(sessions) >= 2 and resamples > 0:
        groups = [np.asarray([v for s, v in rows if s == sid]) for sid in sessions]
        sums, counts = np.asarray([g.sum() for g in groups]), np.asarray([g.size for g in groups])
        picks = bootstrap_index(len(sessions), resamples, seed)
        out["ci95"] = percentile_ci(sums[picks].sum(1) / counts[picks].sum(1))
    return out


def verdict_split(rows: Sequence[KnockoutRow], views: Mapping[tuple[int, int], TurnView]) -> dict[str, Any]:
    """Mean Δ of the passing and the failing turns, as the benchmark's ``turn_view`` judges them."""
    passed: dict[bool, list[float]] = {True: [], False: []}
    scored_only = not_judged = 0
    for row in rows:
        view = views.get((row.system_id, row.turn))
        if view is None or not view.judged:
            not_judged += 1
        elif view.passed is None:
            scored_only += 1
        else:
            passed[bool(view.passed)].append(row.delta)
    return {
        "n_pass": len(passed[True]),
        "n_fail": len(passed[False]),
        "mean_delta_pass": float(np.mean(passed[True])) if passed[True] else None,
        "mean_delta_fail": float(np.mean(passed[False])) if passed[False] else None,
        "n_scored_only": scored_only,
        "n_not_judged": not_judged,
    }


def summarize_knockout(
    rows: Sequence[KnockoutRow], views: Mapping[tuple[int, int], TurnView], resamples: int = 1000
) -> dict[str, Any]:
    """``views``: the benchmark's view of each turn (``outcomes.turn_views``)."""
    scored = [r for r in rows if r.delta is not None]
    summary: dict[str, Any] = {"arms": {}, "by_turn": {}, "verdicts": {}}
    for arm in ARMS:
        mine = [r for r in scored if r.arm == arm]
        stats = session_mean_ci([(r.system_id, r.delta) for r in mine], resamples)
        mean = stats.pop("mean")
        summary["arms"][arm] = {**stats, "mean_delta": mean}
        turns = sorted({r.turn for r in mine})
        summary["by_turn"][arm] = {str(t): float(np.mean([r.delta for r in mine if r.turn == t])) for t in turns}
        summary["verdicts"][arm] = verdict_split(mine, views)
    control = {(r.system_id, r.turn): r.delta for r in scored if r.arm == "control"}
    paired = [
        (r.system_id, r.delta - control[(r.system_id, r.turn)])
        for r in scored
        if r.arm == "system" and control.get((r.system_id, r.turn)) is not None
    ]
    summary["system_minus_control"] = session_mean_ci(paired, resamples)
    return summary


def plot_knockout(summary: Mapping[str, Any], base: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    for arm, style in zip(ARMS, ("-o", "--s"), strict=True):
        by_turn = summary["by_turn"].get(arm) or {}
        if by_turn:
            ax.plot([int(t) for t in by_turn], list(by_turn.values()), style, label=arm)
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xlabel("turn")
    ax.set_ylabel("Δ mean log p per reply token")
    ax.set_title(f"knockout of the system text, layers {summary.get('layers_spec', '')}")
    ax.legend()
    base.parent.mkdir(parents=True, exist_ok=True)
    paths = [base.with_suffix(".png"), base.with_suffix(".pdf")]
    for path in paths:
        fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)
    return paths


def finish_knockout(out: Path, run: Any, resamples: int, figures: bool) -> dict[str, Any] | None:
    """Summary, figure and printed lines from ``knockout.jsonl`` (None when the folder has none)."""
    rows = read_knockout(out)
    if not rows:
        return None
    section = read_manifest(out).get("knockout", {})
    summary = {
        "layers": section.get("layers"),
        "layers_spec": section.get("layers_spec"),
        **summarize_knockout(rows, turn_views(run.path), resamples),
    }
    write_json_atomic(out / SUMMARY_FILE, summary)
    for arm, stats in summary["arms"].items():
        if stats["n"]:
            ci = stats["ci95"]
            ci_text = f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else ""
            print(f"knockout ({arm}): mean Δ log p {stats['mean_delta']:+.3f}{ci_text} over {stats['n']} turns")
    if figures:
        plot_knockout(summary, out / "figures" / "knockout_delta")
    return summary


def knockout_markdown(dirs: Sequence[Path], report_dir: Path | None = None) -> list[str]:
    """``report --attention DIR``: the Knockout section, where ``attention --knockout`` ran ([]: nowhere)."""
    lines: list[str] = []
    for out in dirs:
        if not (out / SUMMARY_FILE).exists():
            continue
        summary = read_json(out / SUMMARY_FILE, expect=dict)
        lines += [f"`{out}`: system text masked at layers {summary.get('layers_spec')} ({summary.get('layers')})", ""]
        lines += [
            "| arm | turns | sessions | mean Δ log p | 95% CI | Δ pass | Δ fail |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for arm, stats in summary.get("arms", {}).items():
            verdicts = summary.get("verdicts", {}).get(arm, {})
            ci = stats.get("ci95")
            lines.append(
                f"| {arm} | {stats.get('n')} | {stats.get('n_sessions')} | {_fmt(stats.get('mean_delta'))} | "
                f"{'–' if not ci else f'[{ci[0]:+.3f}, {ci[1]:+.3f}]'} | {_fmt(verdicts.get('mean_delta_pass'))} | "
                f"{_fmt(verdicts.get('mean_delta_fail'))} |"
            )
        scored = sum(v.get("n_scored_only") or 0 for v in summary.get("verdicts", {}).values())
        split = sum((v.get("n_pass") or 0) + (v.get("n_fail") or 0) for v in summary.get("verdicts", {}).values())
        if scored and not split:
            lines += ["", f"The benchmark scores these turns ({scored} rows) without a pass or fail: no Δ pass/fail."]
        paired = summary.get("system_minus_control", {})
        lines += [
            "",
            f"System minus control (paired by turn): {_fmt(paired.get('mean'))} over {paired.get('n')} turns.",
            "",
        ]
        figure = out / "figures" / "knockout_delta.png"
        if figure.exists():
            link = os.path.relpath(figure.resolve(), report_dir.resolve()) if report_dir else str(figure)
            lines += [f"![knockout Δ per turn]({link})", ""]
    return (["## Attention: knockout", ""] + lines) if lines else []


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:+.3f}"
