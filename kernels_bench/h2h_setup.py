"""The head to head's settings, chosen once for all three ways, and the records each way leaves.

One scheduler budget (``vllm serve``'s own on this device unless given: upstream runs
``vllm serve`` with its defaults, and vLLM grants ``LLM(...)`` a larger one), one KV-cache
size and one dtype go to every way (``Budget``). ``h2h_settings`` reads back what each
engine really ran with.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sysbench_gpu.core.sessions import Session

METHODS = ("upstream", "in_process", "server")
DEFAULT_THREADS = 20  # upstream's client pool
TIMED = "first request to last reply"
# Where vLLM cannot be imported (an hf-only machine): vLLM 0.32's `vllm serve` budget on its CPU build.
FALLBACK_BUDGET = (2048, 128)


@dataclass
class MethodResult:
    name: str  # upstream | in_process | server
    wall_s: float  # first request to last reply
    turns: int
    output_tokens: int
    prompt_tokens: int
    cached_prompt_tokens: int | None  # None: the engine did not report prefix-cache hits
    startup_s: float | None = None  # server ready / engine load, not part of wall_s
    concurrency: int | None = None
    replies: dict[tuple[int, int], str] = field(default_factory=dict, repr=False)
    engine_calls_s: float | None = None  # (b), (c): the sum of the engine calls alone, for reference
    engine_settings: dict[str, Any] = field(default_factory=dict)
    engine_settings_source: dict[str, str] = field(default_factory=dict)

    def row(self, upstream_wall_s: float | None) -> dict[str, Any]:
        return {
            "name": self.name,
            "wall_s": round(self.wall_s, 3),
            "timed": TIMED,
            "output_tokens": self.output_tokens,
            "turns": self.turns,
            "output_tok_s": round(self.output_tokens / self.wall_s, 1) if self.wall_s > 0 else None,
            "ratio_to_upstream": round(upstream_wall_s / self.wall_s, 3) if upstream_wall_s and self.wall_s else None,
            "prompt_tokens": self.prompt_tokens,
            "prefix_cache_hit_rate": (
                round(self.cached_prompt_tokens / self.prompt_tokens, 3)
                if self.cached_prompt_tokens is not None and self.prompt_tokens
                else None
            ),
            "engine_calls_s": None if self.engine_calls_s is None else round(self.engine_calls_s, 3),
            "startup_s": None if self.startup_s is None else round(self.startup_s, 1),
            "concurrency": self.concurrency,
            "engine_settings": self.engine_settings,
            "engine_settings_source": self.engine_settings_source,
        }


@dataclass
class Budget:
    """The engine settings every way is given, chosen once, and where each came from."""

    max_num_batched_tokens: int
    max_num_seqs: int
    kv_cache_memory_bytes: int | None  # None: the engine's own default (recorded as read back)
    dtype: str | None  # None: the engine's "auto" (the weights' dtype), the same for every way
    sources: dict[str, str] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "dtype": self.dtype,
            "sources": self.sources,
        }


@dataclass
class Setup:
    engine: str  # vllm | hf
    model: str  # as given (name or path): what (b) loads
    model_path: str  # the folder the server loads
    sessions: list[Session]
    data_file: Path
    turns: int
    max_tokens: int
    threads: int
    server_concurrency: int
    work_dir: Path
    tensor_parallel_size: int = 1
    device: str | None = None  # hf
    dtype: str | None = None  # as given; the budget holds what every way gets
    ready_timeout_s: float = 900.0
    methods: tuple[str, ...] = METHODS
    budget: Budget | None = None  # None: chosen by choose_budget when the ways start
    data: dict[str, Any] = field(default_factory=dict)  # what write_sessions read


def serve_batch_defaults(world_size: int) -> tuple[int, int, str]:
    """``vllm serve``'s own scheduler budget on this device (vLLM picks it by entry point), and whence.

    Upstream runs ``vllm serve`` with its defaults; giving the same budget to every way keeps (a)
    as upstream runs it and takes from (b) the larger budget vLLM grants ``LLM(...)``.
    """
    try:
        import vllm
        from vllm.engine.arg_utils import EngineArgs
        from vllm.usage.usage_lib import UsageContext

        tokens, seqs = EngineArgs.get_batch_defaults(world_size)
        server = UsageContext.OPENAI_API_SERVER
        where = f"vllm serve's default on this device (vLLM {vllm.__version__}, EngineArgs.get_batch_defaults)"
        return int(tokens[server]), int(seqs[server]), where
    except Exception as error:  # noqa: BLE001 (no vLLM, or one without the helper)
        why = str(error).splitlines()[0][:120] if str(error) else type(error).__name__
        return (*FALLBACK_BUDGET, f"fallback: vLLM 0.32's vllm serve default on its CPU build ({why})")


def choose_budget(
    setup: Setup,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    kv_cache_memory_bytes: int | None = None,
) -> Budget:
    """One budget for all three ways: flags where given, else ``vllm serve``'s defaults; one KV size and dtype."""
    tokens, seqs, where = serve_batch_defaults(setup.tensor_parallel_size)
    sources = {
        "max_num_batched_tokens": "--max-num-batched-tokens" if max_num_batched_tokens else where,
        "max_num_seqs": "--max-num-seqs" if max_num_seqs else where,
    }
    on_cpu = runs_on_cpu(setup)
    kv = kv_cache_memory_bytes
    if kv is not None:
        sources["kv_cache_memory_bytes"] = "--kv-cache-memory-bytes"
    elif setup.engine == "vllm" and os.environ.get("VLLM_CPU_KVCACHE_SPACE") and on_cpu:
        sources["kv_cache_memory_bytes"] = (
            f"VLLM_CPU_KVCACHE_SPACE={os.environ['VLLM_CPU_KVCACHE_SPACE']} GiB in the environment, which every "
            "way inherits"
        )
    elif on_cpu:
        kv = cpu_kv_bytes(setup.model_path)
        sources["kv_cache_memory_bytes"] = "sized from this machine's free memory (engines.vllm_memory)"
    else:
        sources["kv_cache_memory_bytes"] = "each engine's default share of the GPU (compare the values read back)"
    dtype = setup.dtype
    if dtype is None and setup.engine == "hf":
        dtype = "float32" if on_cpu else "bfloat16"  # the hf engine's default, given to the server too
        sources["dtype"] = "the hf engine's default on this device"
    else:
        sources["dtype"] = "--dtype" if dtype else "each engine's auto (the weights' dtype)"
    return Budget(max_num_batched_tokens or tokens, max_num_seqs or seqs, kv, dtype, sources)


def transformers_budget_args(budget: Budget, memory_bytes: int | None) -> list[str]:
    """``transformers serve``'s continuous-batching flags for the budget.

    It takes a token budget (``--cb-max-batch-tokens``) but no cap on requests per batch. Its paged
    cache takes ``--cb-max-memory-percent`` of the memory left after the model (default 0.9: on a
    CPU the machine's RAM, and the OOM killer ended it here), and it sizes its cache within that
    share itself, attention masks included (a cache fixed in blocks overflowed those masks for a
    small model). So the KV size goes in as a share of ``memory_bytes``; None: its default.
    """
    args = ["--cb-max-batch-tokens", str(budget.max_num_batched_tokens)]
    share = cache_share(budget, memory_bytes)
    if share is not None:
        args += ["--cb-max-memory-percent", f"{share:.3f}"]
    return args


def cache_share(budget: Budget, memory_bytes: int | None) -> float | None:
    """The KV size as a share of ``memory_bytes``, within transformers' accepted (0, 0.9]."""
    if budget.kv_cache_memory_bytes is None or not memory_bytes:
        return None
    return min(0.9, max(0.01, budget.kv_cache_memory_bytes / memory_bytes))


def runs_on_cpu(setup: Setup) -> bool:
    """Whether the engine runs on the CPU: vLLM's CPU build, or hf on ``--device cpu`` (or no GPU)."""
    if setup.engine == "vllm":
        from sysbench_gpu.engines.vllm_memory import on_cpu_platform

        return on_cpu_platform()
    if setup.device is not None:
        return setup.device.startswith("cpu")
    import torch

    return not torch.cuda.is_available()


def cpu_kv_bytes(model_path: str) -> int:
    """The KV cache the vllm engine would size on this CPU (engines.vllm_memory): a fixed share of RAM fails."""
    from sysbench_gpu.engines.vllm_memory import plan_memory, read_node_memory, weights_bytes

    plan = plan_memory(
        on_cpu=True,
        gpu_memory_utilization=None,
        kv_cache_memory_bytes=None,
        environ={},
        node=read_node_memory(),
        weights_bytes=weights_bytes(model_path),
    )
    return int(plan.engine_args["kv_cache_memory_bytes"])
