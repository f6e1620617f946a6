"""The transformers engine: ``model.generate`` over left-padded batches formed by prompt length.

Prompts are rendered with the tokenizer's chat template, sorted by token length and
cut into chunks of ``batch_size`` so that each batch pads little; completions are
returned in input order. Defaults come from the model's generation config (greedy for
SmolLM2); a ``SamplingSpec`` field overrides only when it is set. ``max_tokens``
falls back to ``DEFAULT_MAX_TOKENS`` because a generation config's ``max_length`` is
usually a tiny library default, not a choice of the model's authors. A ``json_schema``
constrains every reply of the call through xgrammar, as on vLLM (``engines.grammar``).

torch and transformers are imported when an engine is built, never at module import.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Sequence
from typing import Any

from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.progress import stderr_is_terminal
from sysbench_gpu.engines.base import Completion, SamplingSpec
from sysbench_gpu.engines.cpu_threads import choose_cpu_threads
from sysbench_gpu.engines.grammar import SchemaGrammars
from sysbench_gpu.engines.models import resolve_model
from sysbench_gpu.engines.startup import startup_failure
from sysbench_gpu.modeling.key_bias import key_bias
from sysbench_gpu.modeling.registry import attention_modules
from sysbench_gpu.modeling.steering import Steering, text_token_span

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 512
TORCH_DTYPES = {
    "auto": None,
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
}


class HFEngine:
    """transformers ``generate`` behind the ``Engine`` protocol (single process, always primary)."""

    name = "hf"
    is_primary = True

    def __init__(
        self,
        model: str,
        device: str | None = None,
        dtype: str | None = None,
        batch_size: int = 32,
        device_map: str | None = None,
        seed: int | None = None,
        *,
        ignore_eos: bool = False,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        steering: Steering | None = None,
        cpu_threads: int | None = None,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if batch_size < 1:
            raise SysbenchError(f"hf engine: batch_size must be at least 1, got {batch_size}")
        path = resolve_model(model)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        # With a device map the weights land on the GPUs when there are any.
        placement = device if device_map is None else ("cuda" if torch.cuda.is_available() else "cpu")
        dtype_name = _resolve_dtype_name(dtype, placement)
        if cpu_threads is not None and cpu_threads < 1:
            raise SysbenchError(f"hf engine: cpu_threads must be at least 1, got {cpu_threads}")
        threads = choose_cpu_threads(cpu_threads) if placement == "cpu" else None
        if threads is not None and threads.threads is not None:
            torch.set_num_threads(threads.threads)

        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except Exception as error:  # noqa: BLE001 (any load failure becomes one line)
            raise startup_failure(f"hf engine could not load the tokenizer of {model!r}", error) from None
        load_options: dict[str, Any] = {"dtype": getattr(torch, dtype_name)}
        if device_map is not None:
            # accelerate spreads the layers over every visible GPU (and CPU when needed).
            load_options["device_map"] = device_map
        try:
            hf_model = AutoModelForCausalLM.from_pretrained(path, **load_options)
            if device_map is None:
                hf_model.to(device)
        except Exception as error:  # noqa: BLE001 (any load failure becomes one line)
            raise startup_failure(f"hf engine could not load model {model!r}", error) from None
        self._adopt(
            model,
            path,
            hf_model,
            tokenizer,
            device=device,
            dtype_name=dtype_name,
            batch_size=batch_size,
            device_map=device_map,
            seed=seed,
            ignore_eos=ignore_eos,
            default_max_tokens=default_max_tokens,
            steering=steering,
        )
        if threads is not None:
            self.cpu_threads = {"threads": torch.get_num_threads(), "why": threads.why}

    @classmethod
    def from_model(
        cls,
        hf_model: Any,
        tokenizer: Any,
        name: str,
        batch_size: int = 32,
        seed: int | None = None,
        *,
        ignore_eos: bool = False,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        steering: Steering | None = None,
    ) -> HFEngine:
        """An engine around a model already in memory (benchmarks build random-weight models on the device)."""
        if batch_size < 1:
            raise SysbenchError(f"hf engine: batch_size must be at least 1, got {batch_size}")
        engine = cls.__new__(cls)
        device = str(next(hf_model.parameters()).device)
        dtype_name = str(next(hf_model.parameters()).dtype).replace("torch.", "")
        engine._adopt(
            name,
            name,
            hf_model,
            tokenizer,
            device=device,
            dtype_name=dtype_name,
            batch_size=batch_size,
            device_map=None,
            seed=seed,
            ignore_eos=ignore_eos,
            default_max_tokens=default_max_tokens,
            steering=steering,
        )
        return engine

    def _adopt(
        self,
        model: str,
        path: str,
        hf_model: Any,
        tokenizer: Any,
        *,
        device: str,
        dtype_name: str,
        batch_size: int,
        device_map: str | None,
        seed: int | None,
        ignore_eos: bool,
        default_max_tokens: int,
        steering: Steering | None = None,
    ) -> None:
        self.model = model
        self.path = path
        self.batch_size = batch_size
        self.device_map = device_map
        self.seed = seed
        # ignore_eos forces every reply to run to max_tokens (benchmarks that need equal work).
        self.ignore_eos = ignore_eos
        self.default_max_tokens = default_max_tokens
        self.device = device
        self.dtype_name = dtype_name
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            # Many chat models ship without a pad token; eos is masked out anyway.
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.hf_model = hf_model
        self.hf_model.eval()
        self.input_device = str(self.hf_model.device)
        self.eos_ids = _eos_ids(self.hf_model.generation_config, self.tokenizer)
        # JSON-schema grammars, compiled once per schema for this engine's tokenizer (xgrammar, on first use).
        self.grammars = SchemaGrammars(
            self.tokenizer, _vocab_size(hf_model, self.tokenizer), self.eos_ids, self.tokenizer.pad_token_id
        )
        self._system_role: bool | None = None
        self.steering = steering
        self.cpu_threads: dict[str, Any] | None = None  # on a CPU: torch's threads and why (engines.cpu_threads)
        self._n_layers = len(attention_modules(hf_model)) if steering is not None else None
        if steering is not None and steering.active:
            steering.layers(self._n_layers or 0)  # a bad --steer-layers is one line before any generation

    # -- prompts -------------------------------------------------------------------
    def render(self, conversation: Sequence[ChatMessage]) -> str:
        return self.tokenizer.apply_chat_template(list(conversation), tokenize=False, add_generation_prompt=True)

    def prompt_ids(self, conversation: Sequence[ChatMessage]) -> list[int]:
        # The template already holds the special tokens it wants.
        return list(self.tokenizer(self.render(conversation), add_special_tokens=False)["input_ids"])

    def count_prompt_tokens(self, conversation: Sequence[ChatMessage]) -> int | None:
        return len(self.prompt_ids(conversation))

    def supports_system_role(self) -> bool:
        if self._system_role is None:
            probe = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
            try:
                rendered = self.render(probe)
            except Exception:  # jinja2 TemplateError from raise_exception("System role not supported")
                self._system_role = False
            else:
                # A template that silently drops the system message does not support it either.
                self._system_role = "S" in rendered.replace("U", "")
        return self._system_role

    def context_length(self) -> int | None:
        config = self.hf_model.config
        for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
            value = getattr(config, name, None)
            if isinstance(value, int) and value > 0:
                return value
        return None

    # -- generation ------------------------------------------------------------------
    def generation_kwargs(self, sampling: SamplingSpec) -> dict[str, Any]:
        """Arguments for ``generate``: the model's generation config, overridden by what is set."""
        config = self.hf_model.generation_config
        kwargs: dict[str, Any] = {
            "max_new_tokens": sampling.max_tokens if sampling.max_tokens is not None else self.default_max_tokens,
            "do_sample": bool(getattr(config, "do_sample", False)),
            "pad_token_id": self.tokenizer.pad_token_id,
        }
        if sampling.temperature is not None:
            if sampling.temperature <= 0:
                kwargs["do_sample"] = False
            else:
                kwargs["do_sample"] = True
                kwargs["temperature"] = sampling.temperature
        if kwargs["do_sample"]:
            # top_p / top_k only mean something when sampling; greedy ignores them.
            if sampling.top_p is not None:
                kwargs["top_p"] = sampling.top_p
            if sampling.top_k is not None:
                kwargs["top_k"] = sampling.top_k
        else:
            # Keep transformers from warning about sampling fields of a greedy config.
            kwargs.update(temperature=None, top_p=None, top_k=None)
        if sampling.repetition_penalty is not None:
            kwargs["repetition_penalty"] = sampling.repetition_penalty
        if self.ignore_eos or sampling.ignore_eos:
            kwargs["min_new_tokens"] = kwargs["max_new_tokens"]
        return kwargs

    def chat(self, conversations: Sequence[Sequence[ChatMessage]], sampling: SamplingSpec) -> list[Completion]:
        import torch
        from tqdm import tqdm

        if not conversations:
            return []
        schema = sampling.json_schema
        ignore_eos = self.ignore_eos or bool(sampling.ignore_eos)
        if schema is not None:
            if ignore_eos:
                raise SysbenchError(
                    "hf engine: a JSON schema and ignore_eos do not combine (a finished reply can only stop)"
                )
            self.grammars.compiled(schema)  # a schema xgrammar cannot compile fails before any generation
        prompts = [self.prompt_ids(conversation) for conversation in conversations]
        kwargs = self.generation_kwargs(sampling)
        seed = sampling.seed if sampling.seed is not None else self.seed
        if seed is not None:
            torch.manual_seed(seed)
        spans = [self.system_span(c) for c in conversations] if self._steers else [None] * len(prompts)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        chunks = [order[start : start + self.batch_size] for start in range(0, len(order), self.batch_size)]
        results: list[Completion | None] = [None] * len(prompts)
        # No bar in a log file: its \r frames would fill it (the stage's own progress lines cover the wait).
        quiet = len(chunks) < 2 or not stderr_is_terminal()
        for chunk in tqdm(chunks, desc="hf batches", unit="batch", disable=quiet, leave=False):
            batch = self._generate_batch(
                [prompts[i] for i in chunk], kwargs, [spans[i] for i in chunk], ignore_eos, schema
            )
            for index, completion in zip(chunk, batch, strict=False):
                results[index] = completion
        return [completion for completion in results if completion is not None]

    @property
    def _steers(self) -> bool:
        return self.steering is not None and self.steering.active

    def system_span(self, conversation: Sequence[ChatMessage]) -> tuple[int, int] | None:
        """Token span of the system message's text in the rendered prompt (None: the conversation has none)."""
        system = next((m["content"] for m in conversation if m["role"] == "system"), None)
        if not system:
            return None
        return text_token_span(self.tokenizer, self.render(conversation), system)

    def _steered(self, spans: Sequence[tuple[int, int] | None]) -> Any:
        """The steering hook for one batch, or nothing (α = 1, or no row has a system message)."""
        if not self._steers or all(span is None for span in spans):
            return contextlib.nullcontext(None)
        assert self.steering is not None and self._n_layers is not None
        return key_bias(
            self.hf_model,
            self.steering.layers(self._n_layers),
            self.steering.value,
            self.steering.heads_by_layer(self._n_layers),
        )

    def _generate_batch(
        self,
        prompts: list[list[int]],
        kwargs: dict[str, Any],
        spans: Sequence[tuple[int, int] | None] = (),
        ignore_eos: bool = False,  # the engine's or the call's: replies run to max_new_tokens
        schema: dict[str, Any] | None = None,
    ) -> list[Completion]:
        import torch

        if schema is not None:
            from transformers import LogitsProcessorList

            # A fresh processor per batch: its matchers follow this batch's rows.
            kwargs = {**kwargs, "logits_processor": LogitsProcessorList([self.grammars.processor(schema)])}
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id
        pads = [width - len(p) for p in prompts]
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], dtype=torch.long)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
        spans = list(spans) or [None] * len(prompts)
        # Only α != 1 hooks attention; otherwise this is the model's own path, untouched.
        with torch.inference_mode(), self._steered(spans) as bias:
            if bias is not None:  # the spans move right by each row's left padding
                bias.set_spans(
                    [(0, 0) if s is None else (s[0] + p, s[1] + p) for s, p in zip(spans, pads, strict=True)]
                )
            output = self.hf_model.generate(
                input_ids=input_ids.to(self.input_device),
                attention_mask=attention.to(self.input_device),
                **kwargs,
            )
        new_tokens = output[:, width:].tolist()
        completions = []
        for prompt, tokens in zip(prompts, new_tokens, strict=False):
            kept, finish = self._cut_at_eos(tokens, kwargs["max_new_tokens"], ignore_eos)
            completions.append(
                Completion(
                    text=self.tokenizer.decode(kept, skip_special_tokens=True),
                    prompt_tokens=len(prompt),
                    output_tokens=len(kept) + (1 if finish == "stop" else 0),
                    finish_reason=finish,
                )
            )
        return completions

    def _cut_at_eos(self, tokens: list[int], max_new_tokens: int, ignore_eos: bool) -> tuple[list[int], str]:
        """Tokens before the first eos (unless ``ignore_eos``); finish 'stop' when an eos ended it, else 'length'."""
        if not ignore_eos:
            for position, token in enumerate(tokens):
                if token in self.eos_ids:
                    return tokens[:position], "stop"
        return tokens[:max_new_tokens], "length"

    # -- bookkeeping -------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        config = self.hf_model.generation_config
        defaults = {
            "max_tokens": self.default_max_tokens,
            "do_sample": bool(getattr(config, "do_sample", False)),
        }
        for name in ("temperature", "top_p", "top_k", "repetition_penalty"):
            value = getattr(config, name, None)
            if value is not None:
                defaults[name] = value
        return {
            "engine": self.name,
            "model": self.model,
            "path": self.path,
            "device": self.input_device,
            "device_map": self.device_map,
            "dtype": self.dtype_name,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "ignore_eos": self.ignore_eos,
            "padding_side": "left",
            "context_length": self.context_length(),
            "defaults": defaults,
            "steering": None if self.steering is None else self.steering.describe(self._n_layers),
            # What constrains replies to a JSON schema (SamplingSpec.json_schema); None: xgrammar is missing.
            "structured_output": self.grammars.backend,
            "cpu_threads": self.cpu_threads,
        }

    def close(self) -> None:
        import torch

        self.hf_model = None  # type: ignore[assignment]
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _resolve_dtype_name(dtype: str | None, device: str) -> str:
    """bf16 on a GPU, fp32 on the CPU, unless the user named one."""
    if dtype is not None:
        key = dtype.lower()
        if key not in TORCH_DTYPES:
            raise SysbenchError(f"hf engine: unknown dtype {dtype!r} (choose from {', '.join(sorted(TORCH_DTYPES))})")
        if TORCH_DTYPES[key] is not None:
            return TORCH_DTYPES[key]
    return "bfloat16" if str(device).startswith("cuda") else "float32"


def _vocab_size(hf_model: Any, tokenizer: Any) -> int:
    """The width of the model's logits (``config.vocab_size``; a tokenizer can have fewer or more ids)."""
    config = hf_model.config
    size = getattr(config, "vocab_size", None)
    if not isinstance(size, int) and hasattr(config, "get_text_config"):
        size = getattr(config.get_text_config(), "vocab_size", None)
    return size if isinstance(size, int) and size > 0 else len(tokenizer)


def _eos_ids(generation_config: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    value = getattr(generation_config, "eos_token_id", None)
    if isinstance(value, int):
        ids.add(value)
    elif isinstance(value, (list, tuple)):
        ids.update(int(v) for v in value)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids
