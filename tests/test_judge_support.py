"""Helpers shared by the judge tests (no tests here): tiny run directories and replies."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from sysbench_gpu.benchmarks.registry import save_run_sessions
from sysbench_gpu.core.records import GenerationRecord
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.core.sessions import Dataset, Session

MARK = re.compile(r"ANSWER (\w+) s(\d+) t(\d+)")


def make_run(
    path: Path,
    dataset: Dataset,
    system_ids: Iterable[int],
    kind_of: Callable[[int, int], str] = lambda sid, turn: "good",
    history: str = "model",
) -> RunDir:
    """A generated run whose replies carry a marker ``ANSWER <kind> s<id> t<turn>``.

    A kind of ``skipped`` makes a turn without a response (as an over-length skip).
    """
    sessions = dataset.select(system_ids=list(system_ids))
    run = RunDir(path)
    path.mkdir(parents=True, exist_ok=True)
    run.update_manifest(label=path.name, model="fake-model")
    save_run_sessions(run, sessions, dataset)
    records = []
    for session in sessions:
        for turn in session.turns:
            kind = kind_of(session.system_id, turn.index)
            skipped = kind == "skipped"
            records.append(
                GenerationRecord(
                    system_id=session.system_id,
                    turn=turn.index,
                    user=turn.user,
                    response=None if skipped else f"ANSWER {kind} s{session.system_id} t{turn.index}",
                    history=history,
                    status="skipped" if skipped else "ok",
                    overflow="skipped" if skipped else None,
                    model="fake-model",
                )
            )
    run.generations.append(records, existing=set())
    return run


def marker(prompt: str) -> tuple[str, int, int]:
    """The (kind, system_id, turn) of the turn under evaluation (the last marker in the prompt)."""
    found = MARK.findall(prompt)
    kind, sid, turn = found[-1]
    return kind, int(sid), int(turn)


def good_reply(session: Session, turn: int, value: str = "是") -> str:
    verdicts = {str(c.id): value for c in session.turn(turn).constraints}
    return json.dumps({"评判理由": "逐条核对", "评判结果": verdicts}, ensure_ascii=False)
