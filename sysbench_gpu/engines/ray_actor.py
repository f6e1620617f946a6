"""A replica's Ray actor, and joining or starting Ray: the parts of the pool that run on Ray's side.

``ReplicaActor`` builds one backend from a ``module:attribute`` factory inside a Ray worker and answers
every call as ``("ok", value)`` or ``("error", (line, trace))``, so the driver never unpickles a
foreign exception. ``connect_ray`` joins ``--ray-address`` or starts a local Ray for the run, on
127.0.0.1 only (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, which Ray reads when it is imported).
"""

from __future__ import annotations

import math
import os
import socket
import sys
import traceback
from typing import Any

from sysbench_gpu.core.arguments import require_ray
from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.engines.base import SamplingSpec
from sysbench_gpu.engines.replicas import load_factory
from sysbench_gpu.engines.startup import one_line

# Ray reads it at import: "0" keeps a local Ray on 127.0.0.1 instead of the machine's network address.
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
NAMESPACE = "sysbench-gpu"


def _error_message(error: BaseException) -> str:
    return str(error) if isinstance(error, SysbenchError) else one_line(error)


class ReplicaActor:
    """One replica: a backend built in a Ray worker; every answer is ("ok", value) or ("error", (line, trace))."""

    def __init__(self, factory: str, options: dict[str, Any], env: dict[str, str], import_paths: list[str]) -> None:
        # The driver's import path, after the worker's own: a factory importable there is importable here.
        sys.path.extend(p for p in import_paths if p not in sys.path)
        os.environ.update(env)
        self.backend: Any = None
        self.failure: tuple[str, str] | None = None
        try:
            self.backend = load_factory(factory)(**options)
        except Exception as error:  # noqa: BLE001 (reported by where(), as one line)
            self.failure = (_error_message(error), traceback.format_exc())

    def where(self) -> dict[str, Any]:
        import ray

        return {
            "pid": os.getpid(),
            "pgid": os.getpgid(0),
            "node_id": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "gpus": [str(g) for g in ray.get_gpu_ids()],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "failure": self.failure,
        }

    def chat(self, conversations: list[list[ChatMessage]], sampling: SamplingSpec) -> tuple[str, Any]:
        return self.call("chat", conversations, sampling)

    def call(self, method: str, *args: Any) -> tuple[str, Any]:
        try:
            return "ok", getattr(self.backend, method)(*args)
        except Exception as error:  # noqa: BLE001 (the driver raises it, naming the replica)
            return "error", (_error_message(error), traceback.format_exc())

    def close(self) -> None:
        backend, self.backend = self.backend, None
        if backend is not None:
            backend.close()


def connect_ray(address: str | None, cpus_needed: float, label: str) -> tuple[Any, bool]:
    """Ray, connected to ``address`` or to a local Ray started now; and whether this call connected it."""
    require_ray(f"{label} with data-parallel replicas")
    if address is None:
        os.environ.setdefault(LOCAL_ONLY_ENV, "0")
    import ray

    if ray.is_initialized():
        return ray, False
    try:
        if address is None:
            cores = len(os.sched_getaffinity(0))
            ray.init(
                address="local",
                num_cpus=max(cores, math.ceil(cpus_needed)),
                include_dashboard=False,
                namespace=NAMESPACE,
            )
        else:
            ray.init(address=address, namespace=NAMESPACE)
    except Exception as error:  # noqa: BLE001 (any connection failure is one line)
        if address is None:
            raise SysbenchError(f"{label}: could not start a local Ray: {one_line(error)}") from None
        raise SysbenchError(
            f"{label}: could not join the Ray cluster at --ray-address {address}: {one_line(error)} (a cluster "
            "started with token authentication also needs RAY_AUTH_MODE=token and its token here)"
        ) from None
    return ray, True


def node_name(where: dict[str, Any]) -> str:
    host, ip = where.get("hostname"), where.get("ip")
    if host and ip and host != ip:
        return f"{host} ({ip})"
    return str(host or ip or "an unknown node")
