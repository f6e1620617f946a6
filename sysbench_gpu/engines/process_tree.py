"""Ending a replica with everything it started: its process group and its descendants, from ``/proc``.

A replica's engine starts processes of its own (vLLM's engine core, its tensor-parallel
workers). Killing the replica's process alone would leave those holding GPUs, so a
replica is ended as a tree: every process in its process group (a Ray 2.60 worker leads
its own group, and children stay in it unless they leave) and every descendant still alive.
After the replica itself has died its children are re-parented, but they keep its
group; Linux never reuses a process id while a group of that id exists, so the group
still names only them. Linux only (elsewhere nothing is found and nothing is killed).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")
# A Ray worker names itself "ray::<Class>" (our replicas: "ray::ReplicaActor"); anything else is not ours.
RAY_TITLE = "ray::"


def process_table(proc: Path = PROC) -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every process that can be read."""
    table: dict[int, tuple[int, int]] = {}
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3:
            table[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return table


def descendants(pid: int, table: dict[int, tuple[int, int]] | None = None) -> list[int]:
    """Every process below ``pid`` (children, grandchildren, ...), parents before children."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        for child in children.get(current, []):
            found.append(child)
            frontier.append(child)
    return found


def command_line(pid: int, proc: Path = PROC) -> str | None:
    try:
        return (proc / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None


def replica_processes(pid: int, pgid: int, table: dict[int, tuple[int, int]] | None = None) -> list[int]:
    """The replica ``pid``, its group ``pgid`` (where it leads one) and its descendants; [] where ``pid`` is not ours.

    A live ``pid`` must still carry a Ray worker's title, else its id was reused and nothing is returned.
    The group is taken only where the replica was its leader (``pgid == pid``) and it is not this
    process's own group: a worker that shares a group with others (Ray's daemons, this driver) is
    ended with its descendants alone.
    """
    table = process_table() if table is None else table
    if pid in table:
        title = command_line(pid)
        if title and not title.startswith(RAY_TITLE):  # empty: a zombie, whose id cannot have been reused
            return []
    own_group = pgid == pid and pgid > 1 and pgid != os.getpgid(0)
    members = [p for p, (_, group) in table.items() if group == pgid] if own_group else []
    tree = descendants(pid, table) if pid in table else []
    ordered = ([pid] if pid in table else []) + [p for p in dict.fromkeys(members + tree) if p != pid]
    return [p for p in ordered if p != os.getpid()]


def kill_replica_processes(pid: int, pgid: int) -> list[int]:
    """SIGKILL a replica's whole tree (see ``replica_processes``); returns the ids signalled.

    Stopped first, so that nothing forks a new child between the listing and the kill.
    """
    targets = replica_processes(pid, pgid)
    _signal(targets, signal.SIGSTOP)
    targets = list(dict.fromkeys(targets + replica_processes(pid, pgid)))
    _signal(targets, signal.SIGKILL)
    return targets


def _signal(pids: Iterable[int], sig: signal.Signals) -> None:
    for target in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(target, sig)
