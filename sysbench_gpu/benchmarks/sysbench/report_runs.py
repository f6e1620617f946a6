"""The runs a report shows: their metrics and provenance, ground-truth-history pairs, dataset checks.

``load_run`` scores a run directory with :func:`sysbench_gpu.benchmarks.runs.run_metrics` and
keeps what the report says about how the numbers were made (model, dataset checksum, a
fingerprint of the scored checklists). Nothing here imports matplotlib or torch.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.registry import load_run_sessions
from sysbench_gpu.benchmarks.runs import run_metrics
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.core.sessions import Session
from sysbench_gpu.core.tables import _num

N_TURNS = 5  # SysBench sessions have five user turns

MetricsFn = Callable[..., dict]


# ---------------------------------------------------------------- runs and their metrics


@dataclass(frozen=True)
class RunSummary:
    """One judged run as the report sees it."""

    path: Path
    label: str
    model: str | None
    dataset_sha256: str | None  # checksum of the data file the run was made from, per its manifest
    metrics: dict[str, Any]
    manifest: dict[str, Any]
    checklist_sha256: str | None = None  # what is scored: sessions, turns, alignments, checklists

    @property
    def data_file_sha256(self) -> str | None:
        """The dataset checksum when it is one of a data file (an import without --data records the workbook's)."""
        dataset = self.manifest.get("dataset")
        if isinstance(dataset, dict) and dataset.get("rebuilt_from"):
            return None
        return self.dataset_sha256


@dataclass(frozen=True)
class GtPair:
    """A run generated with ground-truth history next to the same model's normal run."""

    label: str
    gt: RunSummary
    base: RunSummary

    @property
    def turn_gains(self) -> list[float | None]:
        """ISR gain per turn in percentage points (GT minus base), turns 1..5."""
        return isr_gain_by_turn(self.gt.metrics, self.base.metrics)

    @property
    def turn1_noise_band(self) -> float | None:
        """Half-width (points) of a 95% band for the turn-1 gain from sampling and judging alone.

        Turn 1 sees no history, so both runs answer the same prompt: the two turn-1 ISRs
        differ only by chance. Treated as two independent proportions over the sessions.
        """
        p_gt = _num(as_sequence(self.gt.metrics.get("isr_by_round"))[0])
        p_base = _num(as_sequence(self.base.metrics.get("isr_by_round"))[0])
        n_gt, n_base = _num(self.gt.metrics.get("n_sessions")), _num(self.base.metrics.get("n_sessions"))
        if None in (p_gt, p_base) or not n_gt or not n_base:
            return None
        variance = p_gt * (1 - p_gt) / n_gt + p_base * (1 - p_base) / n_base
        return 100.0 * 1.96 * math.sqrt(variance)


def _default_metrics_fn() -> MetricsFn:
    return run_metrics


def require_judged(path: Path) -> RunDir:
    """The run directory at ``path``; a clear error when it is not one or has no judgments."""
    run = RunDir(path)
    run.require()
    if not run.judgments.path.is_file() or run.judgments.path.stat().st_size == 0:
        raise SysbenchError(
            f"{path}: run is not judged (no {run.judgments.path.name}); run `sysbench-gpu judge` "
            "or `sysbench-gpu import-upstream` first"
        )
    return run


def load_run(
    path: str | Path,
    label: str | None = None,
    metrics_fn: MetricsFn | None = None,
    **metric_options: Any,
) -> RunSummary:
    """Compute a run's metrics and collect what the report says about how they were made."""
    path = Path(path)
    run = require_judged(path)
    manifest = run.read_manifest()
    metrics = (metrics_fn or _default_metrics_fn())(path, **metric_options)
    model = metrics.get("model") or manifest.get("model") or _find_in_stages(manifest, "model")
    label = label or metrics.get("label") or manifest.get("label") or path.name
    dataset = manifest.get("dataset") if isinstance(manifest.get("dataset"), dict) else {}
    return RunSummary(
        path=path,
        label=str(label),
        model=str(model) if model is not None else None,
        dataset_sha256=dataset.get("sha256"),
        metrics=metrics,
        manifest=manifest,
        checklist_sha256=checklist_fingerprint(load_run_sessions(run)) if run.sessions_path.is_file() else None,
    )


def checklist_fingerprint(sessions: Sequence[Session]) -> str:
    """sha256 over everything scoring depends on, so runs made from differently-sourced copies
    of the same data (an official file, a workbook import) still compare equal."""
    digest = hashlib.sha256()
    for session in sorted(sessions, key=lambda s: s.system_id):
        item = [
            session.system_id,
            session.dependent,
            [[t.index, t.alignment, [[c.id, c.type, c.content] for c in t.constraints]] for t in session.turns],
        ]
        digest.update(json.dumps(item, ensure_ascii=False).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def _find_in_stages(manifest: Mapping[str, Any], key: str) -> Any:
    for section in (manifest.get("stages") or {}).values():
        if isinstance(section, dict) and section.get(key):
            return section[key]
    return None


def dataset_warnings(runs: Sequence[RunSummary]) -> list[str]:
    """Warnings when runs were made over different data (the numbers are then not comparable)."""
    unique: dict[Path, RunSummary] = {}
    for run in runs:
        unique.setdefault(run.path.resolve(), run)
    runs = list(unique.values())
    warnings: list[str] = []
    missing = [run.label for run in runs if not run.dataset_sha256]
    if missing:
        warnings.append(f"no dataset checksum recorded in the manifest of: {', '.join(missing)}")
    by_sha: dict[str, list[str]] = {}
    for run in runs:
        if run.data_file_sha256:
            by_sha.setdefault(run.data_file_sha256, []).append(run.label)
    if len(by_sha) > 1:
        groups = "; ".join(f"{sha[:12]}: {', '.join(labels)}" for sha, labels in by_sha.items())
        warnings.append(f"runs were made from {len(by_sha)} different dataset files ({groups}); compare with care")
    by_checklist: dict[str, list[str]] = {}
    for run in runs:
        if run.checklist_sha256:
            named = f"{run.label} ({run.metrics.get('n_sessions')} sessions)"
            by_checklist.setdefault(run.checklist_sha256, []).append(named)
    if len(by_checklist) > 1:
        groups = "; ".join(f"{sha[:12]}: {', '.join(labels)}" for sha, labels in by_checklist.items())
        warnings.append(
            f"runs score {len(by_checklist)} different sets of sessions or checklists ({groups}); "
            "their numbers are not comparable"
        )
    partial = [run.label for run in runs if run.metrics.get("partial")]
    if partial:
        warnings.append(
            f"partial runs (turns not generated or not judged, or a stage still running): {', '.join(partial)}"
        )
    return warnings


# ---------------------------------------------------------------- metric access


def as_sequence(value: Any, n: int = N_TURNS) -> list[float | None]:
    """A per-turn/per-round metric as a list of ``n`` values, whether stored as a list or a dict."""
    if value is None:
        return [None] * n
    if isinstance(value, Mapping):
        out: list[float | None] = []
        for index in range(1, n + 1):
            found = None
            for key in (f"t{index}", f"R{index}", f"r{index}", str(index), index):
                if key in value:
                    found = value[key]
                    break
            out.append(found)
        return out
    values = list(value)
    return [values[i] if i < len(values) else None for i in range(n)]


def isr_gain_by_turn(gt_metrics: Mapping[str, Any], base_metrics: Mapping[str, Any]) -> list[float | None]:
    """Per-turn ISR of the GT-history run minus that of the base run, in percentage points."""
    gt = as_sequence(gt_metrics.get("isr_by_round"))
    base = as_sequence(base_metrics.get("isr_by_round"))
    gains: list[float | None] = []
    for g, b in zip(gt, base, strict=False):
        g, b = _num(g), _num(b)
        gains.append(None if g is None or b is None else 100.0 * (g - b))
    return gains


def _diff_points(a: Any, b: Any) -> float | None:
    a, b = _num(a), _num(b)
    return None if a is None or b is None else 100.0 * (a - b)
