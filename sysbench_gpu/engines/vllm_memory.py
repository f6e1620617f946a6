"""How much memory the vllm engine asks for, decided from what is free, and why.

On GPUs vLLM takes ``gpu_memory_utilization`` of the device; its default is read from the
installed vLLM (``EngineArgs``, 0.92 in vLLM 0.32), never copied. On the CPU
build the same fraction is taken of the NUMA node's *total* memory and checked against
what is *available* at start-up, so the fixed 0.9 fails as soon as other processes hold
a few GiB ("Available memory on node 0 (8.27/9.71 GiB) ... is less than desired CPU
memory utilization (0.9, 8.74 GiB)"). Unless the user chose (``VLLM_CPU_KVCACHE_SPACE``,
``kv_cache_memory_bytes`` or ``gpu_memory_utilization``), the CPU engine therefore sizes
the KV cache explicitly from the memory available on the node:

    kv = clamp(CPU_KV_FRACTION x (available - R x (weights + CPU_RESERVE_BYTES)) / R,
               CPU_KV_MIN_BYTES, CPU_KV_MAX_BYTES)

where R is the number of data-parallel replicas that start on the machine at once.

With an explicit KV size vLLM skips the fraction check and only requires the KV cache to
fit in what is available once the weights are loaded. The plan (numbers, source and a
sentence saying why) goes into the manifest through ``describe()``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GIB = 1 << 30
MIB = 1 << 20
# Only where vLLM is not installed and a number is still needed (profile's what-ifs): vLLM 0.32's default.
FALLBACK_GPU_MEMORY_UTILIZATION = 0.92
CPU_KV_FRACTION = 0.5  # of what is left: the rest stays free for activations and other processes
CPU_RESERVE_BYTES = 3 * GIB // 2  # vLLM's front end, engine core and worker each import torch (~0.4 GiB)
CPU_KV_MIN_BYTES = 256 * MIB  # one 8k-token sequence of a small model
# CPU runs are for development: 4 GiB holds ~190k tokens of SmolLM2 or one 32k-token
# sequence of an 8B model; more only slows start-up. VLLM_CPU_KVCACHE_SPACE raises it.
CPU_KV_MAX_BYTES = 4 * GIB


@dataclass(frozen=True)
class UtilizationDefault:
    """vLLM's default ``gpu_memory_utilization`` as the installed vLLM declares it, or why it is unknown."""

    value: float | None
    why: str = ""  # set when value is None

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {"gpu_memory_utilization_default": self.value}
        if self.value is None:
            described["gpu_memory_utilization_default_why"] = self.why
        return described

    def value_or_fallback(self) -> tuple[float, str]:
        """The default, or ``FALLBACK_GPU_MEMORY_UTILIZATION`` with where it comes from."""
        if self.value is not None:
            return self.value, "vllm.engine.arg_utils.EngineArgs default"
        return FALLBACK_GPU_MEMORY_UTILIZATION, f"fallback (vLLM 0.32's default): {self.why}"


@functools.cache
def vllm_default_utilization() -> UtilizationDefault:
    """Read once per process (importing vLLM takes seconds); ``vllm_default_utilization.cache_clear()`` to reread."""
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ModuleNotFoundError as error:
        if error.name is not None and error.name.split(".")[0] == "vllm":
            return UtilizationDefault(None, "vllm is not installed")
        return UtilizationDefault(None, f"vllm does not import: {error}")
    except Exception as error:  # noqa: BLE001 (a broken build fails in many ways; the manifest says which)
        return UtilizationDefault(None, f"vllm does not import: {str(error).splitlines()[0][:200]}")
    found = {f.name: f.default for f in dataclasses.fields(EngineArgs)}.get("gpu_memory_utilization")
    if not isinstance(found, (int, float)) or isinstance(found, bool):
        return UtilizationDefault(None, f"vllm's EngineArgs declares no numeric gpu_memory_utilization ({found!r})")
    return UtilizationDefault(float(found))


@dataclass(frozen=True)
class NodeMemory:
    """Memory of the NUMA node vLLM's CPU worker allocates from (the node of our first allowed CPU)."""

    node: int | None
    total_bytes: int
    available_bytes: int


@dataclass(frozen=True)
class MemoryPlan:
    device: str  # cpu | gpu
    source: str  # auto | VLLM_CPU_KVCACHE_SPACE | kv_cache_memory_bytes | gpu_memory_utilization | default
    engine_args: dict[str, Any]  # what goes to vllm.LLM(...)
    why: str
    facts: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {"device": self.device, "source": self.source, **self.engine_args, **self.facts, "why": self.why}

    def summary(self) -> str:
        """For the log: ``auto, kv_cache_memory_bytes=4.00 GiB``."""
        shown = [f"{k}={_gib(v):.2f} GiB" if k.endswith("_bytes") else f"{k}={v}" for k, v in self.engine_args.items()]
        return ", ".join([self.source, *shown])


def _gib(value: int) -> float:
    return round(value / GIB, 2)


def plan_memory(
    *,
    on_cpu: bool,
    gpu_memory_utilization: float | None,
    kv_cache_memory_bytes: int | None,
    environ: Mapping[str, str],
    node: NodeMemory | None = None,
    weights_bytes: int = 0,
    replicas: int = 1,
    utilization_default: UtilizationDefault | None = None,
) -> MemoryPlan:
    """Decide the memory arguments for ``vllm.LLM``; ``node`` is read only for the CPU auto plan.

    ``utilization_default`` (read from vLLM when None) is only recorded, for the GPU default plan.
    """
    explicit: dict[str, Any] = {}
    if gpu_memory_utilization is not None:
        explicit["gpu_memory_utilization"] = gpu_memory_utilization
    if kv_cache_memory_bytes is not None:
        explicit["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
    if not on_cpu:
        if kv_cache_memory_bytes is not None:
            return MemoryPlan("gpu", "kv_cache_memory_bytes", explicit, "KV cache size as given")
        if gpu_memory_utilization is not None:
            return MemoryPlan("gpu", "gpu_memory_utilization", explicit, "fraction of GPU memory as given")
        # Nothing passed: vLLM applies its own default; the manifest records what that is.
        default = utilization_default or vllm_default_utilization()
        return MemoryPlan("gpu", "default", {}, "vLLM's default share of each GPU", default.describe())
    space = environ.get("VLLM_CPU_KVCACHE_SPACE", "")
    if space != "":
        # vLLM's CPU platform turns it into kv_cache_memory_bytes and it wins over ours.
        return MemoryPlan(
            "cpu",
            "VLLM_CPU_KVCACHE_SPACE",
            explicit,
            f"VLLM_CPU_KVCACHE_SPACE={space} GiB of KV cache, set in the environment",
            {"VLLM_CPU_KVCACHE_SPACE": space},
        )
    if kv_cache_memory_bytes is not None:
        return MemoryPlan("cpu", "kv_cache_memory_bytes", explicit, "KV cache size as given")
    if gpu_memory_utilization is not None:
        return MemoryPlan(
            "cpu",
            "gpu_memory_utilization",
            explicit,
            "fraction of the NUMA node's total memory as given (vLLM's CPU meaning of the flag)",
        )
    node = node or read_node_memory()
    spare = node.available_bytes - replicas * (weights_bytes + CPU_RESERVE_BYTES)
    kv = int(min(max(CPU_KV_FRACTION * spare / replicas, CPU_KV_MIN_BYTES), CPU_KV_MAX_BYTES)) // MIB * MIB
    where = f"NUMA node {node.node}" if node.node is not None else "this machine"
    shared = f" / {replicas} replicas" if replicas > 1 else ""
    why = (
        f"{CPU_KV_FRACTION:g} x ({_gib(node.available_bytes)} GiB available on {where} - {_gib(weights_bytes)} GiB "
        f"weights - {_gib(CPU_RESERVE_BYTES)} GiB reserve){shared}, kept within [{_gib(CPU_KV_MIN_BYTES)}, "
        f"{_gib(CPU_KV_MAX_BYTES)}] GiB; a fixed fraction of the node's total fails when other processes "
        "hold memory"
    )
    facts = {
        "numa_node": node.node,
        "node_total_gib": _gib(node.total_bytes),
        "node_available_gib": _gib(node.available_bytes),
        "weights_gib": _gib(weights_bytes),
        "kv_cache_gib": _gib(kv),
    }
    return MemoryPlan("cpu", "auto", {"kv_cache_memory_bytes": kv}, why, facts)


def read_node_memory() -> NodeMemory:
    """The numbers vLLM's CPU worker checks against (its own reader, cgroup limits included), else /proc/meminfo."""
    try:
        from vllm.utils.cpu_resource_utils import (
            get_allowed_cpu_list,
            get_memory_node_info,
        )

        node = int(get_allowed_cpu_list()[0].numa_node)
        info = get_memory_node_info(node)
        return NodeMemory(node, int(info.total_memory), int(info.available_memory))
    except Exception:  # noqa: BLE001 (older vLLM or an unusual platform: fall back to the whole machine)
        return _proc_meminfo()


def _proc_meminfo(path: str = "/proc/meminfo") -> NodeMemory:
    values: dict[str, int] = {}
    with open(path, encoding="ascii") as handle:
        for line in handle:
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                values[name] = int(parts[0]) * 1024
    return NodeMemory(None, values.get("MemTotal", 0), values.get("MemAvailable", values.get("MemFree", 0)))


def weights_bytes(model_path: str) -> int:
    """Bytes of the weight files of a local model folder (0 for a hub id: unknown before loading)."""
    folder = Path(model_path)
    if not folder.is_dir():
        return 0
    total = 0
    for pattern in ("*.safetensors", "*.bin", "*.pt"):
        for weight in folder.glob(pattern):
            with contextlib.suppress(OSError):
                total += weight.stat().st_size
    return total


def on_cpu_platform() -> bool:
    """True on vLLM's CPU build (``current_platform.is_cpu()``)."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # noqa: BLE001 (no platform detected: treat as GPU, vLLM's usual default)
        return False
