"""``judge`` as a Python function: the same checks and the same judging as the ``judge`` verb (docs/python-api.md).

The arguments go through the verb's own parser (``core.verb_args``), then the verb's
``job_from_args`` and ``run_judge_job`` (``judging.job``): cache, ledger and resumption are
the verb's, so judging a run here and again on the command line never asks a turn twice.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sysbench_gpu.core.progress import DEFAULT_LOG_EVERY
from sysbench_gpu.core.verb_args import session_text, verb_namespace
from sysbench_gpu.judging import cli
from sysbench_gpu.judging.job import estimate_judging, run_judge_job
from sysbench_gpu.judging.rounds import JudgeSummary


def judge(
    run_dir: str | Path,
    *,
    backend: str | None = None,
    model: str | None = None,
    template: str | None = None,
    max_tokens: int | None = None,
    max_retries: int | None = None,
    seed: int | None = None,
    engine_options: Mapping[str, Any] | None = None,
    sessions: str | Sequence[int] | None = None,
    limit: int | None = None,
    options: Mapping[str, Any] | None = None,
    progress: bool = True,
    log_every: float = DEFAULT_LOG_EVERY,
) -> JudgeSummary:
    """Judge every generated turn of ``run_dir`` that has no judgment yet (resumable, cached, counted once).

    ``backend`` (``"openai"``, ``"vllm"`` or ``"hf"``) and ``model`` name the judge; both None scores an
    MT-Eval run's rule-scored turns with no judge model. ``template``: SysBench's ``"zh"`` (default),
    ``"en"`` or a file. ``engine_options``: the local judge's constructor options (``--engine-option``),
    e.g. ``{"batch_size": 8}``. ``options``: any other ``judge`` flag by its name with underscores, e.g.
    ``{"base_url": ..., "concurrency": 16, "judge_prompts": "official"}``.

    Returns the counts the verb prints (``JudgeSummary``: judged, unparsed, requests, cache hits, ...).
    """
    args = _judge_args(
        run_dir, backend, model, template, max_tokens, max_retries, seed, engine_options, sessions, limit, options
    )
    args.no_progress, args.log_every = not progress, log_every
    return run_judge_job(cli.job_from_args(args), progress=progress, log_every=log_every)


def judge_estimate(
    run_dir: str | Path,
    *,
    backend: str | None = None,
    model: str | None = None,
    template: str | None = None,
    max_tokens: int | None = None,
    max_retries: int | None = None,
    seed: int | None = None,
    engine_options: Mapping[str, Any] | None = None,
    sessions: str | Sequence[int] | None = None,
    limit: int | None = None,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``judge --dry-run --json``: the requests, estimated tokens and cost of what is left; nothing is sent."""
    args = _judge_args(
        run_dir, backend, model, template, max_tokens, max_retries, seed, engine_options, sessions, limit, options
    )
    args.dry_run = True
    return estimate_judging(cli.job_from_args(args))


def _judge_args(
    run_dir: str | Path,
    backend: str | None,
    model: str | None,
    template: str | None,
    max_tokens: int | None,
    max_retries: int | None,
    seed: int | None,
    engine_options: Mapping[str, Any] | None,
    sessions: str | Sequence[int] | None,
    limit: int | None,
    options: Mapping[str, Any] | None,
) -> argparse.Namespace:
    values: dict[str, Any] = {
        "judge": backend,
        "judge_model": model,
        "template": template,
        "seed": seed,
        "sessions": session_text(sessions),
        "limit": limit,
        # --engine-option KEY=VALUE, each value as JSON (as the flag reads it)
        "engine_option": [f"{key}={json.dumps(value)}" for key, value in (engine_options or {}).items()],
        **dict(options or {}),
    }
    if max_tokens is not None:
        values["max_tokens"] = max_tokens
    if max_retries is not None:
        values["max_retries"] = max_retries
    return verb_namespace(cli.register, "judge", [str(run_dir)], values)
