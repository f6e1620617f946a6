"""``judge agreement A B`` on two MT-Eval runs: how far two judges' 1-10 scores of the same replies agree.

Per judged task (refinement, expansion, follow-up): Spearman's rho, the mean absolute
difference and the share of turns scored within one point, each with a 95% interval from a
bootstrap over dialogues (turns of one dialogue stay together). Turns either judge left
unparsed are left out and counted. Rule-scored tasks (recollection) do not depend on the judge;
they are listed with how often the two runs' rule verdicts agree (they differ only where the
runs were judged under different ``--rules``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sysbench_gpu.benchmarks.mteval.judge_prompt import judge_kind
from sysbench_gpu.benchmarks.mteval.tasks import TASKS
from sysbench_gpu.benchmarks.registry import load_run_sessions
from sysbench_gpu.benchmarks.runs import same_replies_judged
from sysbench_gpu.core.records import JudgmentRecord
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.core.stats import bootstrap_index, percentile_ci

Key = tuple[int, int]
DEFAULT_RESAMPLES, DEFAULT_SEED = 1000, 0


def spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman's rho: Pearson's r of the average ranks; None where either side is constant or empty."""
    if a.size < 2:
        return None
    ra, rb = _ranks(a), _ranks(b)
    sa, sb = ra.std(), rb.std()
    if sa == 0 or sb == 0:
        return None
    return float(((ra - ra.mean()) * (rb - rb.mean())).mean() / (sa * sb))


def _ranks(values: np.ndarray) -> np.ndarray:
    order = values.argsort(kind="mergesort")
    ranks = np.empty(values.size, dtype=float)
    ranks[order] = np.arange(1, values.size + 1, dtype=float)
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()  # ties share their average rank
    return ranks


def _scores(a: np.ndarray, b: np.ndarray) -> dict[str, float | None]:
    if a.size == 0:
        return {"spearman": None, "mean_abs_diff": None, "within_one": None}
    diff = np.abs(a - b)
    return {"spearman": spearman(a, b), "mean_abs_diff": float(diff.mean()), "within_one": float((diff <= 1).mean())}


def score_block(pairs: Mapping[int, Sequence[tuple[float, float]]], resamples: int, seed: int) -> dict[str, Any]:
    """The three measures over every pair, with dialogue-bootstrap intervals; ``pairs``: dialogue -> (a, b) pairs."""
    dialogues = sorted(pairs)
    a = np.array([x for d in dialogues for x, _ in pairs[d]], dtype=float)
    b = np.array([y for d in dialogues for _, y in pairs[d]], dtype=float)
    block: dict[str, Any] = {"n_dialogues": len(dialogues), "n_turns": int(a.size), **_scores(a, b)}
    draws: dict[str, list[float]] = {name: [] for name in ("spearman", "mean_abs_diff", "within_one")}
    if dialogues:
        for resample in bootstrap_index(len(dialogues), resamples, seed):
            chosen = [pairs[dialogues[i]] for i in resample]
            xa = np.array([x for rows in chosen for x, _ in rows], dtype=float)
            xb = np.array([y for rows in chosen for _, y in rows], dtype=float)
            for name, value in _scores(xa, xb).items():
                draws[name].append(np.nan if value is None else value)
    for name, values in draws.items():
        block[f"{name}_ci95"] = percentile_ci(np.array(values)) if values else None
    return block


def _judged(record: JudgmentRecord | None) -> float | None:
    if record is None or record.parse_status != "ok" or record.score is None:
        return None
    return float(record.score)


def mteval_agreement(
    path_a: str | Path, path_b: str | Path, *, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED
) -> dict[str, Any]:
    """Agreement of two MT-Eval runs' judges on the same replies (see the module doc)."""
    run_a, run_b = RunDir(path_a).require(), RunDir(path_b).require()
    sessions = {s.system_id: s for s in load_run_sessions(run_a)}
    tasks_b = {s.system_id: s.task for s in load_run_sessions(run_b)}
    gens_a, gens_b = run_a.generations.read(), run_b.generations.read()
    judg_a, judg_b = run_a.judgments.read(), run_b.judgments.read()
    common = same_replies_judged(
        (run_a, run_b), (gens_a, gens_b), (judg_a, judg_b), differs=lambda k: tasks_b.get(k[0]) != sessions[k[0]].task
    )
    judged: dict[str, dict[int, list[tuple[float, float]]]] = {}
    unparsed: dict[str, int] = {}
    ruled: dict[str, dict[str, Any]] = {}
    for key in common:
        session = sessions[key[0]]
        info = TASKS[session.task or ""]
        if info.scorer != "judge":
            block = ruled.setdefault(session.task or "", {"scorer": info.scorer, "n_turns": 0, "same_verdict": 0})
            block["n_turns"] += 1
            block["same_verdict"] += judg_a[key].score == judg_b[key].score
            continue
        kind = judge_kind(session)
        a, b = _judged(judg_a[key]), _judged(judg_b[key])
        if a is None or b is None:
            unparsed[kind] = unparsed.get(kind, 0) + 1
            continue
        judged.setdefault(kind, {}).setdefault(key[0], []).append((a, b))
    return {
        "benchmark": "mteval",
        "run_a": str(run_a.path),
        "run_b": str(run_b.path),
        "judge_a": _judge_of(judg_a, common),
        "judge_b": _judge_of(judg_b, common),
        "bootstrap": {"unit": "dialogue", "resamples": resamples, "seed": seed},
        "judged_tasks": {
            kind: {**score_block(judged[kind], resamples, seed), "n_unparsed_left_out": unparsed.get(kind, 0)}
            for kind in sorted(judged)
        },
        "unparsed_only": sorted(kind for kind in unparsed if kind not in judged),
        "judge_independent_tasks": dict(sorted(ruled.items())),
    }


def _judge_of(judgments: Mapping[Key, JudgmentRecord], keys: Sequence[Key]) -> str | None:
    models = sorted({judgments[k].judge_model for k in keys if judgments[k].judge_model})
    return ", ".join(models) or None


def _num(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _ci(values: Sequence[float] | None, digits: int = 2) -> str:
    return "" if not values else f" [{values[0]:.{digits}f}, {values[1]:.{digits}f}]"


def format_agreement(report: Mapping[str, Any]) -> str:
    """The text form of ``mteval_agreement``."""
    boot = report["bootstrap"]
    lines = [
        f"A = {report['run_a']} (judge {report['judge_a'] or 'rules only'})",
        f"B = {report['run_b']} (judge {report['judge_b'] or 'rules only'})",
        f"95% intervals: bootstrap over dialogues, {boot['resamples']} resamples, seed {boot['seed']}",
        "",
    ]
    for kind, block in report["judged_tasks"].items():
        lines.append(
            f"{kind:<12} {block['n_turns']} turns / {block['n_dialogues']} dialogues"
            f"  Spearman rho {_num(block['spearman'])}{_ci(block['spearman_ci95'])}"
            f"  mean |A-B| {_num(block['mean_abs_diff'])}{_ci(block['mean_abs_diff_ci95'])}"
            f"  within 1 point {_num(block['within_one'])}{_ci(block['within_one_ci95'])}"
            + (f"  ({block['n_unparsed_left_out']} unparsed left out)" if block["n_unparsed_left_out"] else "")
        )
    for kind in report["unparsed_only"]:
        lines.append(f"{kind:<12} no turn parsed by both judges")
    if not report["judged_tasks"] and not report["unparsed_only"]:
        lines.append("no judge-scored turns in common")
    for task, block in report["judge_independent_tasks"].items():
        lines.append(
            f"{task:<12} judge-independent ({block['scorer']} rule): {block['same_verdict']} of "
            f"{block['n_turns']} turns have the same verdict in both runs"
        )
    return "\n".join(lines)
