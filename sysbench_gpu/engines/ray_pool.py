"""Data-parallel replicas as Ray actors: one engine per actor, one placement group per replica, restarts.

``RayReplicaPool`` starts N long-lived actors (``ReplicaActor``), each building one backend
(``LocalVLLM``, ``HFEngine`` or a test's stand-in) through a ``module:attribute`` factory.
Each replica first reserves its resources as a placement group (``ReplicaShape``: its CPUs,
and its ``tp x pp`` GPUs), so a replica's GPUs are its own wherever in the cluster it lands.
A batch is split across the actors by session (``replicas.assign_replicas``) and gathered
back in input order; each actor keeps its sessions' prefix cache between turns.

Ray: ``address`` joins a running cluster (``auto`` or ``HOST:PORT``); without one a local Ray
is started for the run and stopped at the end, on 127.0.0.1 only
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, which Ray reads when it is imported). A Ray
already connected in this process (a test's, a notebook's) is used and left running.
``import ray`` happens only when a pool is built (``ray_actor.connect_ray``).

Failures: every call has its own reply object, so a reply of a failed batch is never read
by a later one. A replica that raises stops the call with one line naming it. A replica
that *dies* (its process killed, its node gone) is restarted in its placement group and
its unfinished requests are sent again; nothing was written for the turn yet (the
scheduler writes a turn when it is complete), so nothing is written twice or lost. Past
``max_restarts`` deaths the run stops with one line naming the replica and its node; a
replica whose resources cannot be placed again is retired and its sessions move to the
others. Closing (also on Ctrl-C and SIGTERM, which Ray's driver turns into an exit)
kills every replica's whole process tree (``process_tree``), then stops the local Ray.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.engines.base import Completion, SamplingSpec
from sysbench_gpu.engines.process_tree import kill_replica_processes
from sysbench_gpu.engines.ray_actor import ReplicaActor, connect_ray, node_name
from sysbench_gpu.engines.replicas import (
    DEFAULT_MAX_RESTARTS,
    ReplicaShape,
    assign_replicas,
    check_capacity,
    session_key,
)
from sysbench_gpu.engines.startup import one_line

log = logging.getLogger(__name__)

REPLICA_START_TIMEOUT_S = 3600.0  # loading a model
PLACEMENT_TIMEOUT_S = 600.0  # the cluster placing every replica at start (an autoscaler may be adding nodes)
REPLACEMENT_TIMEOUT_S = 120.0  # placing a dead replica again (its node may be gone for good)
CLOSE_GRACE_S = 30.0  # backends closing themselves before their processes are killed
KILL_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ReplicaSpec:
    """What to run in each replica and what it reserves.

    ``cpus`` per replica (None: an even share of this machine's cores under a local Ray,
    else 1); ``gpus`` per replica where the cluster has GPUs (none: the replicas run on
    CPUs); ``envs``: each replica's own variables (``VLLM_PORT``).
    """

    label: str  # how errors name the pool: "hf engine", "vllm engine"
    factory: str  # "module:attribute", imported inside the actor
    options: dict[str, Any]
    count: int
    cpus: float | None = None
    gpus: int = 0
    gpu_bundles: bool = False
    envs: tuple[dict[str, str], ...] = ()
    max_restarts: int = DEFAULT_MAX_RESTARTS


class RayReplicaPool:
    """N replicas as Ray actors; ``chat`` fans a batch out by session and gathers it in input order."""

    def __init__(self, spec: ReplicaSpec, address: str | None = None) -> None:
        if spec.count < 2:
            raise ValueError("a replica pool has at least 2 replicas (a size of 1 never starts Ray)")
        if spec.max_restarts < 0:
            raise SysbenchError(f"{spec.label}: max_replica_restarts must be 0 or more, got {spec.max_restarts}")
        self.spec = spec
        self.address = address
        count = spec.count
        if spec.cpus is not None:
            cpus = spec.cpus
        else:
            cpus = max(1, len(os.sched_getaffinity(0)) // count) if address is None else 1
        self._actors: list[Any] = [None] * count
        self._where: list[dict[str, Any]] = [{} for _ in range(count)]
        self._groups: list[Any] = []
        self.requests = [0] * count
        self.restarts = [0] * count
        self.retired = [False] * count
        self.deaths: list[dict[str, Any]] = []
        self.sticky: dict[str, int] = {}
        self._abandoned = False  # a call stopped half-way: actors may still be busy with it
        self._closed = False
        self._ray, self._owns_ray = connect_ray(address, count * cpus, spec.label)
        self._actor_class: Any = None
        try:
            from ray.exceptions import RayActorError

            ray = self._ray
            cluster = ray.cluster_resources()
            gpus = spec.gpus if cluster.get("GPU", 0) > 0 else 0
            if spec.gpus and not gpus:
                log.info("%s: no GPU in the Ray cluster; the %d replicas run on CPUs", spec.label, count)
            self.shape = ReplicaShape(cpus=cpus, gpus=gpus, gpu_bundles=spec.gpu_bundles and gpus > 0)
            check_capacity(spec.label, count, self.shape, cluster)
            from ray.util.placement_group import placement_group

            self._groups = [placement_group(self.shape.bundles(), strategy=self.shape.strategy) for _ in range(count)]
            self._await_placement(range(count), PLACEMENT_TIMEOUT_S)
            log.info("%s: starting %d data-parallel replicas on Ray", spec.label, count)
            self._actors = [self._launch(r) for r in range(count)]
            for r in range(count):
                try:
                    self._where[r] = self._await_start(r)
                except RayActorError as error:
                    raise SysbenchError(f"{spec.label}: replica {r} died while starting: {one_line(error)}") from None
        except BaseException:
            self._abandoned = True
            self.close()
            raise

    # --- starting -------------------------------------------------------------------

    def _await_placement(self, replicas: Iterable[int], timeout_s: float, required: bool = True) -> list[int]:
        """The replicas whose placement group is ready within ``timeout_s``; ``required``: one line for any other."""
        indices = list(replicas)
        refs = {self._groups[r].ready(): r for r in indices}
        ready, _ = self._ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        placed = sorted(refs[ref] for ref in ready)
        missing = [r for r in indices if r not in placed]
        if missing and required:
            raise SysbenchError(
                f"{self.spec.label}: the Ray cluster did not place replica {missing[0]} "
                f"({self.shape.bundles()}, {self.shape.strategy}) within {timeout_s:.0f} s; "
                f"free now: {self._ray.available_resources()}"
            )
        return placed

    def _launch(self, replica: int) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        env = dict(self.spec.envs[replica]) if self.spec.envs else {}
        strategy = PlacementGroupSchedulingStrategy(
            self._groups[replica],
            placement_group_bundle_index=0,
            # vLLM's Ray executor places its workers in this group's GPU bundles.
            placement_group_capture_child_tasks=self.shape.gpu_bundles,
        )
        if self._actor_class is None:
            self._actor_class = self._ray.remote(ReplicaActor)
        return self._actor_class.options(
            num_cpus=self.shape.cpus,
            num_gpus=self.shape.actor_gpus,
            max_restarts=0,  # restarts are ours: we resend the dead replica's requests
            scheduling_strategy=strategy,
        ).remote(self.spec.factory, self.spec.options, env, [p for p in sys.path if p])

    def _await_start(self, replica: int) -> dict[str, Any]:
        """The started replica's whereabouts; one line when its backend failed to build (never restarted)."""
        from ray.exceptions import GetTimeoutError

        try:
            where = self._ray.get(self._actors[replica].where.remote(), timeout=REPLICA_START_TIMEOUT_S)
        except GetTimeoutError:
            raise SysbenchError(
                f"{self.spec.label}: replica {replica}: no answer after {REPLICA_START_TIMEOUT_S:.0f} s while starting"
            ) from None
        if where.get("failure"):
            message, trace = where["failure"]
            log.debug("%s: replica %d failed while starting:\n%s", self.spec.label, replica, trace)
            raise SysbenchError(
                f"{self.spec.label}: replica {replica} on {node_name(where)} failed while starting: {message}"
            )
        return where

    # --- calls ------------------------------------------------------------------------

    def serving(self) -> list[int]:
        return [r for r in range(self.spec.count) if not self.retired[r]]

    def call(self, method: str, *args: Any) -> Any:
        """``method(*args)`` on one serving replica (they hold the same model)."""
        from ray.exceptions import RayActorError

        while True:
            replica = self.serving()[0]
            try:
                status, value = self._ray.get(self._actors[replica].call.remote(method, *args))
            except RayActorError as error:
                self._recover(replica, error)
                continue
            return self._unwrap(replica, method, status, value)

    def chat(
        self,
        conversations: Sequence[Sequence[ChatMessage]],
        sampling: SamplingSpec,
        session_keys: Sequence[str] | None = None,
    ) -> list[Completion]:
        from ray.exceptions import RayActorError

        if session_keys is not None and len(session_keys) != len(conversations):
            raise ValueError(f"{len(session_keys)} session keys for {len(conversations)} conversations")
        keys = [str(k) for k in session_keys] if session_keys is not None else [session_key(c) for c in conversations]
        results: list[Completion | None] = [None] * len(conversations)
        pending: dict[Any, tuple[int, list[int]]] = {}
        try:
            for replica, positions in self._shards(keys, range(len(keys))).items():
                pending[self._submit(replica, positions, conversations, sampling)] = (replica, positions)
            while pending:
                ready, _ = self._ray.wait(list(pending), num_returns=1)
                replica, positions = pending.pop(ready[0])
                try:
                    status, value = self._ray.get(ready[0])
                except RayActorError as error:
                    # Died mid-call: its requests go again, to it restarted or to the others.
                    restarted = self._recover(replica, error)
                    shards = {replica: positions} if restarted else self._shards(keys, positions)
                    for target, again in shards.items():
                        pending[self._submit(target, again, conversations, sampling)] = (target, again)
                    continue
                completions = self._unwrap(replica, "chat", status, value)
                if len(completions) != len(positions):
                    raise SysbenchError(
                        f"{self.spec.label}: replica {replica} returned {len(completions)} completions "
                        f"for {len(positions)} conversations"
                    )
                for position, completion in zip(positions, completions, strict=True):
                    completion.extra["replica"] = replica
                    results[position] = completion
                self.requests[replica] += len(positions)
        except BaseException:
            self._abandoned = bool(pending)
            raise
        missing = [p for p, r in enumerate(results) if r is None]
        if missing:  # never a shorter list: the scheduler pairs completions with requests by position
            raise SysbenchError(f"{self.spec.label}: no completion for conversation {missing[0]} of {len(results)}")
        return [r for r in results if r is not None]

    def _shards(self, keys: Sequence[str], positions: Iterable[int]) -> dict[int, list[int]]:
        chosen = list(positions)
        placement = assign_replicas([keys[p] for p in chosen], self.serving(), self.sticky)
        shards: dict[int, list[int]] = {}
        for position, replica in zip(chosen, placement, strict=True):
            shards.setdefault(replica, []).append(position)
        return shards

    def _submit(
        self,
        replica: int,
        positions: list[int],
        conversations: Sequence[Sequence[ChatMessage]],
        sampling: SamplingSpec,
    ) -> Any:
        shard = [list(conversations[p]) for p in positions]
        return self._actors[replica].chat.remote(shard, sampling)

    def _unwrap(self, replica: int, doing: str, status: str, value: Any) -> Any:
        if status == "error":
            message, trace = value
            log.debug("%s: replica %d failed while %s:\n%s", self.spec.label, replica, doing, trace)
            raise SysbenchError(
                f"{self.spec.label}: replica {replica} on {node_name(self._where[replica])} failed while {doing}: "
                f"{message}"
            )
        return value

    # --- deaths -------------------------------------------------------------------------

    def _recover(self, replica: int, error: BaseException) -> bool:
        """A dead replica restarted in its placement group (True), or retired when it cannot be placed (False)."""
        where = self._where[replica]
        cause = one_line(error)
        self.restarts[replica] += 1
        self.deaths.append({"replica": replica, "node": node_name(where), "pid": where.get("pid"), "cause": cause})
        limit = self.spec.max_restarts
        if self.restarts[replica] > limit:
            deaths = self.restarts[replica]
            raise SysbenchError(
                f"{self.spec.label}: replica {replica} on node {node_name(where)} died {deaths} "
                f"time{'' if deaths == 1 else 's'}, past the limit of {limit} restarts (last: {cause})"
            )
        log.warning(
            "%s: replica %d on %s died (%s); restarting it (%d of %d) and resending its requests",
            self.spec.label,
            replica,
            node_name(where),
            cause,
            self.restarts[replica],
            limit,
        )
        self._discard(replica)
        if not self._await_placement([replica], REPLACEMENT_TIMEOUT_S, required=False):
            if len(self.serving()) < 2:
                raise SysbenchError(
                    f"{self.spec.label}: replica {replica} on node {node_name(where)} died and its resources were "
                    f"not placed again within {REPLACEMENT_TIMEOUT_S:.0f} s; no other replica is left"
                )
            log.warning(
                "%s: replica %d cannot be placed again; its sessions move to the others", self.spec.label, replica
            )
            self.retired[replica] = True
            return False
        from ray.exceptions import RayActorError

        self._actors[replica] = self._launch(replica)
        try:
            self._where[replica] = self._await_start(replica)
        except RayActorError as again:
            return self._recover(replica, again)
        return True

    def _discard(self, replica: int) -> None:
        """End a replica and everything it started (its engine's processes too)."""
        actor, self._actors[replica] = self._actors[replica], None
        if actor is not None:
            with contextlib.suppress(Exception):
                self._ray.kill(actor, no_restart=True)
        where = self._where[replica]
        if not where.get("pid"):
            return
        pid, pgid = int(where["pid"]), int(where["pgid"])
        try:
            if where.get("node_id") == self._ray.get_runtime_context().get_node_id():
                kill_replica_processes(pid, pgid)
            else:
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                task = self._ray.remote(kill_replica_processes).options(
                    num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(where["node_id"], soft=False)
                )
                self._ray.get(task.remote(pid, pgid), timeout=KILL_TIMEOUT_S)
        except Exception as error:  # noqa: BLE001 (its node may be gone, and its processes with it)
            log.debug("%s: could not end replica %d's processes on %s: %s", self.spec.label, replica, where, error)

    # --- the record and the end ----------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """The manifest's ``replicas`` field."""
        per_replica = []
        for r in range(self.spec.count):
            where = self._where[r]
            env = self.spec.envs[r] if self.spec.envs else {}
            group = self._groups[r] if r < len(self._groups) else None
            per_replica.append(
                {
                    "replica": r,
                    "placement": {
                        "placement_group": group.id.hex() if group is not None else None,
                        "bundles": self.shape.bundles(),
                        "strategy": self.shape.strategy,
                        "cpus": self.shape.cpus,
                        "gpus": where.get("gpus"),
                        "cuda_visible_devices": where.get("cuda_visible_devices"),
                        **({"vllm_port": env["VLLM_PORT"]} if "VLLM_PORT" in env else {}),
                    },
                    "node": {"hostname": where.get("hostname"), "ip": where.get("ip"), "node_id": where.get("node_id")},
                    "pid": where.get("pid"),
                    "requests": self.requests[r],
                    "restarts": self.restarts[r],
                    "retired": self.retired[r],
                }
            )
        return {
            "backend": "ray",
            "count": self.spec.count,
            "ray_address": self.address or "local",
            "ray_version": getattr(self._ray, "__version__", None),
            "max_restarts": self.spec.max_restarts,
            "restarts": sum(self.restarts),
            "deaths": list(self.deaths),
            "per_replica": per_replica,
        }

    def close(self) -> None:
        """Stop every replica and its processes; stop the local Ray this pool started."""
        if self._closed:
            return
        self._closed = True
        try:
            live = [r for r, actor in enumerate(self._actors) if actor is not None]
            if live and not self._abandoned:
                # Idle replicas close their engines first (vLLM shuts its engine core down); then every tree is killed.
                refs = [self._actors[r].close.remote() for r in live]
                self._ray.wait(refs, num_returns=len(refs), timeout=CLOSE_GRACE_S)
            for r in live:
                self._discard(r)
            from ray.util.placement_group import remove_placement_group

            for group in self._groups:
                with contextlib.suppress(Exception):
                    remove_placement_group(group)
        finally:
            if self._owns_ray:
                self._ray.shutdown()
