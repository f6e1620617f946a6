"""The merged per-turn table of an attention output directory (``turn_shares.jsonl``).

Each rank appends its rows to its own shard as sessions finish (``store``); the merge
joins the shards and recomputes from the ``.npz`` (``analysis.turn_shares``) every row a
shard lacks, e.g. one whose line a crash tore.
"""

from __future__ import annotations

from pathlib import Path

from sysbench_gpu.attention.analysis import (
    TurnShare,
    read_turn_table,
    turn_row_json,
    turn_shares,
)
from sysbench_gpu.attention.store import TURN_TABLE, load_session
from sysbench_gpu.core.rundir import write_bytes_atomic


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
