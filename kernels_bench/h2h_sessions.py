"""The head to head's sessions: N distinct sessions in upstream's schema, drawn in a seeded order.

Every way of ``bench_vs_upstream.py`` (and ``gpu_check.py``'s) reads the one file written here,
so the prompts are the same byte for byte. No two sessions share a system message: a workload of
copies lets a prefix cache serve one copy's prompts from another's, which SysBench's 500 distinct
sessions never allow. The default data (``auto``) is SysBench's own file where it is found
offline, else the packaged demo set; when the data has fewer usable sessions than asked for,
every session's system message starts with its own number (``"7: You are ..."``), so the
sessions differ from their first token on and no KV block of one prompt equals another's.

Upstream shuffles its sessions before its threads take them (``random.shuffle`` in
``eval_system_bench.py``, unseeded); here the order is shuffled with ``--seed``, so a run can
be repeated.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.registry import load_dataset
from sysbench_gpu.benchmarks.sysbench.data import OFFICIAL_FILENAME
from sysbench_gpu.core.sessions import Session

REPO_ROOT = Path(__file__).resolve().parent.parent
DEMO_FILE = REPO_ROOT / "sysbench_gpu" / "demo" / "demo_sessions.json"
AUTO = "auto"


def sysbench_candidates(cwd: Path | None = None) -> list[Path]:
    """Where SysBench's own sessions may lie offline, in the order they are tried.

    The shared data beside the checkout (``../shared/sysbench/sessions.json``), then the file
    ``sysbench-gpu data download`` writes by default (``data/`` under the working folder, then
    under the checkout).
    """
    cwd = cwd or Path.cwd()
    return [
        REPO_ROOT.parent / "shared" / "sysbench" / "sessions.json",
        cwd / "data" / OFFICIAL_FILENAME,
        REPO_ROOT / "data" / OFFICIAL_FILENAME,
    ]


def resolve_source(source: str, candidates: list[Path] | None = None) -> tuple[Path, str]:
    """The file to read and what it is: ``sysbench`` (found by ``auto``), ``demo`` or ``file``."""
    if source == AUTO:
        for candidate in sysbench_candidates() if candidates is None else candidates:
            if candidate.is_file():
                return candidate, "sysbench"
        return DEMO_FILE, "demo"
    if source == "demo":
        return DEMO_FILE, "demo"
    return Path(source), "file"


@dataclass
class WrittenSessions:
    sessions: list[Session]
    data: dict[str, Any]  # what was read and how the sessions were made: for the report

    @property
    def distinct(self) -> int:
        return distinct_sessions(self.sessions)


def distinct_sessions(sessions: list[Session]) -> int:
    """Sessions with a system message no other session has (a shared one counts once)."""
    return len({session.system_prompt for session in sessions})


def write_sessions(
    source: str, count: int, turns: int, path: Path, seed: int = 0, candidates: list[Path] | None = None
) -> WrittenSessions:
    """``count`` distinct sessions of ``source`` cut to ``turns`` turns, renumbered 1..count, in upstream's schema.

    The usable sessions (those with ``turns`` turns) are shuffled with ``seed``; the first ``count``
    are taken in that order, cycling when there are fewer, and then every system message is tagged
    with its session's number so that none repeats.
    """
    file, kind = resolve_source(source, candidates)
    raw = _raw_sessions(file)
    usable = [entry for entry in raw if sum(m["role"] == "user" for m in entry["messages"]) >= turns]
    if not usable:
        raise SystemExit(f"bench_vs_upstream: no session of {file} has {turns} turns")
    order = list(range(len(usable)))
    random.Random(seed).shuffle(order)
    tagged = count > len(usable)
    sessions, source_ids = [], []
    for index in range(count):
        original = usable[order[index % len(usable)]]
        source_ids.append(original.get("system_id"))
        entry = cut_to_turns(json.loads(json.dumps(original)), turns)
        entry["system_id"] = index + 1
        if tagged:
            tag_system_message(entry, f"{index + 1}: ")
        sessions.append(entry)
    path.write_text(json.dumps(sessions, ensure_ascii=False, indent=1), encoding="utf-8")
    loaded = load_dataset(str(path)).sessions
    data = {
        "source": kind,
        "file": str(file),
        "sha256": hashlib.sha256(file.read_bytes()).hexdigest(),
        "usable_sessions": len(usable),
        "seed": seed,
        "order": "shuffled with the seed (upstream shuffles unseeded)",
        "source_system_ids": source_ids,
        "tagged": tagged,
        "tag": "'<session number>: ' before every system message" if tagged else None,
        "written": str(path),
    }
    return WrittenSessions(loaded, data)


def cut_to_turns(entry: dict[str, Any], turns: int) -> dict[str, Any]:
    """A session's first ``turns`` turns, and the criteria of those turns only."""
    kept, users = [], []
    for message in entry["messages"]:
        if message["role"] == "user":
            if len(users) == turns:
                break
            users.append(message["content"])
        kept.append(message)
    entry["messages"] = kept
    if isinstance(entry.get("prompt_infos"), dict):
        entry["prompt_infos"] = {user: entry["prompt_infos"][user] for user in users if user in entry["prompt_infos"]}
    return entry


def tag_system_message(entry: dict[str, Any], tag: str) -> None:
    """Put ``tag`` before the session's system message, in both places upstream's schema holds it."""
    if isinstance(entry.get("system_prompt"), str):
        entry["system_prompt"] = tag + entry["system_prompt"]
    for message in entry["messages"]:
        if message["role"] == "system":
            message["content"] = tag + message["content"]
            break


def _raw_sessions(file: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise SystemExit(f"bench_vs_upstream: cannot read {file}: {error}") from None
    if not isinstance(data, list):
        raise SystemExit(f"bench_vs_upstream: {file}: expected upstream's list of sessions")
    return data
