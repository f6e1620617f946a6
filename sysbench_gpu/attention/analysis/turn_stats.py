"""Per-turn summaries of attention shares, their correlation with verdicts, and figures.

Per-token values (for one layer):

* ``share``: attention share of the system text, averaged over heads.
* ``share_excl_lead``: ``share / (1 - lead share)``: the same with the template's
  leading tokens (BOS, role header, ...) removed from numerator and denominator, as
  the paper's figure does (a ratio of head-summed values, as upstream computes it).

Per turn: means over the turn's segment (user message + reply, template tokens
included) and over the reply tokens alone.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sysbench_gpu.attention.store import complete_lines
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.jsonio import loads

LEAD, SYSTEM = 0, 1  # span columns in stored shares
DEFAULT_METRIC = "reply_share_excl_lead"
METRICS = ("share", "share_excl_lead", "reply_share", "reply_share_excl_lead")


@dataclass
class TurnShare:
    system_id: int
    condition: str
    layer: int
    layer_label: str
    turn: int
    n_tokens: int
    n_reply_tokens: int
    share: float | None
    share_excl_lead: float | None
    reply_share: float | None
    reply_share_excl_lead: float | None

    @property
    def key(self) -> tuple[int, str, int, int]:
        return (self.system_id, self.condition, self.layer, self.turn)


def token_series(shares: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(share, share_excl_lead) per token from one layer's [T, 2] (lead, system) shares."""
    shares = shares.astype(np.float64)
    system, lead = shares[:, SYSTEM], shares[:, LEAD]
    remaining = np.clip(1.0 - lead, np.finfo(np.float64).tiny, None)
    return system, system / remaining


def _mean(values: np.ndarray) -> float | None:
    return float(values.mean()) if values.size else None


def turn_shares(stored: Mapping[str, Any]) -> list[TurnShare]:
    """Per-turn rows from one stored session (the arrays written by the attention stage)."""
    meta = json.loads(str(stored["meta"]))
    rows: list[TurnShare] = []
    layers = [int(x) for x in stored["layers"]]
    labels = meta.get("layer_labels_by_index", {})
    for layer_position, layer in enumerate(layers):
        share, share_excl = token_series(np.asarray(stored["shares"][layer_position]))
        for turn_no, (t0, t1), (r0, r1) in zip(
            stored["turn_numbers"], stored["turns"], stored["replies"], strict=False
        ):
            rows.append(
                TurnShare(
                    system_id=int(meta["system_id"]),
                    condition=meta["condition"],
                    layer=layer,
                    layer_label=labels.get(str(layer), f"layer{layer}"),
                    turn=int(turn_no),
                    n_tokens=int(t1 - t0),
                    n_reply_tokens=int(r1 - r0),
                    share=_mean(share[t0:t1]),
                    share_excl_lead=_mean(share_excl[t0:t1]),
                    reply_share=_mean(share[r0:r1]),
                    reply_share_excl_lead=_mean(share_excl[r0:r1]),
                )
            )
    return rows


def read_turn_table(path: Path) -> list[TurnShare]:
    """Rows of a shard or merged table; an unterminated last line (a write torn by a crash) is left out."""
    rows = []
    for number, line in complete_lines(path):
        row = loads(line, f"{path}: line {number}")
        try:
            rows.append(TurnShare(**row))
        except TypeError as error:
            raise SysbenchError(f"{path}: line {number} is not a turn-share row ({error})") from None
    return rows


def turn_row_json(row: TurnShare) -> str:
    return json.dumps(asdict(row), ensure_ascii=False, separators=(",", ":"))


# ----------------------------------------------------------------- statistics


def point_biserial(values: np.ndarray, outcome: np.ndarray) -> float | None:
    """Pearson correlation of a continuous value with a 0/1 outcome; None when either is constant."""
    if values.size < 3 or np.std(values) == 0 or np.std(outcome) == 0:
        return None
    return float(np.corrcoef(values, outcome)[0, 1])


def bootstrap_by_session(
    session_ids: np.ndarray,
    values: np.ndarray,
    outcome: np.ndarray,
    n_boot: int = 1000,
    seed: int = 0,
) -> tuple[float | None, float | None, int]:
    """95% percentile CI of the point-biserial r, resampling whole sessions; returns (low, high, replicates)."""
    unique = np.unique(session_ids)
    if unique.size < 3:
        return None, None, 0
    rows_by_session = [np.flatnonzero(session_ids == sid) for sid in unique]
    rng = np.random.default_rng(seed)
    estimates = []
    for _ in range(n_boot):
        pick = rng.integers(0, unique.size, unique.size)
        index = np.concatenate([rows_by_session[i] for i in pick])
        r = point_biserial(values[index], outcome[index])
        if r is not None:
            estimates.append(r)
    if len(estimates) < n_boot // 2:
        return None, None, len(estimates)
    low, high = np.percentile(estimates, [2.5, 97.5])
    return float(low), float(high), len(estimates)


def _correlation(session_ids: list[int], values: list[float], outcome: list[int], n_boot: int) -> dict[str, Any]:
    sid, x, y = np.asarray(session_ids), np.asarray(values, dtype=np.float64), np.asarray(outcome, dtype=np.float64)
    r = point_biserial(x, y)
    low, high, used = bootstrap_by_session(sid, x, y, n_boot=n_boot) if r is not None else (None, None, 0)
    return {
        "n": int(x.size),
        "n_sessions": int(np.unique(sid).size),
        "pass_rate": float(y.mean()) if y.size else None,
        "r_point_biserial": r,
        "ci95": [low, high] if low is not None else None,
        "bootstrap_replicates": used,
        "mean_share_pass": float(x[y == 1].mean()) if (y == 1).any() else None,
        "mean_share_fail": float(x[y == 0].mean()) if (y == 0).any() else None,
    }


def correlate_with_verdicts(
    rows: Sequence[TurnShare],
    judgments: Mapping[tuple[int, int], Any],
    metric: str = DEFAULT_METRIC,
    n_boot: int = 1000,
) -> dict[str, Any]:
    """Point-biserial r between a turn's system share (system condition) and its verdicts, per layer.

    ``turn_pass``: the turn passes (no verdict 'no'). ``by_type``: one row per constraint
    of that type, satisfied ('yes') or not ('no'); other verdicts are left out.
    """
    if metric not in METRICS:
        raise SysbenchError(f"unknown share metric {metric!r} (expected one of {', '.join(METRICS)})")
    if not judgments:
        return {"status": "skipped", "reason": "the run has no judgments (judgments.jsonl is missing or empty)"}
    result: dict[str, Any] = {"status": "ok", "metric": metric, "condition": "system", "layers": {}}
    by_layer: dict[tuple[int, str], list[TurnShare]] = defaultdict(list)
    for row in rows:
        if row.condition == "system" and getattr(row, metric) is not None:
            by_layer[(row.layer, row.layer_label)].append(row)
    for (layer, label), layer_rows in sorted(by_layer.items()):
        turn_sid, turn_x, turn_y = [], [], []
        type_data: dict[str, tuple[list[int], list[float], list[int]]] = defaultdict(lambda: ([], [], []))
        for row in layer_rows:
            judgment = judgments.get((row.system_id, row.turn))
            if judgment is None:
                continue
            value = float(getattr(row, metric))
            passed = judgment.passed
            if passed is not None:
                turn_sid.append(row.system_id)
                turn_x.append(value)
                turn_y.append(int(passed))
            for verdict in judgment.verdicts.values():
                if verdict.value in ("yes", "no"):
                    sids, xs, ys = type_data[verdict.type]
                    sids.append(row.system_id)
                    xs.append(value)
                    ys.append(int(verdict.value == "yes"))
        entry = {"layer": layer, "turn_pass": _correlation(turn_sid, turn_x, turn_y, n_boot)}
        entry["by_type"] = {name: _correlation(*data, n_boot) for name, data in sorted(type_data.items())}
        result["layers"][label] = entry
    if not any(entry["turn_pass"]["n"] for entry in result["layers"].values()):
        return {"status": "skipped", "reason": "no judged turn matches a measured turn"}
    return result


def compare_conditions(rows: Sequence[TurnShare], metric: str = DEFAULT_METRIC, n_boot: int = 1000) -> dict[str, Any]:
    """Mean share per turn as system vs as user (control), with a session-bootstrap CI of the paired difference."""
    values: dict[tuple[str, int, str], dict[int, float]] = defaultdict(dict)
    for row in rows:
        value = getattr(row, metric)
        if value is not None:
            values[(row.layer_label, row.turn, row.condition)][row.system_id] = float(value)
    out: dict[str, Any] = {}
    labels = sorted({label for label, _, _ in values})
    for label in labels:
        per_turn = {}
        for turn in sorted({t for lab, t, _ in values if lab == label}):
            system, control = values.get((label, turn, "system"), {}), values.get((label, turn, "control"), {})
            paired = sorted(set(system) & set(control))
            entry: dict[str, Any] = {
                "system_mean": float(np.mean(list(system.values()))) if system else None,
                "control_mean": float(np.mean(list(control.values()))) if control else None,
                "n_paired": len(paired),
            }
            if paired:
                diff = np.asarray([system[s] - control[s] for s in paired])
                entry["diff_mean"] = float(diff.mean())
                if diff.size >= 3:
                    rng = np.random.default_rng(0)
                    boots = [diff[rng.integers(0, diff.size, diff.size)].mean() for _ in range(n_boot)]
                    entry["diff_ci95"] = [float(v) for v in np.percentile(boots, [2.5, 97.5])]
            per_turn[str(turn)] = entry
        out[label] = per_turn
    return {"metric": metric, "layers": out}


# ----------------------------------------------------------------- figures


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


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, base: Path) -> list[Path]:
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
    plt = _pyplot()
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
    paths = _save(fig, base)
    plt.close(fig)
    return paths


def plot_turn_means(
    tables: Sequence[tuple[str, Sequence[TurnShare]]],
    layer_label: str,
    base: Path,
    metric: str = DEFAULT_METRIC,
) -> list[Path]:
    """Figure (b): per-turn mean share over sessions, system role (solid) vs user role (dashed), per model."""
    plt = _pyplot()
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
    paths = _save(fig, base)
    plt.close(fig)
    return paths


def layer_name(label: str, index: int | None = None) -> str:
    """'mid' -> 'mid layer (15)', 'layer3' -> 'layer 3'."""
    if label.startswith("layer"):
        return f"layer {label[5:]}"
    return f"{label} layer" + (f" ({index})" if index is not None else "")


def finite_or_none(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


def summarize(rows: Iterable[TurnShare]) -> dict[str, Any]:
    """Mean of each metric per (layer label, condition) over all turns."""
    groups: dict[tuple[str, str], list[TurnShare]] = defaultdict(list)
    for row in rows:
        groups[(row.layer_label, row.condition)].append(row)
    out: dict[str, Any] = {}
    for (label, condition), items in sorted(groups.items()):
        out.setdefault(label, {})[condition] = {
            metric: finite_or_none(
                float(np.mean([getattr(r, metric) for r in items if getattr(r, metric) is not None]))
                if any(getattr(r, metric) is not None for r in items)
                else None
            )
            for metric in METRICS
        } | {"n_turns": len(items), "n_sessions": len({r.system_id for r in items})}
    return out
