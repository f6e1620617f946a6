"""Per-turn statistics of the attention shares: correlation with the turn's outcome, system vs user, summaries.

The rows are the per-turn table's (``files.turn_table``); a turn's pass or fail is the
benchmark's own (``turn_view``, joined through ``outcomes``), as the heads map and the
knockout summary join it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from sysbench_gpu.attention.analysis.outcomes import pass_fail
from sysbench_gpu.attention.files.turn_table import METRICS, TurnShare
from sysbench_gpu.benchmarks.explorer import TurnView
from sysbench_gpu.core.errors import SysbenchError

DEFAULT_METRIC = "reply_share_excl_lead"


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
    views: Mapping[tuple[int, int], TurnView],
    judgments: Mapping[tuple[int, int], Any],
    metric: str = DEFAULT_METRIC,
    n_boot: int = 1000,
) -> dict[str, Any]:
    """Point-biserial r between a turn's system share (system condition) and its outcome, per layer.

    ``views``: the benchmark's view of each turn (``outcomes.turn_views``); a turn it does
    not count as judged is left out of both parts. ``turn_pass``: the turn passes, as the
    benchmark says (``outcomes.pass_fail``; a turn it only scores has no pass or fail).
    ``by_type``: one row per verdict of the turn's judgment, by the verdict's constraint type,
    satisfied ('yes') or not ('no'); other verdicts are left out.
    """
    if metric not in METRICS:
        raise SysbenchError(f"unknown share metric {metric!r} (expected one of {', '.join(METRICS)})")
    if not judgments:
        return {"status": "skipped", "reason": "the run has no judgments (judgments.jsonl is missing or empty)"}
    outcomes = pass_fail(views)
    result: dict[str, Any] = {"status": "ok", "metric": metric, "condition": "system", "layers": {}}
    by_layer: dict[tuple[int, str], list[TurnShare]] = defaultdict(list)
    for row in rows:
        if row.condition == "system" and getattr(row, metric) is not None:
            by_layer[(row.layer, row.layer_label)].append(row)
    scored_only = 0
    for (layer, label), layer_rows in sorted(by_layer.items()):
        turn_sid, turn_x, turn_y = [], [], []
        type_data: dict[str, tuple[list[int], list[float], list[int]]] = defaultdict(lambda: ([], [], []))
        for row in layer_rows:
            key = (row.system_id, row.turn)
            view = views.get(key)
            if view is None or not view.judged:
                continue
            value = float(getattr(row, metric))
            if key in outcomes:
                turn_sid.append(row.system_id)
                turn_x.append(value)
                turn_y.append(int(outcomes[key]))
            else:
                scored_only += 1
            judgment = judgments.get(key)
            verdicts = judgment.verdicts.values() if judgment is not None else ()
            for verdict in verdicts:
                if verdict.value in ("yes", "no"):
                    sids, xs, ys = type_data[verdict.type]
                    sids.append(row.system_id)
                    xs.append(value)
                    ys.append(int(verdict.value == "yes"))
        entry = {"layer": layer, "turn_pass": _correlation(turn_sid, turn_x, turn_y, n_boot)}
        entry["by_type"] = {name: _correlation(*data, n_boot) for name, data in sorted(type_data.items())}
        result["layers"][label] = entry
    if not any(entry["turn_pass"]["n"] for entry in result["layers"].values()):
        if scored_only:
            return {"status": "skipped", "reason": "the benchmark scores the measured turns without a pass or fail"}
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
