"""The ``vllm`` engine: offline ``LLM.chat`` over a whole batch of conversations.

One call per batch: vLLM's scheduler interleaves every conversation, and with
prefix caching (on by default) the history a conversation shares with its previous
turn is served from the KV cache (``Completion.cached_prompt_tokens``).

Layouts (see docs/engines.md and launch/):

* one process, ``tensor_parallel_size`` x ``pipeline_parallel_size`` GPUs (vLLM's
  own workers; ``distributed_executor_backend="ray"`` spans nodes);
* ``distributed_executor_backend="external_launcher"``: started by ``torchrun``;
  every rank builds the same LLM and runs the same batch, and only rank 0
  (``RANK`` in the environment) is ``is_primary`` and writes files;
* ``data_parallel_size=N``: N independent replicas in N worker processes, each on
  its own ``tp * pp`` GPUs (``CUDA_VISIBLE_DEVICES``); a batch is split across
  them and gathered back in input order. A conversation stays on the replica that
  first served its session, so later turns still hit that replica's prefix cache.

``import vllm`` happens only when an engine is built.
"""

from __future__ import annotations

import gc
import hashlib
import importlib
import json
import logging
import multiprocessing
import os
import time
import traceback
from dataclasses import fields
from typing import Any, Callable, Sequence

from sysbench_gpu.engines.base import ChatMessage, Completion, SamplingSpec
from sysbench_gpu.errors import SysbenchError

log = logging.getLogger(__name__)

# When neither the user nor the model's generation_config.json sets a length limit.
# vLLM's own offline default is 16 tokens, far too short for SysBench replies, and
# "up to the context length" lets a looping model run for 32k tokens per turn.
DEFAULT_MAX_TOKENS = 2048

# A system message no template would produce by accident (supports_system_role).
_SYSTEM_PROBE = "SYSBENCH-SYSTEM-ROLE-PROBE-7f3a"

# How long a data-parallel replica may take to load its model before we give up.
REPLICA_START_TIMEOUT_S = 3600.0


def _vllm_version() -> str | None:
    try:
        import vllm

        return getattr(vllm, "__version__", None)
    except ImportError:
        return None


class LocalVLLM:
    """One in-process ``vllm.LLM`` (which may itself drive several GPUs or Ray workers)."""

    def __init__(
        self,
        model: str,
        tensor_parallel_size: int = 1,
        pipeline_parallel_size: int = 1,
        enable_prefix_caching: bool = True,
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.9,
        dtype: str = "auto",
        seed: int = 0,
        distributed_executor_backend: str | None = None,
        enforce_eager: bool = False,
    ) -> None:
        try:
            import vllm
        except ImportError as error:
            raise SysbenchError(
                "the vllm engine needs the vllm package: pip install 'sysbench-gpu[gpu]' "
                "(or 'sysbench-gpu[cpu]' for the CPU build)"
            ) from error
        from sysbench_gpu.models import resolve_model

        self.model_path = resolve_model(model)
        options: dict[str, Any] = dict(
            model=self.model_path,
            tensor_parallel_size=tensor_parallel_size,
            pipeline_parallel_size=pipeline_parallel_size,
            enable_prefix_caching=enable_prefix_caching,
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype,
            seed=seed,
            enforce_eager=enforce_eager,
        )
        if max_model_len is not None:
            options["max_model_len"] = max_model_len
        if distributed_executor_backend is not None:
            options["distributed_executor_backend"] = distributed_executor_backend
        self.options = options
        log.info("vllm %s: loading %s", getattr(vllm, "__version__", "?"), self.model_path)
        self._llm = vllm.LLM(**options)
        self._tokenizer = self._llm.get_tokenizer()
        model_config = self._llm.llm_engine.model_config
        get_diff = getattr(model_config, "get_diff_sampling_param", None)
        # The model's generation_config.json, as vLLM reads it (keys are SamplingParams fields).
        self.model_defaults: dict[str, Any] = dict(get_diff()) if get_diff else {}
        self._max_model_len = int(model_config.max_model_len)
        self._dtype = str(model_config.dtype).replace("torch.", "")
        self._system_role: bool | None = None

    # --- requests ----------------------------------------------------------

    def chat(self, conversations: Sequence[Sequence[ChatMessage]], sampling: SamplingSpec) -> list[Completion]:
        if not conversations:
            return []
        params = self.sampling_params(sampling)
        messages = [[{"role": m["role"], "content": m["content"]} for m in conv] for conv in conversations]
        outputs = self._llm.chat(messages, params, use_tqdm=True)
        return [_completion(output) for output in outputs]

    def sampling_params(self, sampling: SamplingSpec) -> Any:
        """The model's defaults, overridden by every field the user set."""
        from vllm import SamplingParams

        values: dict[str, Any] = dict(self.model_defaults)
        values.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
        for name in ("max_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "seed"):
            value = getattr(sampling, name)
            if value is not None:
                values[name] = value
        if sampling.json_schema is not None:
            values.update(structured_output_option(sampling.json_schema))
        return SamplingParams(**values)

    # --- model facts -------------------------------------------------------

    def render(self, conversation: Sequence[ChatMessage]) -> str:
        return self._tokenizer.apply_chat_template(
            [dict(m) for m in conversation], tokenize=False, add_generation_prompt=True
        )

    def count_prompt_tokens(self, conversation: Sequence[ChatMessage]) -> int:
        # vLLM's chat path renders the template to text, then tokenizes it without
        # adding special tokens again (the template already has them).
        return len(self._tokenizer.encode(self.render(conversation), add_special_tokens=False))

    def supports_system_role(self) -> bool:
        if self._system_role is None:
            probe = [{"role": "system", "content": _SYSTEM_PROBE}, {"role": "user", "content": "hello"}]
            try:
                self._system_role = _SYSTEM_PROBE in self.render(probe)  # type: ignore[arg-type]
            except Exception as error:  # noqa: BLE001 (jinja raises for a rejected role)
                log.info("chat template rejects a system message: %s", error)
                self._system_role = False
        return self._system_role

    def context_length(self) -> int:
        return self._max_model_len

    def runtime_info(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path,
            "max_model_len": self._max_model_len,
            "dtype": self._dtype,
            "model_default_sampling": self.model_defaults,
            "vllm_version": _vllm_version(),
        }

    def close(self) -> None:
        llm = getattr(self, "_llm", None)
        if llm is None:
            return
        self._llm = None
        engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        shutdown = getattr(engine_core, "shutdown", None)
        if callable(shutdown):
            try:
                shutdown()
            except Exception as error:  # noqa: BLE001 (best effort at exit)
                log.debug("vllm shutdown: %s", error)
        del llm
        gc.collect()


def structured_output_option(schema: dict[str, Any]) -> dict[str, Any]:
    """The SamplingParams keyword that constrains decoding to a JSON schema, for the installed vLLM."""
    import vllm.sampling_params as sp

    params_cls = getattr(sp, "StructuredOutputsParams", None)  # vLLM >= 0.10.2
    keyword = "structured_outputs"
    if params_cls is None:
        params_cls = getattr(sp, "GuidedDecodingParams", None)  # older releases
        keyword = "guided_decoding"
    if params_cls is None:
        raise SysbenchError(
            f"vllm {_vllm_version()}: this version has no JSON-schema constrained decoding; "
            "upgrade vllm or use a judge without --json-schema"
        )
    options: dict[str, Any] = {"json": schema}
    # Small models loop on whitespace between JSON tokens; compact JSON loses nothing.
    if any(f.name == "disable_any_whitespace" for f in fields(params_cls)):
        options["disable_any_whitespace"] = True
    return {keyword: params_cls(**options)}


def _completion(output: Any) -> Completion:
    choice = output.outputs[0]
    extra: dict[str, Any] = {}
    if choice.stop_reason is not None:
        extra["stop_reason"] = choice.stop_reason
    return Completion(
        text=choice.text,
        prompt_tokens=len(output.prompt_token_ids) if output.prompt_token_ids is not None else None,
        output_tokens=len(choice.token_ids),
        cached_prompt_tokens=getattr(output, "num_cached_tokens", None),
        finish_reason=choice.finish_reason,
        extra=extra,
    )


# --- data-parallel replicas ------------------------------------------------------


def session_key(conversation: Sequence[ChatMessage]) -> str:
    """What stays the same across a session's turns: its first two messages (system + first user)."""
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


def _load_factory(reference: str) -> Callable[..., Any]:
    module_name, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def _serve_replica(conn: Any, factory: str, options: dict[str, Any], env: dict[str, str]) -> None:
    """A replica process: build the backend, then answer (method, args) messages until 'close'."""
    os.environ.update(env)
    try:
        backend = _load_factory(factory)(**options)
        conn.send(("ready", None))
    except BaseException as error:  # noqa: BLE001 (report any start-up failure to the parent)
        conn.send(("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))
        return
    while True:
        try:
            method, args = conn.recv()
        except EOFError:  # the parent died
            method, args = "close", ()
        if method == "close":
            backend.close()
            try:
                conn.send(("ok", None))
            except (BrokenPipeError, OSError):
                pass
            return
        try:
            conn.send(("ok", getattr(backend, method)(*args)))
        except BaseException as error:  # noqa: BLE001 (the parent raises it)
            message = str(error) if isinstance(error, SysbenchError) else f"{type(error).__name__}: {error}"
            conn.send(("error", message))


class ReplicaPool:
    """N long-lived worker processes, each with its own backend; calls are fanned out and gathered.

    ``factory`` is ``"module:callable"`` (importable in a spawned process); ``envs`` gives
    each replica its environment (its ``CUDA_VISIBLE_DEVICES``).
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
                    target=_serve_replica, args=(child_end, factory, options, dict(env)),
                    name=f"vllm-replica-{index}", daemon=False,
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

    def chat(self, conversations: Sequence[Sequence[ChatMessage]], sampling: SamplingSpec) -> list[Completion]:
        placement = assign_replicas([session_key(c) for c in conversations], self.size, self.sticky)
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
            for position, completion in zip(shards[replica], completions):
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
                raise SysbenchError(f"vllm data-parallel replica {index}: no answer after {timeout_s:.0f} s while {doing}")
        try:
            status, value = connection.recv()
        except EOFError as error:
            raise SysbenchError(f"vllm data-parallel replica {index} closed its pipe while {doing}") from error
        if status == "error":
            raise SysbenchError(f"vllm data-parallel replica {index} failed while {doing}: {value}")
        return value

    def close(self) -> None:
        for connection, process in zip(self._connections, self._processes):
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


# --- the public engine ----------------------------------------------------------


class VLLMEngine:
    """The ``vllm`` engine (see the module docstring for the layouts)."""

    name = "vllm"

    def __init__(
        self,
        model: str,
        tensor_parallel_size: int = 1,
        pipeline_parallel_size: int = 1,
        data_parallel_size: int = 1,
        enable_prefix_caching: bool = True,
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.9,
        dtype: str = "auto",
        seed: int = 0,
        distributed_executor_backend: str | None = None,
        enforce_eager: bool = False,
        *,
        replica_factory: str = "sysbench_gpu.engines.vllm_engine:LocalVLLM",
    ) -> None:
        for label, value in (
            ("tensor_parallel_size", tensor_parallel_size),
            ("pipeline_parallel_size", pipeline_parallel_size),
            ("data_parallel_size", data_parallel_size),
        ):
            if value < 1:
                raise SysbenchError(f"vllm engine: {label} must be >= 1, got {value}")
        if not 0 < gpu_memory_utilization <= 1:
            raise SysbenchError(f"vllm engine: gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        if data_parallel_size > 1 and distributed_executor_backend in ("external_launcher", "ray"):
            raise SysbenchError(
                f"vllm engine: data_parallel_size > 1 runs replicas on this node and cannot be combined with "
                f"distributed_executor_backend={distributed_executor_backend!r}; use tensor/pipeline parallel there"
            )
        self.model = model
        self.settings: dict[str, Any] = dict(
            tensor_parallel_size=tensor_parallel_size,
            pipeline_parallel_size=pipeline_parallel_size,
            data_parallel_size=data_parallel_size,
            enable_prefix_caching=enable_prefix_caching,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype,
            seed=seed,
            distributed_executor_backend=distributed_executor_backend,
            enforce_eager=enforce_eager,
        )
        # Under torchrun every rank runs this code; rank 0 alone writes files.
        self.is_primary = (
            int(os.environ.get("RANK", "0")) == 0 if distributed_executor_backend == "external_launcher" else True
        )
        replica_options = {k: v for k, v in self.settings.items() if k != "data_parallel_size"}
        replica_options["model"] = model
        self._local: Any = None
        self._pool: ReplicaPool | None = None
        self._device_groups: list[list[str]] | None = None
        if data_parallel_size == 1:
            self._local = _load_factory(replica_factory)(**replica_options)
        else:
            envs = self._replica_envs(data_parallel_size, tensor_parallel_size * pipeline_parallel_size)
            log.info("vllm engine: starting %d data-parallel replicas", data_parallel_size)
            self._pool = ReplicaPool(replica_factory, replica_options, envs)
        self._info: dict[str, Any] = self._call("runtime_info")

    def _replica_envs(self, replicas: int, per_replica: int) -> list[dict[str, str]]:
        gpus = visible_gpus()
        if not gpus:
            log.warning("vllm engine: no GPU visible; %d replicas share the CPU", replicas)
            return [{} for _ in range(replicas)]
        self._device_groups = replica_device_groups(replicas, per_replica, gpus)
        return [{"CUDA_VISIBLE_DEVICES": ",".join(group)} for group in self._device_groups]

    def _call(self, method: str, *args: Any) -> Any:
        if self._pool is not None:
            return self._pool.call(0, method, *args)  # every replica holds the same model
        return getattr(self._local, method)(*args)

    # --- Engine protocol -----------------------------------------------------

    def chat(self, conversations: Sequence[Sequence[ChatMessage]], sampling: SamplingSpec) -> list[Completion]:
        if self._pool is not None:
            return self._pool.chat(conversations, sampling)
        return self._local.chat(conversations, sampling)

    def count_prompt_tokens(self, conversation: Sequence[ChatMessage]) -> int | None:
        return self._call("count_prompt_tokens", [dict(m) for m in conversation])

    def supports_system_role(self) -> bool:
        return bool(self._call("supports_system_role"))

    def context_length(self) -> int | None:
        return self._info.get("max_model_len")

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {"engine": self.name, "model": self.model, **self.settings, **self._info}
        # What a SamplingSpec field left at None becomes: the model's generation config,
        # and DEFAULT_MAX_TOKENS where that config sets no length.
        described["defaults"] = {"max_tokens": DEFAULT_MAX_TOKENS, **self._info.get("model_default_sampling", {})}
        if self._device_groups is not None:
            described["replica_gpus"] = [",".join(g) for g in self._device_groups]
        return described

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._local is not None:
            self._local.close()
            self._local = None
