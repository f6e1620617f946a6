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
* ``data_parallel_size=N``: N independent replicas as Ray actors (``engines.ray_pool``),
  each on its own ``tp * pp`` GPUs (a placement group per replica, anywhere in the
  cluster: ``ray_address``) and port range; a batch is split across them by session and
  gathered back in input order.

Memory is sized from what is free (``engines.vllm_memory``); a start-up failure is one
line naming the root cause and what to change, with vLLM's own output in a log file
(``engines.startup``). ``import vllm`` happens only when an engine is built.
"""

from __future__ import annotations

import gc
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from sysbench_gpu.core.arguments import check_replica_flags
from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.progress import stderr_is_terminal
from sysbench_gpu.engines.base import Completion, SamplingSpec
from sysbench_gpu.engines.models import cache_dir, resolve_model
from sysbench_gpu.engines.ray_pool import RayReplicaPool, ReplicaSpec
from sysbench_gpu.engines.replicas import DEFAULT_MAX_RESTARTS, load_factory, replica_port_bases
from sysbench_gpu.engines.startup import (
    capture_output,
    startup_failure,
    startup_log_path,
)
from sysbench_gpu.engines.vllm_memory import (
    on_cpu_platform,
    plan_memory,
    read_node_memory,
    weights_bytes,
)

log = logging.getLogger(__name__)

# When neither the user nor the model's generation_config.json sets a length limit.
# vLLM's own offline default is 16 tokens, far too short for SysBench replies, and
# "up to the context length" lets a looping model run for 32k tokens per turn.
DEFAULT_MAX_TOKENS = 2048

# A system message no template would produce by accident (supports_system_role).
_SYSTEM_PROBE = "SYSBENCH-SYSTEM-ROLE-PROBE-7f3a"


def batch_invariance(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """Whether a seeded reply is independent of the rest of the batch, for the manifest.

    vLLM is batch-invariant only with ``VLLM_BATCH_INVARIANT=1`` (on GPUs that support
    its invariant kernels); otherwise the batch's composition changes reduction orders,
    and with them a seeded reply.
    """
    raw = environ.get("VLLM_BATCH_INVARIANT")
    try:
        enabled = bool(int(raw)) if raw not in (None, "") else False
    except ValueError:
        enabled = False
    return {"VLLM_BATCH_INVARIANT": raw, "batch_invariant": enabled}


def _startup_log(folder: Path) -> Path | None:
    """A log file for vLLM's output: in ``folder``, else the temp folder, else none (output stays on the terminal)."""
    for candidate in (folder, Path(tempfile.gettempdir()) / "sysbench-gpu-logs"):
        try:
            return startup_log_path(candidate, "vllm")
        except OSError as error:
            log.debug("cannot keep vLLM's log in %s: %s", candidate, error)
    return None


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
        gpu_memory_utilization: float | None = None,
        dtype: str = "auto",
        seed: int = 0,
        distributed_executor_backend: str | None = None,
        enforce_eager: bool = False,
        kv_cache_memory_bytes: int | None = None,
        startup_log_dir: str | None = None,
        replicas_sharing_memory: int = 1,
        max_num_batched_tokens: int | None = None,
        max_num_seqs: int | None = None,
    ) -> None:
        try:
            import vllm
        except ImportError as error:
            raise SysbenchError(
                "the vllm engine needs the vllm package: pip install 'sysbench-gpu[gpu]' "
                "(or 'sysbench-gpu[cpu]' for the CPU build)"
            ) from error

        self.model_path = resolve_model(model)
        on_cpu = on_cpu_platform()
        self.memory = plan_memory(
            on_cpu=on_cpu,
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            environ=os.environ,
            node=read_node_memory() if on_cpu else None,
            weights_bytes=weights_bytes(self.model_path),
            replicas=replicas_sharing_memory,
        )
        options: dict[str, Any] = dict(
            model=self.model_path,
            tensor_parallel_size=tensor_parallel_size,
            pipeline_parallel_size=pipeline_parallel_size,
            enable_prefix_caching=enable_prefix_caching,
            dtype=dtype,
            seed=seed,
            enforce_eager=enforce_eager,
            **self.memory.engine_args,
        )
        if max_model_len is not None:
            options["max_model_len"] = max_model_len
        # The scheduler's budget; unset, vLLM picks it by entry point (LLM(...) gets more than `vllm serve`).
        if max_num_batched_tokens is not None:
            options["max_num_batched_tokens"] = max_num_batched_tokens
        if max_num_seqs is not None:
            options["max_num_seqs"] = max_num_seqs
        if distributed_executor_backend is not None:
            options["distributed_executor_backend"] = distributed_executor_backend
        self.options = options
        # vLLM's own start-up output (and its engine core's, for the engine's life) goes to a
        # log file, unless --verbose asked to see everything.
        self.startup_log: Path | None = None
        if not logging.getLogger().isEnabledFor(logging.DEBUG):
            self.startup_log = _startup_log(Path(startup_log_dir) if startup_log_dir else cache_dir() / "logs")
        log.info(
            "vllm %s: loading %s; memory: %s%s",
            getattr(vllm, "__version__", "?"),
            self.model_path,
            self.memory.summary(),
            f"; vLLM's output goes to {self.startup_log}" if self.startup_log else "",
        )
        try:
            with capture_output(self.startup_log):
                self._llm = vllm.LLM(**options)
        except BaseException as error:  # noqa: BLE001 (any start-up failure becomes one line)
            if isinstance(error, KeyboardInterrupt):
                raise
            raise startup_failure(f"vllm engine for {model!r} failed to start", error, self.startup_log) from None
        self._tokenizer = self._llm.get_tokenizer()
        model_config = self._llm.llm_engine.model_config
        get_diff = getattr(model_config, "get_diff_sampling_param", None)
        # The model's generation_config.json, as vLLM reads it (keys are SamplingParams fields).
        self.model_defaults: dict[str, Any] = dict(get_diff()) if get_diff else {}
        self._max_model_len = int(model_config.max_model_len)
        self._dtype = str(model_config.dtype).replace("torch.", "")
        self._engine_config = engine_config(self._llm)
        self._system_role: bool | None = None

    # --- requests ----------------------------------------------------------

    def chat(self, conversations: Sequence[Sequence[ChatMessage]], sampling: SamplingSpec) -> list[Completion]:
        if not conversations:
            return []
        params = self.sampling_params(sampling)
        messages = [[{"role": m["role"], "content": m["content"]} for m in conv] for conv in conversations]
        # vLLM's bar only where a terminal draws it; in a log file the stage's progress lines stand in.
        outputs = self._llm.chat(messages, params, use_tqdm=stderr_is_terminal())
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
        if sampling.ignore_eos:
            values["ignore_eos"] = True
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
            "memory": self.memory.describe(),
            "engine_config": self._engine_config,
            "startup_log": str(self.startup_log) if self.startup_log else None,
        }

    def close(self) -> None:
        llm = getattr(self, "_llm", None)
        if llm is None:
            return
        self._llm = None
        engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        shutdown = getattr(engine_core, "shutdown", None)
        # vLLM reports its shutdown on stdout: that goes to the same log as its start-up.
        with capture_output(self.startup_log):
            if callable(shutdown):
                try:
                    shutdown()
                except Exception as error:  # noqa: BLE001 (best effort at exit)
                    log.debug("vllm shutdown: %s", error)
            del llm
            gc.collect()


# What the engine really runs with, read back from vLLM's resolved configuration (the platform and the
# entry point may change what was asked for): section -> fields of vllm_config.<section>.
ENGINE_CONFIG_FIELDS: dict[str, tuple[str, ...]] = {
    "scheduler_config": ("max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill"),
    "cache_config": (
        "enable_prefix_caching",
        "kv_cache_memory_bytes",
        "kv_cache_size_tokens",
        "num_gpu_blocks",
        "block_size",
        "cache_dtype",
    ),
    "model_config": ("dtype", "max_model_len"),
}


def engine_config(llm: Any) -> dict[str, Any]:
    """The settings the engine runs with, from ``llm.llm_engine.vllm_config`` (None where a field is missing)."""
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    found: dict[str, Any] = {}
    for section, names in ENGINE_CONFIG_FIELDS.items():
        part = getattr(config, section, None)
        for name in names:
            value = getattr(part, name, None)
            found[name] = value if value is None or isinstance(value, (bool, int, float)) else str(value)
    if isinstance(found.get("dtype"), str):
        found["dtype"] = found["dtype"].replace("torch.", "")
    return found


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
        gpu_memory_utilization: float | None = None,
        dtype: str = "auto",
        seed: int = 0,
        distributed_executor_backend: str | None = None,
        enforce_eager: bool = False,
        kv_cache_memory_bytes: int | None = None,
        startup_log_dir: str | None = None,
        max_num_batched_tokens: int | None = None,
        max_num_seqs: int | None = None,
        ray_address: str | None = None,
        *,
        replica_factory: str = "sysbench_gpu.engines.vllm_engine:LocalVLLM",
        max_replica_restarts: int = DEFAULT_MAX_RESTARTS,
    ) -> None:
        for label, value in (
            ("tensor_parallel_size", tensor_parallel_size),
            ("pipeline_parallel_size", pipeline_parallel_size),
            ("data_parallel_size", data_parallel_size),
        ):
            if value < 1:
                raise SysbenchError(f"vllm engine: {label} must be >= 1, got {value}")
        if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
            raise SysbenchError(f"vllm engine: gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        for label, count in (("max_num_batched_tokens", max_num_batched_tokens), ("max_num_seqs", max_num_seqs)):
            if count is not None and count < 1:
                raise SysbenchError(f"vllm engine: {label} must be >= 1, got {count}")
        if kv_cache_memory_bytes is not None and kv_cache_memory_bytes <= 0:
            raise SysbenchError(f"vllm engine: kv_cache_memory_bytes must be positive, got {kv_cache_memory_bytes}")
        if data_parallel_size > 1 and distributed_executor_backend == "external_launcher":
            raise SysbenchError(
                "vllm engine: data_parallel_size > 1 runs replicas as Ray actors and cannot be combined with "
                "distributed_executor_backend='external_launcher' (torchrun starts every rank itself)"
            )
        address = check_replica_flags(data_parallel_size, ray_address, "data_parallel_size", "ray_address")
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
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
        )
        # Under torchrun every rank runs this code; rank 0 alone writes files.
        self.is_primary = (
            int(os.environ.get("RANK", "0")) == 0 if distributed_executor_backend == "external_launcher" else True
        )
        replica_options = {k: v for k, v in self.settings.items() if k != "data_parallel_size"}
        replica_options["model"] = model
        if startup_log_dir is not None:
            replica_options["startup_log_dir"] = startup_log_dir
        if data_parallel_size > 1:
            # Replicas start together and read the same free memory: each sizes its share.
            replica_options["replicas_sharing_memory"] = data_parallel_size
            if distributed_executor_backend is None and tensor_parallel_size * pipeline_parallel_size > 1:
                # Inside a Ray placement group vLLM would default to its Ray executor and wait for GPU
                # bundles the replica's actor already holds; its own worker processes use those GPUs.
                replica_options["distributed_executor_backend"] = "mp"
        self._local: Any = None
        self._pool: RayReplicaPool | None = None
        if data_parallel_size == 1:
            self._local = load_factory(replica_factory)(**replica_options)
        else:
            spec = ReplicaSpec(
                label="vllm engine",
                factory=replica_factory,
                options=replica_options,
                count=data_parallel_size,
                cpus=1,
                gpus=tensor_parallel_size * pipeline_parallel_size,
                # vLLM's Ray executor places its own workers in the replica's GPU bundles (PP may span nodes).
                gpu_bundles=distributed_executor_backend == "ray",
                envs=tuple({"VLLM_PORT": str(port)} for port in replica_port_bases(data_parallel_size, os.environ)),
                max_restarts=max_replica_restarts,
            )
            self._pool = RayReplicaPool(spec, address)
        try:
            self._info: dict[str, Any] = self._call("runtime_info")
        except BaseException:
            self.close()
            raise

    def _call(self, method: str, *args: Any) -> Any:
        if self._pool is not None:
            return self._pool.call(method, *args)  # every replica holds the same model
        return getattr(self._local, method)(*args)

    # --- Engine protocol -----------------------------------------------------

    def chat(
        self,
        conversations: Sequence[Sequence[ChatMessage]],
        sampling: SamplingSpec,
        session_keys: Sequence[str] | None = None,
    ) -> list[Completion]:
        """``session_keys`` (one per conversation, e.g. the session id) keep a session on one replica."""
        if self._pool is not None:
            return self._pool.chat(conversations, sampling, session_keys)
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
        # Replicas inherit this process's environment, so one record holds for all of them.
        described.update(batch_invariance())
        if self._pool is not None:
            described["replicas"] = self._pool.describe()  # placement, node, requests and restarts of each
        return described

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._local is not None:
            self._local.close()
            self._local = None
