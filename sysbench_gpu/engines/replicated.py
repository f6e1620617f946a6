"""The hf engine's data parallel: N ``HFEngine`` replicas as Ray actors behind one ``Engine``.

``hf_engine`` builds the engine ``get_engine("hf", ...)`` returns: one in-process
``HFEngine`` for ``data_parallel_size=1`` (Ray is never started), else a
``ReplicatedEngine`` over a ``RayReplicaPool``. Each replica takes one GPU where the
cluster has GPUs; on CPUs each takes ``cpu_threads`` cores (default: an even share of
this machine's cores under a local Ray, one core in a joined cluster) and runs torch with
that many threads. Model facts (the chat template, the context) come from replica 0;
every replica holds the same model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sysbench_gpu.core.arguments import check_replica_flags
from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.engines.base import Completion, SamplingSpec
from sysbench_gpu.engines.ray_pool import RayReplicaPool, ReplicaSpec
from sysbench_gpu.engines.replicas import DEFAULT_MAX_RESTARTS, load_factory

HF_FACTORY = "sysbench_gpu.engines.hf:HFEngine"


class ReplicatedEngine:
    """One engine's replicas behind the ``Engine`` protocol; calls that are not a batch go to one replica."""

    is_primary = True

    def __init__(self, name: str, model: str, pool: RayReplicaPool, settings: dict[str, Any]) -> None:
        self.name = name
        self.model = model
        self.settings = settings
        self._pool = pool
        try:
            self._info: dict[str, Any] = pool.call("describe")
            self._context: int | None = pool.call("context_length")
            self._system_role: bool | None = None
        except BaseException:
            pool.close()
            raise

    def chat(
        self,
        conversations: Sequence[Sequence[ChatMessage]],
        sampling: SamplingSpec,
        session_keys: Sequence[str] | None = None,
    ) -> list[Completion]:
        """``session_keys`` (one per conversation, e.g. the session id) keep a session on one replica."""
        return self._pool.chat(conversations, sampling, session_keys)

    def count_prompt_tokens(self, conversation: Sequence[ChatMessage]) -> int | None:
        return self._pool.call("count_prompt_tokens", [dict(m) for m in conversation])

    def supports_system_role(self) -> bool:
        if self._system_role is None:
            self._system_role = bool(self._pool.call("supports_system_role"))
        return self._system_role

    def context_length(self) -> int | None:
        return self._context

    def describe(self) -> dict[str, Any]:
        # Replica 0's own record (every replica runs the same model and settings), then the replicas.
        return {**self._info, **self.settings, "replicas": self._pool.describe()}

    def close(self) -> None:
        self._pool.close()


def hf_engine(
    model: str,
    data_parallel_size: int = 1,
    ray_address: str | None = None,
    *,
    replica_factory: str = HF_FACTORY,
    max_replica_restarts: int = DEFAULT_MAX_RESTARTS,
    **options: Any,
) -> Any:
    """The hf engine with ``data_parallel_size`` replicas (1: in this process, without Ray)."""
    if isinstance(data_parallel_size, bool) or not isinstance(data_parallel_size, int) or data_parallel_size < 1:
        raise SysbenchError(f"hf engine: data_parallel_size must be a whole number >= 1, got {data_parallel_size!r}")
    address = check_replica_flags(data_parallel_size, ray_address, "data_parallel_size", "ray_address")
    if data_parallel_size == 1:
        return load_factory(replica_factory)(model=model, **options)
    device = options.get("device")
    if device not in (None, "cpu", "cuda"):
        raise SysbenchError(
            f"hf engine: device {device!r} with data-parallel replicas: each replica gets its own GPU; "
            "leave --device unset (or cuda, or cpu)"
        )
    cpu_threads = options.get("cpu_threads")
    spec = ReplicaSpec(
        label="hf engine",
        factory=replica_factory,
        options={"model": model, **options},
        count=data_parallel_size,
        cpus=float(cpu_threads) if cpu_threads is not None else None,
        gpus=0 if device == "cpu" else 1,
        max_restarts=max_replica_restarts,
    )
    pool = RayReplicaPool(spec, address)
    return ReplicatedEngine("hf", model, pool, {"data_parallel_size": data_parallel_size})
