"""Per-head, per-turn system shares of an attention output directory, joined with each turn's pass or fail.

The heads map and the failure probe read one table: a row per measured turn of the
system condition, holding every captured layer's per-head mean share of the reply
tokens (``share_excl_lead`` per head, from ``per_head`` [L, H, T, 2] of the stored
sessions, which ``attention --per-head`` writes). A turn's outcome comes from the run
the attention stage measured, through the benchmark protocol (``outcomes.turn_outcomes``,
``turn_view``): shared code never asks which benchmark it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sysbench_gpu.attention.analysis.outcomes import turn_outcomes
from sysbench_gpu.attention.files.store import load_session, read_manifest
from sysbench_gpu.attention.files.turn_table import LEAD, SYSTEM
from sysbench_gpu.core.errors import SysbenchError

CONDITION = "system"  # the heads and the probe read the arm where the system text is a system message


@dataclass
class HeadTable:
    """One row per measured turn: ids, the per-head shares [N, L, H], and the turn's outcome.

    ``passed`` is 1.0 (passed), 0.0 (failed) or NaN (not judged, or the benchmark gives
    the turn a score and no pass or fail).
    """

    session_ids: np.ndarray  # [N] int
    turns: np.ndarray  # [N] int, the turn's number in its session
    reply_tokens: np.ndarray  # [N] int
    shares: np.ndarray  # [N, L, H] float64
    passed: np.ndarray  # [N] float64: 1, 0 or NaN
    layers: list[int]
    layer_labels: list[str]

    @property
    def n_heads(self) -> int:
        return int(self.shares.shape[2])

    def judged(self) -> HeadTable:
        """Only the rows with a pass or a fail."""
        keep = np.isfinite(self.passed)
        return HeadTable(
            self.session_ids[keep],
            self.turns[keep],
            self.reply_tokens[keep],
            self.shares[keep],
            self.passed[keep],
            self.layers,
            self.layer_labels,
        )


def head_turn_shares(stored: dict[str, np.ndarray], path: Path) -> list[tuple[int, int, np.ndarray]]:
    """(turn, reply tokens, [L, H] mean reply share with the lead excluded) per measured turn of one session."""
    if "per_head" not in stored:
        raise SysbenchError(f"{path}: field 'per_head' is missing (measure with `attention --per-head`)")
    per_head = np.asarray(stored["per_head"], dtype=np.float64)  # [L, H, T, 2]
    remaining = np.clip(1.0 - per_head[..., LEAD], np.finfo(np.float64).tiny, None)
    excl = per_head[..., SYSTEM] / remaining  # [L, H, T]
    rows = []
    for turn, (r0, r1) in zip(stored["turn_numbers"], stored["replies"], strict=False):
        if r1 <= r0:
            continue  # a turn with no reply token has no reply share
        rows.append((int(turn), int(r1 - r0), excl[:, :, int(r0) : int(r1)].mean(axis=2)))
    return rows


def load_head_table(out: Path, run_dir: Path | None = None) -> HeadTable:
    """The per-head table of one attention output directory (the run defaults to the manifest's ``run_dir``)."""
    manifest = read_manifest(out)
    if run_dir is None:
        if "run_dir" not in manifest:
            raise SysbenchError(f"{out / 'manifest.json'}: field 'run_dir' is missing (pass --run)")
        run_dir = Path(manifest["run_dir"])
    outcomes = turn_outcomes(run_dir)
    files = sorted((out / "sessions").glob(f"*.{CONDITION}.npz"))
    if not files:
        raise SysbenchError(f"{out / 'sessions'}: no measured session of the {CONDITION} condition")
    sids, turns, lengths, shares, passed = [], [], [], [], []
    layers: list[int] | None = None
    labels: dict[str, str] = {}
    for path in files:
        stored = load_session(path)
        meta = json.loads(str(stored["meta"]))
        these = [int(x) for x in stored["layers"]]
        if layers is not None and these != layers:
            raise SysbenchError(f"{path}: field 'layers' is {these}, other sessions have {layers}")
        layers = these
        labels = meta.get("layer_labels_by_index", labels)
        sid = int(meta["system_id"])
        for turn, n_reply, values in head_turn_shares(stored, path):
            sids.append(sid)
            turns.append(turn)
            lengths.append(n_reply)
            shares.append(values)
            passed.append(outcomes.get((sid, turn), np.nan))
    if layers is None or not shares:
        raise SysbenchError(f"{out / 'sessions'}: no measured turn with reply tokens")
    return HeadTable(
        session_ids=np.asarray(sids, dtype=np.int64),
        turns=np.asarray(turns, dtype=np.int64),
        reply_tokens=np.asarray(lengths, dtype=np.int64),
        shares=np.stack(shares),
        passed=np.asarray(passed, dtype=np.float64),
        layers=layers,
        layer_labels=[labels.get(str(layer), f"layer{layer}") for layer in layers],
    )
