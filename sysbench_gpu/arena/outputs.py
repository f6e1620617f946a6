"""What an arena writes besides its battles: ratings.json, the leaderboards and the figures."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sysbench_gpu.core.plotting import _pyplot, _save
from sysbench_gpu.core.rundir import write_bytes_atomic
from sysbench_gpu.core.tables import escape_latex, escape_markdown

RATINGS = "ratings.json"
LEADERBOARD_MD = "leaderboard.md"
LEADERBOARD_TEX = "leaderboard.tex"


def _ci(ci: Sequence[float | None] | None) -> str:
    return f"[{ci[0]:.0f}, {ci[1]:.0f}]" if ci and None not in ci else "-"


def _num(value: float | None, fmt: str = ".0f") -> str:
    return "-" if value is None else format(value, fmt)


def _columns(result: Mapping[str, Any]) -> list[str]:
    columns = ["#", "Model", "Rating", "95% CI", "Battles", "W / T / L", "Online Elo"]
    if "length_control" in result:
        columns += ["LC rating", "LC 95% CI"]
    return columns


def _label(row: Mapping[str, Any]) -> str:
    """The model, with the run beside it where two runs share a model (``label``; older ratings.json lack it)."""
    return str(row.get("label", row["model"]))


def _cells(rank: int, row: Mapping[str, Any], lc: bool) -> list[str]:
    cells = [
        str(rank),
        _label(row),
        "unrated" if row["rating"] is None else _num(row["rating"]),
        _ci(row["ci"]),
        str(row["battles"]),
        f"{row['wins']} / {row['ties']} / {row['losses']}",
        _num(row["online_elo"]),
    ]
    if lc:
        cells += [_num(row.get("rating_length_controlled")), _ci(row.get("ci_length_controlled"))]
    return cells


def _notes(result: Mapping[str, Any]) -> list[str]:
    """What the table leaves out: unrated runs and why, resamples without a fit, battles the judge never answered."""
    notes = [f"Unrated: {_label(row)}: {row['unrated']}." for row in result["ratings"] if row.get("unrated")]
    fit = result["fit"]
    failed = fit.get("resamples_failed", 0)
    lc_failed = result.get("length_control", {}).get("resamples_failed", 0)
    if failed or lc_failed:
        notes.append(
            f"{failed} of {fit['resamples']} resamples (LC: {lc_failed}) had no finite fit (one side won every battle "
            "drawn) and are left out of the CIs."
            if "length_control" in result
            else f"{failed} of {fit['resamples']} resamples had no finite fit (one side won every battle drawn) and "
            "are left out of the CIs."
        )
    if result.get("unparsed_battle_records"):
        notes.append(
            f"{result['unparsed_battle_records']} judged battle records never parsed and are not rated "
            "(--retry-unparsed asks the judge again)."
        )
    return notes


def leaderboard_markdown(result: Mapping[str, Any], title: str) -> str:
    lc = "length_control" in result
    fit = result["fit"]
    lines = [f"# {escape_markdown(title)}", ""]
    columns = _columns(result)
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("| " + " | ".join("---" if c == "Model" else "---:" for c in columns) + " |")
    for rank, row in enumerate(result["ratings"], 1):
        cells = _cells(rank, row, lc)
        cells[1] = escape_markdown(cells[1])
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Bradley-Terry ratings on the Elo scale, anchored at {fit['anchor']:.0f} ({fit['anchored_to']}); "
        f"ties count half a win each way; 95% CIs from {fit['resamples']} resamples of "
        f"{fit['sessions']} sessions (seed {fit['seed']}); {fit['battles']} battles. "
        "Online Elo: K=32, for comparison.",
    ]
    if lc:
        control = result["length_control"]
        lines.append(
            f"LC: the same fit with the reply-length difference as a covariate "
            f"(coefficient {_num(control['coefficient_elo'], '.1f')} Elo, 95% CI {_ci(control['coefficient_ci'])})."
        )
    consistency = result.get("position_consistency")
    if consistency:
        rate = consistency["rate"]
        lines.append(
            f"Judge position consistency: {_num(None if rate is None else 100 * rate, '.1f')}% of "
            f"{consistency['battles_parsed_in_both_orders']} battles asked in both orders; disagreements count as ties."
        )
    lines += [escape_markdown(note) for note in _notes(result)]
    return "\n".join(lines) + "\n"


def leaderboard_latex(result: Mapping[str, Any], title: str) -> str:
    lc = "length_control" in result
    columns = _columns(result)
    spec = "r l " + " ".join("r" for _ in columns[2:])
    lines = [
        "\\begin{table}[t]",
        "\\centering",
        f"\\caption{{{escape_latex(title)}: Bradley-Terry ratings (Elo scale) with 95\\% session-bootstrap CIs}}",
        f"\\begin{{tabular}}{{{spec}}}",
        "\\hline",
        " & ".join(escape_latex(c) for c in columns) + " \\\\",
        "\\hline",
    ]
    for rank, row in enumerate(result["ratings"], 1):
        lines.append(" & ".join(escape_latex(cell) for cell in _cells(rank, row, lc)) + " \\\\")
    lines += ["\\hline", "\\end{tabular}"]
    lines += [escape_latex(note) + " \\par" for note in _notes(result)]
    lines += ["\\end{table}"]
    return "\n".join(lines) + "\n"


def write_tables(out: Path, result: Mapping[str, Any], title: str) -> list[Path]:
    write_bytes_atomic(out / RATINGS, (json.dumps(result, ensure_ascii=False, indent=2) + "\n").encode("utf-8"))
    paths = [out / RATINGS, out / LEADERBOARD_MD, out / LEADERBOARD_TEX]
    write_bytes_atomic(paths[1], leaderboard_markdown(result, title).encode("utf-8"))
    write_bytes_atomic(paths[2], leaderboard_latex(result, title).encode("utf-8"))
    return paths


def write_figures(out: Path, result: Mapping[str, Any], formats: Sequence[str]) -> list[Path]:
    """``figures/ratings``: each run's rating with its CI; ``figures/win_rates``: the win-rate heatmap."""
    import warnings

    plt = _pyplot()
    paths: list[Path] = []
    rows = list(reversed(result["ratings"]))  # the best at the top
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig, ax = plt.subplots(figsize=(6.5, 0.35 * len(rows) + 1.4))
        for y, row in enumerate(rows):
            if row["rating"] is None:
                continue
            low, high = row["ci"] if row["ci"] else (row["rating"], row["rating"])
            ax.errorbar(
                row["rating"], y, xerr=[[row["rating"] - low], [high - row["rating"]]], fmt="o", color="tab:blue"
            )
        ax.set_yticks(range(len(rows)), [_label(row) for row in rows])
        ax.axvline(result["fit"]["anchor"], color="grey", linewidth=0.8, linestyle=":")
        ax.set_xlabel("Bradley-Terry rating (Elo scale), 95% CI")
        fig.tight_layout()
        paths += _save(plt, fig, out / "figures" / "ratings", formats, list(caught)).paths
    rates = result["win_rates"]
    # Rows and columns by rating, the best first, so the heatmap reads as the leaderboard does.
    position = {run: i for i, run in enumerate(rates["runs"])}
    order = [position[row["run"]] for row in result["ratings"]]
    models = [rates["models"][i] for i in order]
    matrix = [[math.nan if rates["matrix"][i][j] is None else rates["matrix"][i][j] for j in order] for i in order]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        size = 0.5 * len(models) + 2.5
        fig, ax = plt.subplots(figsize=(size + 1.0, size))
        image = ax.imshow(matrix, vmin=0.0, vmax=1.0, cmap="RdBu")
        ax.set_xticks(range(len(models)), models, rotation=60, ha="right")
        ax.set_yticks(range(len(models)), models)
        if len(models) <= 16:
            for i, row in enumerate(matrix):
                for j, value in enumerate(row):
                    if not math.isnan(value):
                        ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7)
        ax.set_title("Row model's win rate against column model (ties half)")
        fig.colorbar(image, ax=ax, fraction=0.046)
        fig.tight_layout()
        paths += _save(plt, fig, out / "figures" / "win_rates", formats, list(caught)).paths
    return paths
