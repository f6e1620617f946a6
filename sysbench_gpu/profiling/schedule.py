"""Bounds of a run's calls as the engine ran them, and what-if schedules of the same requests.

Pure Python on top of :mod:`sysbench_gpu.profiling.roofline`. A *segment* is work that runs
concurrently (one batch); its number of forward passes is what the schedule decides:

* **as run**: the hf engine sorts a call's prompts by length and runs batches of
  ``batch_size`` one after another; vLLM batches a whole call (per data-parallel
  replica). A batch needs as many forwards as its longest reply has tokens. No memory
  cap: this is a strict lower bound, compared with the measured time.
* **what-ifs** (estimates; docs/profile.md): continuous batching, with at most
  ``slots`` sequences in flight, where ``slots`` is what the device's memory holds of
  KV after the weights (when the spec gives the memory):

  - *turn-synchronous*: each turn one segment; its forwards are the makespan of the
    turn's replies on the slots, in input order;
  - *one session at a time*: every request its own segment (upstream's single client);
  - *N client threads*: each thread sends one session's turns one after another and the
    server batches whatever is in flight, so the whole run is one segment whose
    forwards are the makespan of the sessions (each the sum of its replies' tokens) on
    min(N, slots) threads;
  - *another layout*: the turn-synchronous schedule on other tp/pp/dp sizes; with dp the
    sessions go to replicas round-robin (sticky, as the vllm engine places them).
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sysbench_gpu.engines.vllm_memory import FALLBACK_GPU_MEMORY_UTILIZATION
from sysbench_gpu.profiling.bounds import SegmentBound, concurrent, segment_bound, sequential
from sysbench_gpu.profiling.inputs import Request, RunCall
from sysbench_gpu.profiling.roofline import (
    DeviceSpec,
    Layout,
    ModelShape,
    kv_replication,
    total_work,
)

DEFAULT_THREADS = 20


@dataclass(frozen=True)
class Hardware:
    """The model on a device in a layout: what every bound needs."""

    shape: ModelShape
    device: DeviceSpec
    layout: Layout
    weight_bytes: float  # per parameter
    kv_bytes: float  # per cached element
    # Share of device memory for weights + KV. The stage passes vLLM's own default (engines.vllm_memory).
    memory_utilization: float = FALLBACK_GPU_MEMORY_UTILIZATION

    def with_layout(self, layout: Layout) -> Hardware:
        return Hardware(self.shape, self.device, layout, self.weight_bytes, self.kv_bytes, self.memory_utilization)

    def bound(self, requests: Sequence[Request], forwards: int, replicas: int = 1) -> SegmentBound:
        work = total_work(self.shape, (r.tokens for r in requests), self.kv_bytes)
        return segment_bound(self.shape, work, forwards, self.device, self.layout, self.weight_bytes, replicas)

    def kv_slots(self, requests: Sequence[Request]) -> int | None:
        """Sequences whose KV fits beside the weights on one replica (mean final context); None when unknown."""
        if self.device.memory_bytes is None or not requests:
            return None
        budget = (
            self.layout.gpus_per_replica * self.device.memory_bytes * self.memory_utilization
            - self.shape.total_params * self.weight_bytes
        )
        per_token = self.shape.kv_elements_per_token() * self.kv_bytes * kv_replication(self.shape, self.layout.tp)
        mean_context = sum(r.tokens.prompt + r.tokens.output for r in requests) / len(requests)
        if budget <= 0:
            return 0
        return max(1, int(budget // (per_token * max(1.0, mean_context))))


def makespan(jobs: Iterable[int], slots: int | None) -> int:
    """Forwards to run ``jobs`` (forwards each) in order on ``slots`` parallel slots (None: unlimited)."""
    jobs = list(jobs)
    if not jobs:
        return 0
    if slots is None or slots >= len(jobs):
        return max(jobs)
    free = [0] * max(1, slots)
    for job in jobs:
        start = heapq.heappop(free)
        heapq.heappush(free, start + job)
    return max(free)


# ---------------------------------------------------------------- the run as it ran


def call_bound(call: RunCall, hw: Hardware, engine: str | None, batch_size: int | None) -> SegmentBound:
    """Strict lower bound of one call, batched as the engine batches it."""
    requests = call.requests
    if not requests:
        return hw.bound([], 0)
    if engine == "hf":
        # HFEngine.chat: stable sort by prompt length, batches of batch_size one after another.
        ordered = sorted(requests, key=lambda r: r.tokens.prompt)
        size = batch_size or len(ordered)
        batches = [ordered[i : i + size] for i in range(0, len(ordered), size)]
        return sequential([hw.bound(b, max(r.tokens.forwards for r in b)) for b in batches])
    dp = hw.layout.dp
    if dp > 1:
        replicas: dict[int, list[Request]] = defaultdict(list)
        for request in requests:
            replicas[request.replica if request.replica is not None else -1].append(request)
        if -1 not in replicas:
            return concurrent([hw.bound(group, max(r.tokens.forwards for r in group)) for group in replicas.values()])
        # Unknown split: all GPUs share the work, one replica runs the longest reply's forwards.
        return hw.bound(requests, max(r.tokens.forwards for r in requests), replicas=dp)
    return hw.bound(requests, max(r.tokens.forwards for r in requests))


# ---------------------------------------------------------------- what-ifs


@dataclass
class WhatIf:
    name: str
    description: str
    layout: Layout
    bound: SegmentBound | None
    slots: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self, output_tokens: int, reference_s: float | None) -> dict[str, Any]:
        b = self.bound
        return {
            "name": self.name,
            "description": self.description,
            "layout": self.layout.label(),
            "gpus": self.layout.gpus,
            "slots": self.slots,
            "bound_s": b.bound_s if b else None,
            "bound_by": b.bound_by if b else None,
            "forwards": b.forwards if b else None,
            "compute_s": b.compute_s if b else None,
            "memory_s": b.memory_s if b else None,
            "flops": b.work.flops if b else None,
            "bytes": (b.weight_bytes + b.kv_bytes) if b else None,
            "output_tokens_per_s": output_tokens / b.bound_s if b and b.bound_s > 0 else None,
            "relative_to_turn_synchronous": (b.bound_s / reference_s) if b and reference_s else None,
            "estimate": True,
            "notes": list(self.notes),
        }


def _by_session(requests: Iterable[Request]) -> dict[int, list[Request]]:
    sessions: dict[int, list[Request]] = defaultdict(list)
    for request in requests:
        sessions[request.system_id].append(request)
    for turns in sessions.values():
        turns.sort(key=lambda r: r.turn)
    return sessions


def _replica_of(session_ids: Sequence[int], dp: int) -> dict[int, int]:
    """Sticky round-robin placement of sessions on replicas, in session order of first appearance."""
    return {sid: index % dp for index, sid in enumerate(session_ids)}


def _slot_note(slots: int | None, wanted: int, what: str) -> list[str]:
    if slots is None:
        return ["device memory unknown: no cap on sequences in flight"]
    if slots == 0:
        return ["the weights alone exceed the memory of a replica"]
    if slots < wanted:
        return [f"KV memory holds about {slots} sequences in flight, fewer than the {wanted} {what}"]
    return []


def turn_synchronous(calls: Sequence[RunCall], hw: Hardware, name: str = "turn-synchronous") -> WhatIf:
    """Each turn one batch on continuous batching, capped by KV memory; replicas round-robin by session."""
    requests = [r for call in calls for r in call.requests]
    session_ids = list(dict.fromkeys(r.system_id for r in requests))
    placement = _replica_of(session_ids, hw.layout.dp)
    per_replica_slots = hw.kv_slots(requests)
    if per_replica_slots == 0:
        return WhatIf(name, _DESCRIPTIONS["turn-sync"], hw.layout, None, 0, _slot_note(0, 0, ""))
    segments = []
    widest = 0
    for call in calls:
        groups: dict[int, list[Request]] = defaultdict(list)
        for request in call.requests:
            groups[placement[request.system_id]].append(request)
        widest = max([widest] + [len(g) for g in groups.values()])
        parts = [
            hw.bound(group, makespan((r.tokens.forwards for r in group), per_replica_slots))
            for group in groups.values()
        ]
        if parts:
            segments.append(concurrent(parts))
    notes = _slot_note(per_replica_slots, widest, "requests of a turn on one replica")
    return WhatIf(name, _DESCRIPTIONS["turn-sync"], hw.layout, sequential(segments), per_replica_slots, notes)


def one_session_at_a_time(calls: Sequence[RunCall], hw: Hardware) -> WhatIf:
    """Every request alone, one after another (one replica; data parallelism cannot help one stream)."""
    single = hw.with_layout(Layout(tp=hw.layout.tp, pp=hw.layout.pp, dp=1))
    requests = [r for call in calls for r in call.requests]
    if single.kv_slots(requests) == 0:
        return WhatIf("one session at a time", _DESCRIPTIONS["serial"], single.layout, None, 0, _slot_note(0, 0, ""))
    ordered = [r for turns in _by_session(requests).values() for r in turns]
    segments = [single.bound([r], r.tokens.forwards) for r in ordered]
    return WhatIf("one session at a time", _DESCRIPTIONS["serial"], single.layout, sequential(segments), 1)


def client_threads(calls: Sequence[RunCall], hw: Hardware, threads: int = DEFAULT_THREADS) -> WhatIf:
    """N threads, each sending one session's turns in turn; the server batches what is in flight."""
    name = f"{threads} client threads"
    requests = [r for call in calls for r in call.requests]
    sessions = _by_session(requests)
    placement = _replica_of(list(sessions), hw.layout.dp)
    slots = hw.kv_slots(requests)
    if slots == 0:
        return WhatIf(name, _DESCRIPTIONS["threads"], hw.layout, None, 0, _slot_note(0, 0, ""))
    per_replica_threads = max(1, math.ceil(threads / hw.layout.dp))
    in_flight = per_replica_threads if slots is None else min(per_replica_threads, slots)
    groups: dict[int, list[list[Request]]] = defaultdict(list)
    for sid, turns in sessions.items():
        groups[placement[sid]].append(turns)
    parts = []
    for group in groups.values():
        session_forwards = [sum(r.tokens.forwards for r in turns) for turns in group]
        flat = [r for turns in group for r in turns]
        parts.append(hw.bound(flat, makespan(session_forwards, in_flight)))
    notes = _slot_note(slots, per_replica_threads, "threads per replica")
    return WhatIf(
        name, _DESCRIPTIONS["threads"].replace("N ", f"{threads} "), hw.layout, concurrent(parts), in_flight, notes
    )


_DESCRIPTIONS = {
    "turn-sync": "every turn of all sessions in one continuously batched call, turns one after another",
    "serial": "one request at a time, sessions one after another (a single client)",
    "threads": "N client threads against a server, each sending one session's turns in turn; the server batches "
    "what is in flight",
}


def what_ifs(
    calls: Sequence[RunCall],
    hw: Hardware,
    threads: int = DEFAULT_THREADS,
    layouts: Sequence[Layout] = (),
) -> list[WhatIf]:
    """The standard what-ifs on the base layout, then turn-synchronous and threads on each extra layout."""
    results = [turn_synchronous(calls, hw), one_session_at_a_time(calls, hw), client_threads(calls, hw, threads)]
    for layout in layouts:
        other = hw.with_layout(layout)
        results.append(turn_synchronous(calls, other, name=f"turn-synchronous, {layout.label()}"))
        threaded = client_threads(calls, other, threads)
        threaded.name = f"{threads} client threads, {layout.label()}"
        results.append(threaded)
    return results
