"""MT-Eval tables in Markdown: the leaderboard layout, and runs side by side with paired CIs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sysbench_gpu.benchmarks.mteval.tasks import CATEGORIES

LEADERBOARD_COLUMNS = ("average", *CATEGORIES)
_TITLES = {
    "average": "Average",
    "recollection": "Recollection",
    "expansion": "Expansion",
    "refinement": "Refinement",
    "follow-up": "Follow-up",
}
# MT-Eval's published multi-turn leaderboard (paper, Table 2), for context next to a run.
PUBLISHED_LEADERBOARD: Mapping[str, Mapping[str, float]] = {
    "GPT-4 (published)": {
        "average": 9.03,
        "recollection": 9.61,
        "expansion": 9.07,
        "refinement": 7.85,
        "follow-up": 9.60,
    },
    "GPT-3.5-Turbo (published)": {
        "average": 7.72,
        "recollection": 6.90,
        "expansion": 7.87,
        "refinement": 6.92,
        "follow-up": 9.21,
    },
    "Mistral-Instruct-7B (published)": {
        "average": 7.46,
        "recollection": 7.22,
        "expansion": 6.98,
        "refinement": 6.58,
        "follow-up": 9.05,
    },
    "Llama-2-chat-7B (published)": {
        "average": 6.11,
        "recollection": 3.86,
        "expansion": 5.87,
        "refinement": 6.20,
        "follow-up": 8.53,
    },
}


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _with_ci(value: float | None, ci: Sequence[float] | None, show_ci: bool, mark: str = "") -> str:
    text = _num(value) + (mark if value is not None else "")
    if show_ci and value is not None and ci:
        text += f" [{ci[0]:.2f}, {ci[1]:.2f}]"
    return text


def leaderboard_row(metrics: Mapping[str, Any]) -> dict[str, tuple[float | None, list[float] | None]]:
    """Average and category scores (with CIs) of one ``mteval_metrics`` result."""
    row: dict[str, tuple[float | None, list[float] | None]] = {
        "average": (metrics["overall"], metrics.get("overall_ci95"))
    }
    for category in CATEGORIES:
        block = metrics["categories"].get(category)
        row[category] = (block["score"], block["ci95"]) if block else (None, None)
    return row


def leaderboard_markdown(
    runs: Sequence[tuple[str, Mapping[str, Any]]], *, show_ci: bool = True, published: bool = False
) -> str:
    """One row per run: Average / Recollection / Expansion / Refinement / Follow-up (0-10 scale).

    ``runs`` pairs a label with an ``mteval_metrics`` result that covers the multi-turn tasks
    of one model; an average over fewer than the four categories is marked with ``*``.
    """
    header = "| Model | " + " | ".join(_TITLES[c] for c in LEADERBOARD_COLUMNS) + " |"
    lines = [header, "|" + "---|" + "---:|" * len(LEADERBOARD_COLUMNS)]
    for label, metrics in runs:
        row = leaderboard_row(metrics)
        partial = "" if metrics.get("leaderboard_complete") else "*"
        cells = [_with_ci(*row[c], show_ci, partial if c == "average" else "") for c in LEADERBOARD_COLUMNS]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if published:
        for label, values in PUBLISHED_LEADERBOARD.items():
            lines.append(f"| {label} | " + " | ".join(_num(values[c]) for c in LEADERBOARD_COLUMNS) + " |")
    if any(not m.get("leaderboard_complete") for _, m in runs):
        lines += ["", "\\* average over the categories the run has, not all four."]
    return "\n".join(lines)


def side_by_side_markdown(
    columns: Sequence[tuple[str, Mapping[str, Any]]],
    comparisons: Sequence[tuple[str, Mapping[str, Any]]] = (),
) -> str:
    """Runs of one model side by side (e.g. multi, single, gold), then each difference against the first.

    ``columns``: (label, ``mteval_metrics`` result); ``comparisons``: (label, ``compare_mteval``
    result of the first column as A against another as B).
    """
    names: list[str] = ["overall"]
    for _, metrics in columns:
        names += [f"category.{c}" for c in metrics["categories"] if f"category.{c}" not in names]
    for _, metrics in columns:
        names += [f"task.{t}" for t in metrics["tasks"] if f"task.{t}" not in names]
    header = "| | " + " | ".join(label for label, _ in columns)
    header += "".join(f" | {label} (95% CI)" for label, _ in comparisons) + " |"
    lines = [header, "|---|" + "---:|" * (len(columns) + len(comparisons))]
    for name in names:
        cells = [_num(_value(metrics, name)) for _, metrics in columns]
        for _, comparison in comparisons:
            row = comparison["metrics"].get(name)
            if row is None or row["diff"] is None:
                cells.append("-")
            else:
                ci = row["ci95"]
                cells.append(f"{row['diff']:+.2f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else ""))
        lines.append(f"| {name.replace('.', ': ', 1)} | " + " | ".join(cells) + " |")
    notes = [
        f"{label}: {'paired' if c['paired'] else 'unpaired (different dialogues)'} dialogue bootstrap, "
        f"{c['bootstrap']['resamples']} resamples"
        for label, c in comparisons
    ]
    return "\n".join(lines + ([""] + notes if notes else []))


def _value(metrics: Mapping[str, Any], name: str) -> float | None:
    if name == "overall":
        return metrics["overall"]
    kind, key = name.split(".", 1)
    block = metrics["categories" if kind == "category" else "tasks"].get(key)
    return block["score"] if block else None
