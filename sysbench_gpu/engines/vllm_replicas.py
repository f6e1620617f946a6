"""Data-parallel replicas of the vllm engine: N worker processes, placement by session, disjoint GPUs and ports.

The installed vLLM refuses ``LLM(data_parallel_size>1)`` in one process outside
torchrun, so the engine runs its own replicas: spawned processes that each build a
backend (``LocalVLLM``) on their own ``CUDA_VISIBLE_DEVICES`` and answer calls over a
pipe. A batch is split across them and gathered back in input order.

Placement is sticky per *session*: the scheduler passes each conversation's session id
(``session_keys``), so a session's later turns go to the replica whose prefix cache holds
its history, even when the system message is folded into turn 1 or old turns are
dropped to fit the context. Without keys (the judge's one-shot prompts) the first two
messages stand in for the session.

Each replica gets its own port range through ``VLLM_PORT``: vLLM 0.32 picks ports for
its distributed set-up (``get_open_port``, the DP master ports) by scanning upward from
``VLLM_PORT``, or by asking the OS when it is unset; replicas that start together would
otherwise race for the same ports ("Engine core initialization failed", now and then).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import multiprocessing
import os
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.engines.base import Completion, SamplingSpec
from sysbench_gpu.engines.startup import one_line

log = logging.getLogger(__name__)

# How long a data-parallel replica may take to load its model before we give up.
REPLICA_START_TIMEOUT_S = 3600.0
# Replica r scans for ports from base + r * stride. Below Linux's ephemeral range
# (32768-60999), so ports the OS hands out to other programs never land in it.
DEFAULT_REPLICA_PORT_BASE = 20000
REPLICA_PORT_STRIDE = 100  # vLLM takes a handful of ports per engine


def session_key(conversation: Sequence[ChatMessage]) -> str:
    """A stand-in session id when none is given: the first two messages (system + first user)."""
    head = [[m["role"], m["content"]] for m in list(conversation)[:2]]
    return hashlib.sha1(json.dumps(head, ensure_ascii=False).encode()).hexdigest()


def assign_replicas(keys: Sequence[str], replicas: int, sticky: dict[str, int]) -> list[int]:
    """Replica index per conversation: a known session goes where it went before, a new one to the least loaded.

    ``sticky`` is updated in place, so every turn of a session reuses one replica's prefix cache.
    """
    load = [0] * replicas
    for key in keys:
        if key in sticky:
            load[sticky[key]] += 1
    placement: list[int] = []
    for key in keys:
        if key not in sticky:
            target = min(range(replicas), key=lambda r: (load[r], r))
            sticky[key] = target
            load[target] += 1
        placement.append(sticky[key])
    return placement


def replica_device_groups(replicas: int, per_replica: int, visible: Sequence[str]) -> list[list[str]]:
    """Disjoint GPU ids for each replica, taken in order from the visible devices."""
    needed = replicas * per_replica
    if len(visible) < needed:
        raise SysbenchError(
            f"vllm engine: {replicas} data-parallel replicas x {per_replica} GPUs each need {needed} GPUs, "
            f"but {len(visible)} are visible ({','.join(visible) or 'none'})"
        )
    return [list(visible[r * per_replica : (r + 1) * per_replica]) for r in range(replicas)]


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


def replica_envs(
    replicas: int, per_replica: int, visible: Sequence[str], environ: Mapping[str, str]
) -> tuple[list[dict[str, str]], list[list[str]] | None]:
    """Each replica's environment (its GPUs and its port range) and the GPU groups (None without GPUs)."""
    ports = replica_port_bases(replicas, environ)
    envs = [{"VLLM_PORT": str(port)} for port in ports]
    if not visible:
        return envs, None
    groups = replica_device_groups(replicas, per_replica, visible)
    for env, group in zip(envs, groups, strict=False):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(group)
    return envs, groups


def visible_gpus() -> list[str]:
    """GPU ids this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else every device torch counts."""
    explicit = os.environ.get("CUDA_VISIBLE_DEVICES")
    if explicit is not None:
        return [d.strip() for d in explicit.split(",") if d.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]  # NVML count; creates no CUDA context
    except Exception:  # noqa: BLE001 (no torch or no driver: no GPUs)
        return []


def load_factory(reference: str) -> Callable[..., Any]:
    module_name, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def _error_message(error: BaseException) -> str:
    return str(error) if isinstance(error, SysbenchError) else one_line(error)


def _serve_replica(conn: Any, factory: str, options: dict[str, Any], env: dict[str, str]) -> None:
    """A replica process: build the backend, then answer (method, args) messages until 'close'.

    Errors travel as (one line, traceback); the parent logs the traceback at debug level.
    """
    os.environ.update(env)
    try:
        backend = load_factory(factory)(**options)
        conn.send(("ready", None))
    except BaseException as error:  # noqa: BLE001 (report any start-up failure to the parent)
        conn.send(("error", (_error_message(error), traceback.format_exc())))
        return
    while True:
        try:
            method, args = conn.recv()
        except EOFError:  # the parent died
            method, args = "close", ()
        if method == "close":
            backend.close()
            with contextlib.suppress(BrokenPipeError, OSError):
                conn.send(("ok", None))
            return
        try:
            conn.send(("ok", getattr(backend, method)(*args)))
        except BaseException as error:  # noqa: BLE001 (the parent raises it)
            conn.send(("error", (_error_message(error), traceback.format_exc())))


class ReplicaPool:
    """N long-lived worker processes, each with its own backend; calls are fanned out and gathered.

    ``factory`` is ``"module:callable"`` (importable in a spawned process); ``envs`` gives
    each replica its environment (``CUDA_VISIBLE_DEVICES``, ``VLLM_PORT``).
    """

    def __init__(self, factory: str, options: dict[str, Any], envs: Sequence[dict[str, str]]) -> None:
        context = multiprocessing.get_context("spawn")  # never fork a process that may hold CUDA state
        self._connections: list[Any] = []
        self._processes: list[Any] = []
        self.sticky: dict[str, int] = {}
        try:
            for index, env in enumerate(envs):
                parent_end, child_end = context.Pipe()
                # Not a daemon: a replica starts vLLM's own engine processes.
                process = context.Process(
                    target=_serve_replica,
                    args=(child_end, factory, options, dict(env)),
                    name=f"vllm-replica-{index}",
                    daemon=False,
                )
                process.start()
                child_end.close()
                self._connections.append(parent_end)
                self._processes.append(process)
            for index in range(len(envs)):
                self._receive(index, timeout_s=REPLICA_START_TIMEOUT_S, doing="starting")
        except BaseException:
            self.close()
            raise

    @property
    def size(self) -> int:
        return len(self._processes)

    def call(self, index: int, method: str, *args: Any) -> Any:
        self._connections[index].send((method, args))
        return self._receive(index, timeout_s=None, doing=method)

    def chat(
        self,
        conversations: Sequence[Sequence[ChatMessage]],
        sampling: SamplingSpec,
        session_keys: Sequence[str] | None = None,
    ) -> list[Completion]:
        if session_keys is not None and len(session_keys) != len(conversations):
            raise ValueError(f"{len(session_keys)} session keys for {len(conversations)} conversations")
        keys = [str(k) for k in session_keys] if session_keys is not None else [session_key(c) for c in conversations]
        placement = assign_replicas(keys, self.size, self.sticky)
        shards: list[list[int]] = [[] for _ in range(self.size)]
        for position, replica in enumerate(placement):
            shards[replica].append(position)
        busy = [r for r in range(self.size) if shards[r]]
        for replica in busy:  # send every shard first: the replicas work at the same time
            shard = [list(conversations[i]) for i in shards[replica]]
            self._connections[replica].send(("chat", (shard, sampling)))
        results: list[Completion | None] = [None] * len(conversations)
        for replica in busy:
            completions = self._receive(replica, timeout_s=None, doing="chat")
            for position, completion in zip(shards[replica], completions, strict=False):
                completion.extra["replica"] = replica
                results[position] = completion
        return [r for r in results if r is not None]

    def _receive(self, index: int, timeout_s: float | None, doing: str) -> Any:
        connection, process = self._connections[index], self._processes[index]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not connection.poll(1.0):
            if not process.is_alive():
                raise SysbenchError(
                    f"vllm data-parallel replica {index} exited with code {process.exitcode} while {doing}"
                )
            if deadline is not None and time.monotonic() > deadline:
                raise SysbenchError(
                    f"vllm data-parallel replica {index}: no answer after {timeout_s:.0f} s while {doing}"
                )
        try:
            status, value = connection.recv()
        except EOFError as error:
            raise SysbenchError(f"vllm data-parallel replica {index} closed its pipe while {doing}") from error
        if status == "error":
            message, trace = value
            log.debug("vllm data-parallel replica %d failed while %s:\n%s", index, doing, trace)
            raise SysbenchError(f"vllm data-parallel replica {index} failed while {doing}: {message}")
        return value

    def close(self) -> None:
        for connection, process in zip(self._connections, self._processes, strict=False):
            try:
                if process.is_alive():
                    connection.send(("close", ()))
                    if connection.poll(60.0):
                        connection.recv()
            except (BrokenPipeError, EOFError, OSError):
                pass
            process.join(timeout=30.0)
            if process.is_alive():
                process.terminate()
                process.join(timeout=10.0)
            connection.close()
        self._connections, self._processes = [], []
