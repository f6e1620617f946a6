"""What a battle depended on in each run, as a short digest stored with the battle and checked before rating.

A verdict battle depends on what each reply earned on its turn (the run's judgments, through
``Benchmark.arena_points``) and on the reply itself (its length is the length-control
covariate). A judged battle depends on what the judge read: the system message and each run's
conversation up to the turn, replies included; the run's own verdicts play no part in it. So a
verdict battle goes stale when a run is judged again, and a judged battle when a run's
replies change.
"""

from __future__ import annotations

import hashlib
import json

from sysbench_gpu.arena.prompt import transcript
from sysbench_gpu.arena.runs import ArenaRun

DIGEST_CHARS = 16  # 64 bits: enough to see a change, short enough for 200 000 battles a file


def _digest(parts: list[object]) -> str:
    data = json.dumps(parts, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(data).hexdigest()[:DIGEST_CHARS]


def conversation(run: ArenaRun, system_id: int, turn: int) -> str:
    """The run's conversation up to ``turn`` as the judge reads it: user turns, earlier replies, the final reply."""
    session = run.session(system_id)
    earlier = {t: reply for t in range(1, turn) if (reply := run.reply((system_id, t))) is not None}
    messages = run.benchmark.messages(session, turn, run.history((system_id, turn)), earlier)
    return transcript(messages, run.reply((system_id, turn)) or "")


def of_verdicts(run: ArenaRun, system_id: int, turn: int) -> str:
    """A verdict battle's side: the points its reply earned and the reply."""
    return _digest(["verdicts", run.points.get((system_id, turn)), run.reply((system_id, turn))])


def of_judged(run: ArenaRun, system_id: int, turn: int) -> str:
    """A judged battle's side: the system message and the conversation the judge was shown."""
    return _digest(["judge", run.session(system_id).system_prompt, conversation(run, system_id, turn)])


def fingerprint(run: ArenaRun, system_id: int, turn: int, by: str) -> str:
    """The side's digest now; "" for a session the run no longer has (so it never matches a stored one)."""
    if not run.has_session(system_id):
        return ""
    return of_judged(run, system_id, turn) if by == "judge" else of_verdicts(run, system_id, turn)
