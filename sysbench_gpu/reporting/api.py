"""``metrics`` and ``report`` as Python functions, the same as the verbs (docs/python-api.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.base import ReportResult
from sysbench_gpu.benchmarks.runs import run_metrics
from sysbench_gpu.core.arguments import check_integer
from sysbench_gpu.core.verb_args import verb_namespace
from sysbench_gpu.reporting import report as report_verb


def metrics(
    run_dir: str | Path,
    *,
    allow_partial: bool = False,
    exclude_unparsed: bool = False,
    exclude_skipped: bool = False,
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """``metrics RUN_DIR --json``: the run's numbers as its benchmark defines them, fractions in [0, 1].

    SysBench: ``csr``, ``isr``, ``ssr`` (each with its session-bootstrap CI) and breakdowns; MT-Eval: scores
    by task, category and answered turn. An unfinished run is refused unless ``allow_partial``.
    """
    check_integer(resamples, "resamples", 1)  # the verb's own checks (cli.main's check_shared_flags)
    check_integer(seed, "seed", 0)
    return run_metrics(
        run_dir,
        allow_partial=allow_partial,
        exclude_unparsed=exclude_unparsed,
        exclude_skipped=exclude_skipped,
        resamples=resamples,
        seed=seed,
    )


def report(
    runs: Sequence[str | Path],
    out: str | Path,
    *,
    labels: Sequence[str] | None = None,
    gt_pairs: Sequence[tuple[str | Path, str | Path]] = (),
    figures: bool = True,
    formats: str = "png,pdf",
    options: Mapping[str, Any] | None = None,
) -> ReportResult:
    """``report RUN... --out OUT``: tables (Markdown, LaTeX), figures, ``report.md`` and ``report.json``.

    ``gt_pairs``: (ground-truth-history run, the same model's plain run) pairs (SysBench). ``options``: any
    other ``report`` flag by its name with underscores (``sort``, ``resamples``, ``allow_partial``, ...).
    Returns the folder and the files written.
    """
    values: dict[str, Any] = {
        "labels": ",".join(labels) if labels is not None else None,
        "gt_pair": [f"{gt}={base}" for gt, base in gt_pairs],
        "no_figures": not figures,
        "formats": formats,
        **dict(options or {}),
    }
    args = verb_namespace(report_verb.register, "report", [*map(str, runs), "--out", str(out)], values)
    return report_verb.report_from_args(args)
