"""The knockout rows of an attention output directory (``knockout.jsonl``): one per session, turn and arm.

``capture.knockout`` appends them, the rows of one session and arm in one write (a crash
tears at most that write's tail, which the readers leave out); ``analysis.knockout_report``
and the explorer read them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from sysbench_gpu.attention.files.store import complete_lines
from sysbench_gpu.core.errors import SysbenchError

KNOCKOUT_FILE = "knockout.jsonl"
ARMS = ("system", "control")


@dataclass(frozen=True)
class KnockoutRow:
    system_id: int
    turn: int
    arm: str  # system | control
    reply_span: tuple[int, int]  # [start, end) in the token ids of sessions/<id>.<arm>.npz
    logp_plain: float | None  # mean log-probability per reply token, plain forward (None: empty reply)
    logp_knockout: float | None  # the same with the span's keys hidden
    delta: float | None  # logp_knockout - logp_plain

    def to_json(self) -> str:
        row = asdict(self)
        row["reply_span"] = list(self.reply_span)
        return json.dumps(row)


def done_pairs(out: Path) -> set[tuple[int, str]]:
    """(system_id, arm) pairs already in ``knockout.jsonl`` (a session's rows of one arm are one write)."""
    path = out / KNOCKOUT_FILE
    if not path.exists():
        return set()
    pairs = set()
    for number, line in complete_lines(path):
        try:
            row = json.loads(line)
            pairs.add((int(row["system_id"]), str(row["arm"])))
        except (ValueError, KeyError, TypeError) as error:
            raise SysbenchError(f"{path}: line {number}: not a knockout row ({error})") from None
    return pairs


def read_knockout(out: Path) -> list[KnockoutRow]:
    """Every complete row of ``knockout.jsonl`` ([] when the folder has none)."""
    path = out / KNOCKOUT_FILE
    if not path.exists():
        return []
    rows = []
    for number, line in complete_lines(path):
        try:
            row = json.loads(line)
            rows.append(
                KnockoutRow(
                    int(row["system_id"]),
                    int(row["turn"]),
                    str(row["arm"]),
                    (int(row["reply_span"][0]), int(row["reply_span"][1])),
                    row["logp_plain"],
                    row["logp_knockout"],
                    row["delta"],
                )
            )
        except (ValueError, KeyError, TypeError, IndexError) as error:
            raise SysbenchError(f"{path}: line {number}: not a knockout row ({error})") from None
    return rows
