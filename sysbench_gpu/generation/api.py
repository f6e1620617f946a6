"""``generate`` as a Python function: the same checks and the same run as the ``generate`` verb (docs/python-api.md).

The arguments go through the verb's own parser (``core.verb_args``), then the verb's
``job_from_args`` and ``run_generation_job``: a run made here is the run the command line
would have made, manifest included, and a rerun resumes it either way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sysbench_gpu.core.progress import DEFAULT_LOG_EVERY
from sysbench_gpu.core.verb_args import session_text, verb_namespace
from sysbench_gpu.generation import cli
from sysbench_gpu.generation.job import run_generation_job
from sysbench_gpu.generation.settings import GenerateSummary


def generate(
    data: str | Path,
    *,
    model: str,
    engine: str,
    out: str | Path,
    history: str = "model",
    distractor_turns: int = 0,
    distractor_seed: int | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    repetition_penalty: float | None = None,
    seed: int | None = None,
    ignore_eos: bool = False,
    preset: str | None = None,
    benchmark: str | None = None,
    system_message: str | None = None,
    task: str | None = None,
    sessions: str | Sequence[int] | None = None,
    limit: int | None = None,
    skip_missing_reference: bool = False,
    on_overflow: str = "error",
    options: Mapping[str, Any] | None = None,
    progress: bool = True,
    log_every: float = DEFAULT_LOG_EVERY,
) -> GenerateSummary:
    """Generate replies for every selected session into the run directory ``out`` (resumable).

    ``data``: a SysBench or MT-Eval file or folder, or ``"demo"``. ``model``: a path, hub id or
    ``"smollm2"``; ``engine``: ``"hf"``, ``"vllm"`` or ``"openai"``. ``history``,
    ``distractor_turns`` and ``distractor_seed`` choose the ablation; the sampling arguments
    default to the model's own generation config. ``options``: any other ``generate`` flag by its
    name with underscores, e.g. ``{"batch_size": 8}`` (hf), ``{"tensor_parallel_size": 4}`` (vllm),
    ``{"base_url": "http://localhost:8000/v1"}`` (openai). Every check of the verb applies, before
    anything is created or loaded; an error is a ``SysbenchError`` naming the flag.

    Returns the records written and skipped (``GenerateSummary``).
    """
    values: dict[str, Any] = {
        "history": history,
        "distractor_turns": distractor_turns,
        "distractor_seed": distractor_seed,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "repetition_penalty": repetition_penalty,
        "seed": seed,
        "ignore_eos": ignore_eos,
        "preset": preset,
        "benchmark": benchmark,
        "system_message": system_message,
        "task": task,
        "sessions": session_text(sessions),
        "limit": limit,
        "skip_missing_reference": skip_missing_reference,
        "on_overflow": on_overflow,
        "no_progress": not progress,
        "log_every": log_every,
        **dict(options or {}),
    }
    required = ["--data", str(data), "--model", model, "--engine", engine, "--out", str(out)]
    args = verb_namespace(cli.register, "generate", required, values)
    summary, _ = run_generation_job(cli.job_from_args(args), progress=progress, log_every=log_every)
    return summary
