"""How many threads torch should use on a CPU: the allowed cores that other work is not using.

torch starts one OpenMP thread per core. When another process keeps a core busy, the thread
on that core gets half of it, and every parallel operation waits for it at its barrier: the
demo's generation then took 2.9 times as long with one of two cores busy (66.8 s against
23.3 s idle), while one thread on the free core took 30.1 s. So the hf engine on a CPU
samples the cores for a moment at start and uses the idle ones; an explicit
``OMP_NUM_THREADS`` or ``cpu_threads`` wins.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

BUSY_SHARE = 0.5  # a core busier than this over the sample is taken by other work
SAMPLE_S = 0.3


@dataclass(frozen=True)
class ThreadChoice:
    threads: int | None  # None: leave torch's own choice
    why: str


def read_cpu_times(stat: Path = Path("/proc/stat")) -> dict[int, tuple[int, int]]:
    """Per core: (busy jiffies, total jiffies) from /proc/stat; empty where it cannot be read."""
    times: dict[int, tuple[int, int]] = {}
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return times
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or not name[3:].isdigit():
            continue
        values = [int(v) for v in fields]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        times[int(name[3:])] = (sum(values) - idle, sum(values))
    return times


def busy_cores(
    cores: set[int],
    read: Callable[[], dict[int, tuple[int, int]]] = read_cpu_times,
    sample_s: float = SAMPLE_S,
) -> set[int] | None:
    """The cores of ``cores`` busier than BUSY_SHARE over ``sample_s``; None where it cannot tell."""
    before = read()
    time.sleep(sample_s)
    after = read()
    busy: set[int] = set()
    for core in cores:
        if core not in before or core not in after:
            return None
        work = after[core][0] - before[core][0]
        total = after[core][1] - before[core][1]
        if total > 0 and work / total > BUSY_SHARE:
            busy.add(core)
    return busy


def choose_cpu_threads(
    requested: int | None,
    environ: Mapping[str, str] = os.environ,
    allowed: Callable[[], set[int]] = lambda: os.sched_getaffinity(0),
    measure: Callable[[set[int]], set[int] | None] = busy_cores,
) -> ThreadChoice:
    """Threads for torch on this CPU, and why (for the manifest)."""
    if requested is not None:
        return ThreadChoice(requested, "cpu_threads as given")
    if environ.get("OMP_NUM_THREADS"):
        return ThreadChoice(None, f"OMP_NUM_THREADS={environ['OMP_NUM_THREADS']} from the environment")
    cores = allowed()
    busy = measure(cores)
    if busy is None:
        return ThreadChoice(None, "torch's default (core load unreadable)")
    free = max(1, len(cores) - len(busy))
    return ThreadChoice(free, f"{free} of {len(cores)} allowed cores idle at start (busy: over {BUSY_SHARE:.0%})")
