"""The explorer's runs: each run directory read through its benchmark, with its metrics (see docs/explore.md).

Everything here is plain JSON-ready dicts built from run directories; nothing imports
torch. ``site`` writes them as ``<script>`` data files, ``sessions`` adds one record per
session, ``attention`` the token-level attention.

Sessions are keyed by (benchmark, scope, system_id) everywhere (:data:`SessionKey`; as text
``<benchmark>-<system_id>``, or ``<benchmark>-<scope>-<system_id>`` for a benchmark whose layout
names a scope, e.g. MT-Eval's task), so runs of two benchmarks never share a session page. What
differs between benchmarks comes from the run's benchmark: its ``run_metrics``, and for
the pages :meth:`~sysbench_gpu.benchmarks.base.Benchmark.explore_layout`, ``session_facets``
and ``turn_view``.

A run that ``metrics`` refuses as it stands (turns not judged, unparsed or skipped)
is scored again with the missing turns left out and shown as *partial*, with the
reason, rather than stopping the build.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.base import Benchmark
from sysbench_gpu.benchmarks.explorer import ExploreLayout
from sysbench_gpu.benchmarks.registry import benchmark_of, load_run_sessions
from sysbench_gpu.benchmarks.runs import run_metrics
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.core.sessions import Session
from sysbench_gpu.core.tables import unique_labels as unique_table_labels

Key = tuple[int, int]  # (system_id, turn): a record of one run
SessionKey = tuple[str, str, int]  # (benchmark name, scope or "", system_id): a session of the site


def session_key(benchmark: Benchmark, layout: ExploreLayout, session: Session) -> SessionKey:
    """Which session of the site ``session`` is: its benchmark, its scope (when the layout names one), its id."""
    scope = benchmark.session_facets(session).get(layout.scope) if layout.scope else None
    return (benchmark.name, "" if scope is None else str(scope), session.system_id)


def key_text(key: SessionKey) -> str:
    """A session's key as text, for file names, addresses and the index: ``<benchmark>[-<scope>]-<system_id>``."""
    parts = [re.sub(r"[^A-Za-z0-9_.-]+", "_", part) for part in key[:2] if part]
    return "-".join([*parts, str(int(key[2]))])


def keys_of(sessions: Sequence[Session]) -> dict[int, str]:
    """The site's key (as text) of each session of one run, by system_id."""
    benchmark = benchmark_of(sessions)
    layout = benchmark.explore_layout(None)
    return {s.system_id: key_text(session_key(benchmark, layout, s)) for s in sessions}


@dataclass(frozen=True)
class RunView:
    """One run directory as the explorer shows it."""

    path: Path
    label: str
    model: str | None
    judge_model: str | None
    status: str  # complete | partial | unscored
    note: str | None  # why a run is partial or unscored
    metrics: dict[str, Any] | None
    benchmark: Benchmark
    layout: ExploreLayout  # the benchmark's layout, with this run's headline cells
    sessions: dict[SessionKey, Session]
    generations: dict[Key, GenerationRecord]
    judgments: dict[Key, JudgmentRecord]


def score_run(path: Path, resamples: int, seed: int) -> tuple[str, str | None, dict[str, Any] | None]:
    """(status, note, metrics): strict first; a refused run is scored leniently and called partial."""
    try:
        return "complete", None, run_metrics(path, resamples=resamples, seed=seed)
    except SysbenchError as strict:
        reason = str(strict)
    try:
        lenient = run_metrics(
            path, allow_partial=True, exclude_unparsed=True, exclude_skipped=True, resamples=resamples, seed=seed
        )
    except SysbenchError as error:
        return "unscored", str(error), None
    return "partial", reason, lenient


def load_run_view(path: str | Path, resamples: int = 1000, seed: int = 0) -> RunView:
    run = RunDir(path).require()
    loaded = load_run_sessions(run)
    benchmark = benchmark_of(loaded)
    generations = run.generations.read()
    judgments = run.judgments.read()
    status, note, metrics = score_run(run.path, resamples, seed)
    layout = benchmark.explore_layout(metrics)
    judges = Counter(j.judge_model for j in judgments.values() if j.judge_model)
    label = metrics.get("label") if metrics else None
    model = metrics.get("model") if metrics else None
    if model is None:
        models = Counter(g.model for g in generations.values() if g.model)
        model = models.most_common(1)[0][0] if models else None
    return RunView(
        path=run.path,
        label=str(label or run.path.resolve().name),
        model=model,
        judge_model=judges.most_common(1)[0][0] if judges else None,
        status=status,
        note=note,
        metrics=metrics,
        benchmark=benchmark,
        layout=layout,
        sessions={session_key(benchmark, layout, s): s for s in loaded},
        generations=generations,
        judgments=judgments,
    )


def run_keys(view: RunView) -> dict[int, str]:
    """The site's key (as text) of each session of the run, by system_id."""
    return {key[2]: key_text(key) for key in view.sessions}


def json_ready(value: Any) -> Any:
    """``value`` as JSON: tuples as lists, numpy numbers as Python's, NaN and infinities as null."""
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None
    return str(value)


def run_summary(view: RunView) -> dict[str, Any]:
    """The index's entry for one run: who made it, its status, its metrics and its headline cells."""
    return {
        "label": view.label,
        "model": view.model,
        "judge_model": view.judge_model,
        "path": str(view.path.resolve()),
        "benchmark": view.benchmark.name,
        "status": view.status,
        "note": view.note,
        "metrics": json_ready(view.metrics) if view.metrics else None,
        "cells": json_ready(view.layout.cells),
    }


def benchmark_summaries(views: Sequence[RunView]) -> dict[str, dict[str, Any]]:
    """The index's entry per benchmark explored: its title and how its runs and sessions are laid out."""
    found: dict[str, dict[str, Any]] = {}
    for view in views:
        if view.benchmark.name in found:
            continue
        layout = view.layout
        found[view.benchmark.name] = json_ready(
            {
                "title": view.benchmark.title or view.benchmark.name,
                "unit": layout.unit,
                "outcome": layout.outcome,
                "scale": layout.scale,
                "kinds": layout.kinds,
                "facets": layout.facets,
                "caption": layout.caption,
            }
        )
    return found


def site_title(views: Sequence[RunView]) -> str:
    titles = dict.fromkeys(view.benchmark.title or view.benchmark.name for view in views)
    return f"{' + '.join(titles)} explorer: " + ", ".join(view.label for view in views)


def unique_labels(views: Sequence[RunView]) -> list[RunView]:
    """Runs with distinct labels (``name``, ``name (2)``, ...), in the given order."""
    labels = unique_table_labels([view.label for view in views])
    return [dataclasses.replace(view, label=label) for view, label in zip(views, labels, strict=True)]
