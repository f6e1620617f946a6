"""``attention`` as a Python function: the verb's own command, run in this process (docs/python-api.md).

The arguments go through the verb's parser (``core.verb_args``) and then to the function the
``attention`` verb runs (``stage.cmd_attention``), so the output folder, its manifest and its
resumption are the verb's. One process: for several GPUs use the verb under ``torchrun``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sysbench_gpu.attention import stage
from sysbench_gpu.core.jsonio import read_json
from sysbench_gpu.core.progress import DEFAULT_LOG_EVERY
from sysbench_gpu.core.verb_args import session_text, verb_namespace

ANALYSIS = "analysis.json"


def attention(
    run_dir: str | Path,
    *,
    model: str,
    out: str | Path,
    layers: str = "mid,last",
    control: bool = False,
    sessions: str | Sequence[int] | None = None,
    limit: int | None = None,
    figures: bool = True,
    options: Mapping[str, Any] | None = None,
    progress: bool = True,
    log_every: float = DEFAULT_LOG_EVERY,
) -> dict[str, Any]:
    """The system message's share of attention for every token of the run's sessions, written to ``out``.

    ``model``: the model the run was generated with (path, hub id or ``"smollm2"``). ``layers``: ``mid``,
    ``last``, ``all`` or layer numbers. ``control``: also the arm with the system text sent as a user
    message. ``options``: any other ``attention`` flag by its name with underscores (``dtype``,
    ``device``, ``per_head``, ``knockout``, ...). Finished sessions in ``out`` are skipped (resumable).

    Returns ``out/analysis.json`` (per-layer summaries, the correlation with the verdicts).
    """
    values: dict[str, Any] = {
        "layers": layers,
        "control": control,
        "sessions": session_text(sessions),
        "limit": limit,
        "no_figures": not figures,
        "no_progress": not progress,
        "log_every": log_every,
        **dict(options or {}),
    }
    args = verb_namespace(stage.register, "attention", [str(run_dir), "--model", model, "--out", str(out)], values)
    stage.cmd_attention(args)
    analysis = Path(out) / ANALYSIS
    return read_json(analysis, expect=dict) if analysis.is_file() else {}
