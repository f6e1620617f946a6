"""Set-ups that move judge records around: a ``--rejudge`` copy, and ``--retry-unparsed``.

Both run under the judge's stage lock of the directory they write, and both can
be interrupted at any point and rerun:

- :func:`prepare_rejudge` writes the copy's manifest *first* (``rejudged_from``
  with ``setup: started``), then the sessions and generations, then the source's
  stage sections and ``setup: complete``. A rerun finds the manifest and finishes
  what is missing, instead of refusing a folder that "exists and is not empty".
- :func:`set_aside_unparsed` appends the moved records to ``judgments.retried.jsonl``
  first and then replaces ``judgments.jsonl`` atomically, so a crash in between
  loses nothing (at worst a record is in both files).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from sysbench_gpu.benchmarks.registry import load_run_sessions, save_run_sessions
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.jsonl import append_lines, complete_lines
from sysbench_gpu.core.rundir import GENERATIONS, MANIFEST, RunDir, write_bytes_atomic
from sysbench_gpu.core.sessions import SessionIds, select_sessions

RETRIED = "judgments.retried.jsonl"


def _setup_debris(path: Path) -> bool:
    """What an interrupted set-up can leave before its manifest exists: lock files, temporary files."""
    return path.name.startswith(".") and path.name.endswith(".lock") or path.name.endswith(".tmp")


def prepare_rejudge(
    source: RunDir, out: Path, limit: int | None, system_ids: SessionIds | Sequence[int] | None = None
) -> RunDir:
    """Copy a run's sessions and generations (``system_ids``, then the first ``limit``) into a new run dir.

    Calling it again on the same ``out`` checks that the copy matches and finishes
    an interrupted set-up; an ``out`` holding other generations is an error.
    """
    source.require()
    sessions = load_run_sessions(source)
    chosen = select_sessions(sessions, system_ids, limit, source=source.sessions_path)
    ids = {s.system_id for s in chosen}
    generations = {k: r for k, r in source.generations.read().items() if r.system_id in ids}
    if not generations:
        raise SysbenchError(f"{source.path / GENERATIONS}: no generations to re-judge")
    target = RunDir(out)
    src_manifest = source.read_manifest()
    origin = {
        "path": str(source.path.resolve()),
        "sessions": len(chosen),
        "turns": len(generations),
        "created": src_manifest.get("created"),
    }
    if (target.path / MANIFEST).is_file():
        rejudged = target.read_manifest().get("rejudged_from")
        finished = not isinstance(rejudged, dict) or rejudged.get("setup", "complete") == "complete"
        have = target.generations.read()
        foreign = [k for k, r in have.items() if k not in generations or generations[k].response != r.response]
        if foreign or (finished and set(have) != set(generations)):
            raise SysbenchError(
                f"{target.path}: already a run directory with other generations than {source.path}; choose a new --out"
            )
        if finished:
            return target
    else:
        leftovers = (
            sorted(p.name for p in target.path.iterdir() if not _setup_debris(p)) if target.path.is_dir() else []
        )
        if leftovers:
            raise SysbenchError(
                f"{target.path}: exists and is not empty ({', '.join(leftovers[:3])}); choose a new --out"
            )
        target.path.mkdir(parents=True, exist_ok=True)
        # The manifest first: from here on the folder says what it is, and a crash resumes.
        target.update_manifest(
            rejudged_from={**origin, "setup": "started"},
            **{k: src_manifest[k] for k in ("dataset",) if k in src_manifest},
        )
        have = {}
    save_run_sessions(target, chosen)  # SysBench as upstream's JSON array, MT-Eval as JSON Lines
    missing = [generations[k] for k in sorted(generations) if k not in have]
    target.generations.append(missing)
    for stage, section in src_manifest.get("stages", {}).items():
        if stage != "judge":
            target.update_manifest(stage=stage, **section)
    target.update_manifest(rejudged_from={**origin, "setup": "complete"})
    return target


def unparsed_keys(run: RunDir, system_ids: set[int]) -> set[tuple[int, int]]:
    """The ``unparsed`` records of these sessions: what ``--retry-unparsed`` asks again."""
    return {k for k, r in run.judgments.read().items() if r.parse_status == "unparsed" and r.system_id in system_ids}


def set_aside_unparsed(run: RunDir, keys: set[tuple[int, int]]) -> int:
    """Move the records of ``keys`` out of judgments.jsonl into RETRIED (see the module doc)."""
    path = run.judgments.path
    if not keys or not path.is_file():
        return 0
    kept: list[bytes] = []
    moved: list[bytes] = []
    for _, line in complete_lines(path.read_bytes()):
        obj = json.loads(line)  # validated by the caller's read of the store
        (moved if (obj.get("system_id"), obj.get("turn")) in keys else kept).append(line + b"\n")
    if not moved:
        return 0
    append_lines(run.path / RETRIED, moved)
    write_bytes_atomic(path, b"".join(kept))
    return len(moved)
