"""A failure probe: does a turn's per-head system share predict that the turn fails (Lookback Lens style)?

Logistic regression (scikit-learn, standardized features, L2) on the per-head reply shares
of every captured layer, cross-validated with folds grouped by session (``GroupKFold``: a
session's turns are never split between training and test). One AUC over the pooled
out-of-fold predictions, with a 95% CI that resamples sessions (the predictions are fixed;
only the turns the AUC is taken over change). The baseline is the same model on the turn's
index and its reply length in tokens. The positive class is a failing turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sysbench_gpu.attention.analysis.figures import pyplot, save_figure
from sysbench_gpu.attention.analysis.head_table import HeadTable
from sysbench_gpu.core.errors import SysbenchError

INSTALL_HINT = "the failure probe needs scikit-learn: pip install 'sysbench-gpu[interp]'"


@dataclass
class ProbeScore:
    auc: float | None
    ci95: list[float] | None
    oof: np.ndarray = field(repr=False)  # pooled out-of-fold probability of failing, per turn


@dataclass
class ProbeResult:
    status: str  # ok | one-class | too-few-sessions
    reason: str | None
    n_turns: int
    n_sessions: int
    n_failing: int
    folds: int
    probe: ProbeScore | None = None
    baseline: ProbeScore | None = None
    fail: np.ndarray | None = field(default=None, repr=False)


def sklearn_available() -> bool:
    try:
        import sklearn  # noqa: F401
    except ImportError:
        return False
    return True


def oof_predictions(features: np.ndarray, fail: np.ndarray, groups: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """Probability of failing for every row, each from a model fitted without the row's session."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GroupKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    predicted = np.empty(fail.size, dtype=np.float64)
    for train, test in GroupKFold(n_splits=folds).split(features, fail, groups):
        if np.ptp(fail[train]) == 0:
            # A training fold with one class: the only honest prediction is that class's rate.
            predicted[test] = fail[train].mean()
            continue
        model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, random_state=seed))
        model.fit(features[train], fail[train])
        predicted[test] = model.predict_proba(features[test])[:, 1]
    return predicted


def session_bootstrap_auc(
    session_ids: np.ndarray, fail: np.ndarray, scores: np.ndarray, n_boot: int, seed: int
) -> list[float] | None:
    """95% percentile CI of the AUC of fixed predictions, resampling whole sessions."""
    from sklearn.metrics import roc_auc_score

    unique = np.unique(session_ids)
    rows = [np.flatnonzero(session_ids == sid) for sid in unique]
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(n_boot):
        index = np.concatenate([rows[i] for i in rng.integers(0, unique.size, unique.size)])
        if np.ptp(fail[index]) > 0:
            values.append(roc_auc_score(fail[index], scores[index]))
    if len(values) < n_boot // 2:
        return None
    low, high = np.percentile(values, [2.5, 97.5])
    return [float(low), float(high)]


def _score(features: np.ndarray, table: HeadTable, fail: np.ndarray, folds: int, n_boot: int, seed: int) -> ProbeScore:
    from sklearn.metrics import roc_auc_score

    oof = oof_predictions(features, fail, table.session_ids, folds, seed)
    return ProbeScore(
        auc=float(roc_auc_score(fail, oof)),
        ci95=session_bootstrap_auc(table.session_ids, fail, oof, n_boot, seed),
        oof=oof,
    )


def run_probe(table: HeadTable, folds: int = 5, n_boot: int = 1000, seed: int = 0) -> ProbeResult:
    """Cross-validated AUC of the head-share probe and of the baseline over the judged turns of ``table``."""
    if not sklearn_available():
        raise SysbenchError(INSTALL_HINT)
    judged = table.judged()
    n = int(judged.passed.size)
    fail = 1.0 - judged.passed
    n_sessions = int(np.unique(judged.session_ids).size)
    result = ProbeResult("ok", None, n, n_sessions, int(fail.sum()), min(folds, n_sessions), fail=fail)
    if n == 0 or np.ptp(fail) == 0:
        which = "no judged turn" if n == 0 else ("every judged turn fails" if fail[0] else "every judged turn passes")
        result.status, result.reason = "one-class", f"{which}: the data hold one class, so there is no AUC"
        return result
    if n_sessions < 2:
        result.status, result.reason = "too-few-sessions", "one session: grouped folds need at least two"
        return result
    heads = judged.shares.reshape(n, -1)
    baseline = np.column_stack([judged.turns, judged.reply_tokens]).astype(np.float64)
    result.probe = _score(heads, judged, fail, result.folds, n_boot, seed)
    result.baseline = _score(baseline, judged, fail, result.folds, n_boot, seed)
    return result


def _score_json(score: ProbeScore | None) -> dict[str, Any] | None:
    return None if score is None else {"auc": score.auc, "ci95": score.ci95}


def probe_json(result: ProbeResult, metric: str) -> dict[str, Any]:
    """``probe.json``."""
    return {
        "status": result.status,
        "reason": result.reason,
        "positive_class": "failing turn",
        "features": f"per-head {metric} of every captured layer (system condition), standardized",
        "baseline_features": "turn index and reply length in tokens",
        "model": "scikit-learn LogisticRegression (L2, C=1), StandardScaler",
        "cv": {"splitter": "GroupKFold", "groups": "session", "folds": result.folds},
        "auc": "pooled out-of-fold predictions; ci95: session bootstrap",
        "n_turns": result.n_turns,
        "n_sessions": result.n_sessions,
        "n_failing": result.n_failing,
        "probe": _score_json(result.probe),
        "baseline": _score_json(result.baseline),
    }


def summary_line(result: ProbeResult) -> str:
    if result.status != "ok" or result.probe is None or result.baseline is None:
        return f"probe: {result.reason}"

    def text(score: ProbeScore) -> str:
        ci = f" [{score.ci95[0]:.3f}, {score.ci95[1]:.3f}]" if score.ci95 else " (no CI)"
        return f"{score.auc:.3f}{ci}"

    return (
        f"probe: CV AUC {text(result.probe)} vs baseline (turn, reply length) {text(result.baseline)}; "
        f"{result.n_failing} failing of {result.n_turns} turns, {result.n_sessions} sessions, {result.folds} folds"
    )


def plot_roc(result: ProbeResult, base: Path, title: str) -> list[Path]:
    """ROC curves of the pooled out-of-fold predictions: the head probe and the baseline."""
    from sklearn.metrics import roc_curve

    if result.probe is None or result.baseline is None or result.fail is None:
        return []
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4, 4))
    for score, label, style in ((result.probe, "per-head shares", "-"), (result.baseline, "turn + length", "--")):
        fpr, tpr, _ = roc_curve(result.fail, score.oof)
        ax.plot(fpr, tpr, linestyle=style, label=f"{label}: AUC {score.auc:.2f}")
    ax.plot([0, 1], [0, 1], color="lightgray", linewidth=0.8)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate (failing turns)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="lower right", framealpha=0.9)
    paths = save_figure(fig, base)
    plt.close(fig)
    return paths
