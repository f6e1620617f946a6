"""Data-parallel replicas without Ray: which replica serves a session, each replica's ports and resources.

Placement is sticky per *session*: the scheduler passes each conversation's session id
(``session_keys``), so a session's later turns go to the replica whose prefix cache holds
its history, even when the system message is folded into turn 1 or old turns are
dropped to fit the context. Without keys (the judge's one-shot prompts) the first two
messages stand in for the session.

Each replica gets its own port range through ``VLLM_PORT``: vLLM picks ports for its
distributed set-up (``get_open_port``, the DP master ports) by scanning upward from
``VLLM_PORT``, or by asking the OS when it is unset; replicas that start together on one
node would otherwise race for the same ports ("Engine core initialization failed", now
and then).

The pool itself (Ray actors, restarts, shutdown) is ``engines.ray_pool``.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError

# Replica r scans for ports from base + r * stride. Below Linux's ephemeral range
# (32768-60999), so ports the OS hands out to other programs never land in it.
DEFAULT_REPLICA_PORT_BASE = 20000
REPLICA_PORT_STRIDE = 100  # vLLM takes a handful of ports per engine
# A replica that dies is restarted (its unfinished requests resent) at most this many times.
DEFAULT_MAX_RESTARTS = 3


def session_key(conversation: Sequence[ChatMessage]) -> str:
    """A stand-in session id when none is given: the first two messages (system + first user)."""
    head = [[m["role"], m["content"]] for m in list(conversation)[:2]]
    return hashlib.sha1(json.dumps(head, ensure_ascii=False).encode()).hexdigest()


def assign_replicas(keys: Sequence[str], replicas: int | Sequence[int], sticky: dict[str, int]) -> list[int]:
    """Replica index per conversation: a known session goes where it went before, a new one to the least loaded.

    ``replicas``: how many there are, or the indices still serving (a retired replica's
    sessions move to the least loaded of these). ``sticky`` is updated in place, so every
    turn of a session reuses one replica's prefix cache.
    """
    candidates = list(range(replicas)) if isinstance(replicas, int) else list(replicas)
    if not candidates:
        raise SysbenchError("no data-parallel replica is left to serve requests")
    serving = set(candidates)
    load = dict.fromkeys(candidates, 0)
    for key in keys:
        if sticky.get(key) in serving:
            load[sticky[key]] += 1
    placement: list[int] = []
    for key in keys:
        if sticky.get(key) not in serving:
            target = min(candidates, key=lambda r: (load[r], r))
            sticky[key] = target
            load[target] += 1
        placement.append(sticky[key])
    return placement


def replica_port_bases(replicas: int, environ: Mapping[str, str]) -> list[int]:
    """``VLLM_PORT`` for each replica.

    Disjoint ranges from the user's ``VLLM_PORT`` or ``DEFAULT_REPLICA_PORT_BASE``.
    """
    raw = environ.get("VLLM_PORT", "").strip()
    if raw:
        try:
            base = int(raw)
        except ValueError:
            raise SysbenchError(f"VLLM_PORT={raw!r}: must be a port number") from None
    else:
        base = DEFAULT_REPLICA_PORT_BASE
    last = base + replicas * REPLICA_PORT_STRIDE - 1
    if base < 1024 or last > 65535:
        raise SysbenchError(
            f"VLLM_PORT={base}: {replicas} replicas need ports {base}-{last} ({REPLICA_PORT_STRIDE} each); "
            "export a VLLM_PORT between 1024 and " + str(65535 - replicas * REPLICA_PORT_STRIDE + 1)
        )
    return [base + r * REPLICA_PORT_STRIDE for r in range(replicas)]


def load_factory(reference: str) -> Callable[..., Any]:
    """``module:attribute`` (a backend class or function), imported where the replica runs."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise SysbenchError(f"replica_factory {reference!r}: expected 'module:attribute'")
    return getattr(importlib.import_module(module_name), attribute)


@dataclass(frozen=True)
class ReplicaShape:
    """What one replica reserves in the cluster: CPUs for its actor, GPUs for its engine.

    ``gpu_bundles``: one placement bundle per GPU, left to the engine's own Ray workers
    (vLLM's ``distributed_executor_backend="ray"``, which may span nodes for pipeline
    parallel); otherwise the actor takes every GPU itself and they sit on one node
    (vLLM's own worker processes for tensor parallel, or the hf engine's one device).
    """

    cpus: float
    gpus: int = 0
    gpu_bundles: bool = False

    def bundles(self) -> list[dict[str, float]]:
        if self.gpus and self.gpu_bundles:
            return [{"CPU": float(self.cpus)}] + [{"GPU": 1.0} for _ in range(self.gpus)]
        bundle = {"CPU": float(self.cpus)}
        if self.gpus:
            bundle["GPU"] = float(self.gpus)
        return [bundle]

    @property
    def strategy(self) -> str:
        # PACK keeps a pipeline on one node when it fits there and spills across nodes when it does not.
        return "PACK" if self.gpus and self.gpu_bundles else "STRICT_PACK"

    @property
    def actor_gpus(self) -> int:
        return 0 if self.gpu_bundles else self.gpus


def check_capacity(label: str, replicas: int, shape: ReplicaShape, cluster: Mapping[str, float]) -> None:
    """One line when the cluster can never hold ``replicas`` of ``shape`` (before any placement waits)."""
    for resource, each in (("GPU", shape.gpus), ("CPU", shape.cpus)):
        needed = replicas * each
        have = float(cluster.get(resource, 0.0))
        if needed > have:
            unit = "GPUs" if resource == "GPU" else "CPUs"
            raise SysbenchError(
                f"{label}: {replicas} data-parallel replicas x {each:g} {unit} each need {needed:g} {unit}, "
                f"but the Ray cluster has {have:g}"
            )
