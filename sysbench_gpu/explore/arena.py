"""``explore --arena ARENA_DIR``: a page of an arena's battles, each battle's two replies side by side.

::

    SITE/
      arena.html, explore_arena.js      the page (copied from explore/assets/; explore.css is shared)
      data/arena/index.js               the leaderboard, the runs, the sessions with battles
      data/arena/s<system_id>.js        one session: its user turns, every run's replies, its battles

Replies come from the run directories the arena's manifest names; every text reaches the
page through ``textContent``, never as HTML. Everything is read (and so checked) by
:func:`load_arena_pages` before :func:`write_arena_pages` writes a file, so ``explore RUN --arena
ARENA`` refuses a missing or broken arena before it writes the run pages.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from sysbench_gpu.arena.battles import BattleStore
from sysbench_gpu.arena.outputs import RATINGS
from sysbench_gpu.arena.runs import run_labels
from sysbench_gpu.arena.stage import STAGE
from sysbench_gpu.benchmarks.registry import load_run_sessions
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.jsonio import read_json
from sysbench_gpu.core.records import GenerationRecord
from sysbench_gpu.core.rundir import RunDir, write_bytes_atomic
from sysbench_gpu.explore.scripts import js_assignment, keyed_assignment

ARENA_ASSETS = ("arena.html", "explore_arena.js", "explore.css")
INDEX_GLOBAL = "SYSBENCH_ARENA_INDEX"
SESSIONS_GLOBAL = "SYSBENCH_ARENA_SESSIONS"


def _arena_runs(arena: Path) -> list[Mapping[str, Any]]:
    if not arena.is_dir():
        raise SysbenchError(f"--arena {arena}: no such arena folder")
    manifest = RunDir(arena).read_manifest() if (arena / "manifest.json").is_file() else {}
    runs = manifest.get("stages", {}).get(STAGE, {}).get("runs")
    if not isinstance(runs, list) or not runs or not (arena / RATINGS).is_file():
        raise SysbenchError(
            f"--arena {arena}: not an arena folder (no {RATINGS} or stages.arena.runs in manifest.json)"
        )
    for number, run in enumerate(runs):
        if not isinstance(run, Mapping) or not isinstance(run.get("path"), str):
            raise SysbenchError(f"{arena / 'manifest.json'}: field stages.arena.runs[{number}].path is not a path")
        if not Path(run["path"]).is_dir():
            raise SysbenchError(
                f"{arena / 'manifest.json'}: field stages.arena.runs[{number}]: the run {run['path']} is not there"
            )
    return runs


def _replies(records: Mapping[tuple[int, int], GenerationRecord]) -> dict[tuple[int, int], str | None]:
    return {key: record.response for key, record in records.items()}


@dataclass(frozen=True)
class ArenaPages:
    """An arena's page data, read and checked, not yet written: the index and one payload per session."""

    arena: Path
    index: dict[str, Any]
    sessions: dict[int, dict[str, Any]]
    n_battles: int


def load_arena_pages(arena_dir: str | Path) -> ArenaPages:
    """Read everything the arena page shows (manifest, ratings, battles, its runs' sessions and replies)."""
    arena = Path(arena_dir)
    runs = _arena_runs(arena)
    ratings = read_json(arena / RATINGS, dict, "ratings")
    index_of = {str(run["path"]): i for i, run in enumerate(runs)}
    sessions = {s.system_id: s for s in load_run_sessions(RunDir(str(runs[0]["path"])))}
    replies = [_replies(RunDir(str(run["path"])).generations.read()) for run in runs]
    battles: dict[int, dict[tuple[int, int, int], dict[str, Any]]] = {}
    for record in BattleStore(arena).read().values():
        if record.a not in index_of or record.b not in index_of:
            continue  # a run no longer in the arena
        a, b = index_of[record.a], index_of[record.b]
        entry = battles.setdefault(record.system_id, {}).setdefault(
            (a, b, record.turn), {"a": a, "b": b, "turn": record.turn, "records": []}
        )
        entry["records"].append(
            {
                "order": record.order,
                "answer": record.answer,
                "winner": record.winner,
                "reason": record.reason,
                "status": record.status,
                "by": record.by,
            }
        )
    details = {}
    for system_id in sorted(battles):
        session = sessions.get(system_id)
        used = {i for entry in battles[system_id].values() for i in (entry["a"], entry["b"])}
        details[system_id] = {
            "system": session.system_prompt if session is not None else "",
            "turns": {str(t.index): t.user for t in session.turns} if session is not None else {},
            "replies": {
                str(i): {str(turn): replies[i].get((system_id, turn)) for (sid, turn) in replies[i] if sid == system_id}
                for i in sorted(used)
            },
            "battles": sorted(battles[system_id].values(), key=lambda e: (e["turn"], e["a"], e["b"])),
        }
    labels = run_labels([(str(run.get("model")), str(run.get("run"))) for run in runs])  # as the leaderboard's
    index = {
        "title": f"Arena: {arena.name}",
        "runs": [
            {"run": run.get("run"), "model": run.get("model"), "label": label}
            for run, label in zip(runs, labels, strict=True)
        ],
        "ratings": ratings.get("ratings", []),
        "fit": ratings.get("fit", {}),
        "consistency": ratings.get("position_consistency"),
        "sessions": sorted(battles),
        "pairs": sorted({(e["a"], e["b"]) for v in battles.values() for e in v.values()}),
    }
    return ArenaPages(arena, index, details, sum(len(v) for v in battles.values()))


def write_arena_pages(pages: ArenaPages, out: str | Path, progress: bool = True) -> dict[str, Any]:
    """Write the arena page and its data into the site folder ``out`` (checked by the caller); returns counts."""
    from tqdm import tqdm

    out = Path(out)
    total = 0
    for system_id in tqdm(
        sorted(pages.sessions),
        desc="arena sessions",
        unit="session",
        file=sys.stderr,
        disable=None if progress else True,
    ):
        payload = keyed_assignment(SESSIONS_GLOBAL, str(system_id), pages.sessions[system_id])
        write_bytes_atomic(out / "data" / "arena" / f"s{system_id}.js", payload)
        total += len(payload)
    payload = js_assignment(f"window.{INDEX_GLOBAL}", pages.index)
    write_bytes_atomic(out / "data" / "arena" / "index.js", payload)
    total += len(payload)
    folder = resources.files("sysbench_gpu.explore") / "assets"
    for name in ARENA_ASSETS:
        write_bytes_atomic(out / name, (folder / name).read_bytes())
    return {"n_sessions": len(pages.sessions), "n_battles": pages.n_battles, "data_bytes": total}
