"""Time bounds from roofline work: one segment on one device layout, and segments in sequence or side by side.

A segment of work that runs concurrently on a device takes at least
``max(FLOPs / peak FLOP/s, bytes / bandwidth)`` (and, with pipeline stages, the chain of
forwards through every stage); segments that must run one after another (turns of a
turn-synchronous run, batches of the hf engine) add up; replicas side by side take the
slowest one's time. The FLOPs and bytes come from :mod:`sysbench_gpu.profiling.roofline`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.profiling.roofline import DeviceSpec, Layout, ModelShape, Work, kv_replication


@dataclass
class PhaseBound:
    flops: float
    bytes: float
    compute_s: float
    memory_s: float

    @property
    def bound_by(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"

    def to_json(self) -> dict[str, Any]:
        return {
            "flops": self.flops,
            "bytes": self.bytes,
            "compute_s": self.compute_s,
            "memory_s": self.memory_s,
            "bound_by": self.bound_by,
        }


@dataclass
class SegmentBound:
    """Lower bound on the time of some work, with the terms it came from.

    ``bound_s`` is ``max(compute_s, memory_s, latency_s)`` for work that runs
    concurrently, the sum of the parts' bounds for segments that run one after another,
    and the slowest part's for replicas side by side.
    """

    work: Work
    forwards: int
    compute_s: float
    memory_s: float
    latency_s: float  # the longest chain of forwards, each through every pipeline stage in turn
    prefill: PhaseBound
    decode: PhaseBound
    weight_bytes: float
    kv_bytes: float
    bound_s: float
    bound_by: str  # compute | memory
    parts: list[SegmentBound] = field(default_factory=list)


def segment_bound(
    shape: ModelShape,
    work: Work,
    forwards: int,
    device: DeviceSpec,
    layout: Layout,
    weight_bytes_per_param: float,
    replicas: int = 1,
) -> SegmentBound:
    """Time bound of ``work`` done concurrently in ``forwards`` forward passes on one replica of ``layout``.

    The replica's tp * pp GPUs share compute, weight reads and KV traffic; with pipeline
    parallelism the ``forwards`` of the longest sequence still pass every stage one after
    another, which gives ``latency_s``. ``replicas > 1`` spreads the work over data-parallel
    replicas when the split is unknown: at least one replica runs all ``forwards``.
    """
    gpus = layout.gpus_per_replica * replicas
    weights = shape.params_read_per_forward * weight_bytes_per_param
    kv_factor = kv_replication(shape, layout.tp)
    weight_traffic = forwards * weights
    kv_traffic = work.kv_bytes * kv_factor
    compute_s = work.flops / (gpus * device.peak_flops)
    memory_s = (weight_traffic + kv_traffic) / (gpus * device.memory_bandwidth)
    # Never above memory_s with one replica and no pipeline; it binds with pp > 1 or an unknown dp split.
    latency_s = forwards * weights / (layout.tp * device.memory_bandwidth)

    def phase(flops: float, nbytes: float) -> PhaseBound:
        return PhaseBound(flops, nbytes, flops / (gpus * device.peak_flops), nbytes / (gpus * device.memory_bandwidth))

    return SegmentBound(
        work=work,
        forwards=forwards,
        compute_s=compute_s,
        memory_s=memory_s,
        latency_s=latency_s,
        prefill=phase(work.prefill_flops, min(1, forwards) * weights + work.prefill_kv_bytes * kv_factor),
        decode=phase(work.decode_flops, max(0, forwards - 1) * weights + work.decode_kv_bytes * kv_factor),
        weight_bytes=weight_traffic,
        kv_bytes=kv_traffic,
        bound_s=max(compute_s, memory_s, latency_s),
        bound_by="compute" if compute_s >= max(memory_s, latency_s) else "memory",
    )


def _merged_work(parts: Sequence[SegmentBound]) -> Work:
    work = Work()
    for part in parts:
        work.add(part.work)
    return work


def _summed_phase(parts: Sequence[SegmentBound], name: str) -> PhaseBound:
    values = [
        sum(getattr(getattr(p, name), attr) for p in parts) for attr in ("flops", "bytes", "compute_s", "memory_s")
    ]
    return PhaseBound(*values)


def sequential(parts: Sequence[SegmentBound]) -> SegmentBound:
    """Segments that run one after another: times, work and bytes add up.

    ``bound_by`` is the resource that bounds the larger share of the summed time.
    """
    if not parts:
        raise SysbenchError("no work to bound")
    share = {"compute": 0.0, "memory": 0.0}
    for part in parts:
        share[part.bound_by] += part.bound_s
    return SegmentBound(
        work=_merged_work(parts),
        forwards=sum(p.forwards for p in parts),
        compute_s=sum(p.compute_s for p in parts),
        memory_s=sum(p.memory_s for p in parts),
        latency_s=sum(p.latency_s for p in parts),
        prefill=_summed_phase(parts, "prefill"),
        decode=_summed_phase(parts, "decode"),
        weight_bytes=sum(p.weight_bytes for p in parts),
        kv_bytes=sum(p.kv_bytes for p in parts),
        bound_s=sum(p.bound_s for p in parts),
        bound_by="compute" if share["compute"] > share["memory"] else "memory",
        parts=list(parts),
    )


def concurrent(parts: Sequence[SegmentBound]) -> SegmentBound:
    """Segments that run side by side on separate replicas: the slowest one bounds the time."""
    if not parts:
        raise SysbenchError("no work to bound")
    slowest = max(parts, key=lambda p: p.bound_s)
    return SegmentBound(
        work=_merged_work(parts),
        forwards=max(p.forwards for p in parts),
        compute_s=slowest.compute_s,
        memory_s=slowest.memory_s,
        latency_s=slowest.latency_s,
        prefill=slowest.prefill,
        decode=slowest.decode,
        weight_bytes=sum(p.weight_bytes for p in parts),
        kv_bytes=sum(p.kv_bytes for p in parts),
        bound_s=slowest.bound_s,
        bound_by=slowest.bound_by,
        parts=list(parts),
    )
