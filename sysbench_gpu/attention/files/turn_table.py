"""The per-turn table of an attention output directory: its rows, as measured and as merged (``turn_shares.jsonl``).

Per-token values (for one layer):

* ``share``: attention share of the system text, averaged over heads.
* ``share_excl_lead``: ``share / (1 - lead share)``: the same with the template's
  leading tokens (BOS, role header, ...) removed from numerator and denominator, as
  the paper's figure does (a ratio of head-summed values, as upstream computes it).

A row (``TurnShare``) holds, per turn, their means over the turn's segment (user message
+ reply, template tokens included) and over the reply tokens alone. Each rank appends its
rows to its own shard as sessions finish (``store``); the merge joins the shards and
recomputes from the ``.npz`` (``turn_shares``) every row a shard lacks, e.g. one whose
line a crash tore.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sysbench_gpu.attention.files.store import TURN_TABLE, complete_lines, load_session
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.jsonio import loads
from sysbench_gpu.core.rundir import write_bytes_atomic

LEAD, SYSTEM = 0, 1  # span columns in stored shares
METRICS = ("share", "share_excl_lead", "reply_share", "reply_share_excl_lead")


@dataclass
class TurnShare:
    system_id: int
    condition: str
    layer: int
    layer_label: str
    turn: int
    n_tokens: int
    n_reply_tokens: int
    share: float | None
    share_excl_lead: float | None
    reply_share: float | None
    reply_share_excl_lead: float | None

    @property
    def key(self) -> tuple[int, str, int, int]:
        return (self.system_id, self.condition, self.layer, self.turn)


def token_series(shares: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(share, share_excl_lead) per token from one layer's [T, 2] (lead, system) shares."""
    shares = shares.astype(np.float64)
    system, lead = shares[:, SYSTEM], shares[:, LEAD]
    remaining = np.clip(1.0 - lead, np.finfo(np.float64).tiny, None)
    return system, system / remaining


def _mean(values: np.ndarray) -> float | None:
    return float(values.mean()) if values.size else None


def turn_shares(stored: Mapping[str, Any]) -> list[TurnShare]:
    """Per-turn rows from one stored session (the arrays written by the attention stage)."""
    meta = json.loads(str(stored["meta"]))
    rows: list[TurnShare] = []
    layers = [int(x) for x in stored["layers"]]
    labels = meta.get("layer_labels_by_index", {})
    for layer_position, layer in enumerate(layers):
        share, share_excl = token_series(np.asarray(stored["shares"][layer_position]))
        for turn_no, (t0, t1), (r0, r1) in zip(
            stored["turn_numbers"], stored["turns"], stored["replies"], strict=False
        ):
            rows.append(
                TurnShare(
                    system_id=int(meta["system_id"]),
                    condition=meta["condition"],
                    layer=layer,
                    layer_label=labels.get(str(layer), f"layer{layer}"),
                    turn=int(turn_no),
                    n_tokens=int(t1 - t0),
                    n_reply_tokens=int(r1 - r0),
                    share=_mean(share[t0:t1]),
                    share_excl_lead=_mean(share_excl[t0:t1]),
                    reply_share=_mean(share[r0:r1]),
                    reply_share_excl_lead=_mean(share_excl[r0:r1]),
                )
            )
    return rows


_INT_FIELDS = ("system_id", "layer", "turn", "n_tokens", "n_reply_tokens")
_TEXT_FIELDS = ("condition", "layer_label")


def turn_row(row: Any, where: str) -> TurnShare:
    """One table line as a ``TurnShare``; one line naming the field whose value is of the wrong kind."""
    if not isinstance(row, dict):
        raise SysbenchError(f"{where} is not a turn-share row (a JSON object)")
    try:
        share = TurnShare(**row)
    except TypeError as error:
        raise SysbenchError(f"{where} is not a turn-share row ({error})") from None
    for name in _INT_FIELDS:
        value = getattr(share, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise SysbenchError(f"{where}: field {name!r} is {value!r}, expected a whole number")
    for name in _TEXT_FIELDS:
        if not isinstance(getattr(share, name), str):
            raise SysbenchError(f"{where}: field {name!r} is {getattr(share, name)!r}, expected text")
    for name in METRICS:
        value = getattr(share, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise SysbenchError(f"{where}: field {name!r} is {value!r}, expected a number or null")
    return share


def read_turn_table(path: Path) -> list[TurnShare]:
    """Rows of a shard or merged table; an unterminated last line (a write torn by a crash) is left out."""
    return [
        turn_row(loads(line, f"{path}: line {number}"), f"{path}: line {number}")
        for number, line in complete_lines(path)
    ]


def turn_row_json(row: TurnShare) -> str:
    return json.dumps(asdict(row), ensure_ascii=False, separators=(",", ":"))


def merge_turn_table(out: Path) -> list[TurnShare]:
    """Merge the per-rank shards into turn_shares.jsonl; rows missing from the shards are recomputed from the .npz."""
    rows: dict[tuple[int, str, int, int], TurnShare] = {}
    for shard in sorted((out / "shards").glob("*.jsonl")):
        for row in read_turn_table(shard):
            rows[row.key] = row
    for path in sorted((out / "sessions").glob("*.npz")):
        system_id, condition = path.name.split(".")[:2]
        index = load_session(path, ("layers", "turn_numbers"))
        expected = {
            (int(system_id), condition, int(layer), int(turn))
            for layer in index["layers"]
            for turn in index["turn_numbers"]
        }
        if not expected <= rows.keys():  # e.g. the shard's tail was torn by a crash
            for row in turn_shares(load_session(path)):
                rows[row.key] = row
    ordered = [rows[key] for key in sorted(rows)]
    write_bytes_atomic(out / TURN_TABLE, "".join(turn_row_json(row) + "\n" for row in ordered).encode("utf-8"))
    return ordered
