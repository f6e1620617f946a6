"""Attention share capture through transformers' attention interface: the context manager.

``AttentionShareCapture`` switches a transformers model to a registered attention
function that wraps the model's normal path (SDPA, or the model file's own eager
function when the model runs eager). Layers that are not captured run that path
unchanged. At a captured layer (``module.layer_idx``) one of two paths runs:

* kernel-LSE (SDPA models): the layer's output comes from a kernel that also returns
  every row's log-sum-exp (``kernels``: PyTorch's CPU flash kernel, which SDPA itself
  runs on the CPU; on CUDA flash-attn or PyTorch's flash / memory-efficient kernels); the
  model gets that output, and the shares cost only the span's keys
  (``share = exp(LSE_span - LSE_all)``, ``span_math.span_share_given_lse``);
* fallback (eager models, or where no kernel applies): the model's own call runs, and
  ``span_math.span_share`` recomputes each row's log-sum-exp over all keys in chunks.

The shares describe the attention the model ran: transformers' SDPA path ignores
logit softcapping (Gemma 2), so on SDPA the shares have none either (logged); eager
applies it, and so does the fallback there. ``paths`` records per layer which path ran.
On exit the model's attention implementation is restored and every attribute removed.

No model-specific code: anything that calls
``ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, ...)`` works
(Llama, Qwen2, Mistral, Gemma, GLM-4, ...). A model that bypasses the interface is
detected (its layers never report) and refused with a clear error.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sysbench_gpu.attention.capture.chunks import DEFAULT_BUDGET_BYTES, plan_chunks
from sysbench_gpu.attention.capture.kernels import KernelInputs, choose_kernel
from sysbench_gpu.attention.capture.layer_call import _LayerCall, _span_hull
from sysbench_gpu.attention.capture.layers import attention_modules, num_layers, resolve_layers
from sysbench_gpu.attention.capture.span_math import eager_reference_shares, span_share, span_share_given_lse
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.modeling.key_bias import apply_key_bias
from sysbench_gpu.modeling.registry import attention_implementation

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "AttentionShareCapture",
    "LayerShares",
    "attention_modules",
    "eager_reference_shares",
    "num_layers",
    "resolve_layers",
]

log = logging.getLogger(__name__)

CAPTURE_ATTR = "_sysbench_share_sink"
IMPL_PREFIX = "sysbench_share_"
PATHS = ("auto", "fallback")  # auto: kernel-LSE where a kernel applies; fallback: always the chunked recomputation


# ----------------------------------------------------------------- registration


def _registered_name(base: str) -> str:
    return IMPL_PREFIX + base


def _make_capture_function(base: str):
    """The attention function registered for ``base``: the base path, or the capture's own call at captured layers."""

    def capture_attention(module, query, key, value, attention_mask, **kwargs):
        base_fn = _base_function(module, base)
        # A key bias (steering, knockout) active on this module is part of the attention the capture measures.
        attention_mask = apply_key_bias(module, query, key, attention_mask)
        sink = getattr(module, CAPTURE_ATTR, None)
        if sink is None:
            return base_fn(module, query, key, value, attention_mask, **kwargs)
        return sink.attend(module, base, base_fn, query, key, value, attention_mask, kwargs)

    capture_attention.__name__ = f"sysbench_share_over_{base}"
    return capture_attention


def _base_function(module: Any, base: str):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if base == "eager":
        # The model file's own eager function (it may carry softcapping, sinks, ...).
        model_file = sys.modules.get(type(module).__module__)
        function = getattr(model_file, "eager_attention_forward", None)
        if function is None:
            raise SysbenchError(
                f"{type(module).__name__}: its model file has no eager_attention_forward; load the model with SDPA"
            )
        return function
    return ALL_ATTENTION_FUNCTIONS[base]


def register_capture_attention(base: str) -> str:
    """Register (idempotently) the capture function over ``base`` and its mask function; return its name."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = _registered_name(base)
    if name not in ALL_ATTENTION_FUNCTIONS._global_mapping:
        ALL_ATTENTION_FUNCTIONS.register(name, _make_capture_function(base))
    if name not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        # The wrapped path needs exactly the mask its own implementation would get.
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS._global_mapping[base])
    return name


# ----------------------------------------------------------------- capture


@dataclass
class LayerSink:
    """Attached to one captured attention module: runs that layer's attention and keeps its span shares."""

    layer: int
    capture: AttentionShareCapture

    def attend(
        self,
        module: Any,
        base: str,
        base_fn: Any,
        query: Any,
        key: Any,
        value: Any,
        attention_mask: Any,
        kwargs: dict[str, Any],
    ) -> Any:
        return self.capture._attend(self.layer, module, base, base_fn, query, key, value, attention_mask, kwargs)


class _StopForward(Exception):
    """Raised after the deepest selected layer when the rest of the forward is not needed."""


@dataclass
class LayerShares:
    mean: torch.Tensor  # [B, T, n_spans] fp32, mean over heads
    per_head: torch.Tensor | None = None  # [B, H, T, n_spans]


@dataclass
class AttentionShareCapture:
    """Context manager: capture span shares at ``layers`` while the model runs normally.

    >>> with AttentionShareCapture(model, layers=[15], spans=[(0, 3), (3, 120)]) as capture:
    ...     model(input_ids)
    >>> capture.results[15].mean  # [1, T, 2]
    """

    model: Any
    layers: Sequence[int]
    spans: Sequence[tuple[int, int]] = ()
    chunk_tokens: int | None = None
    budget_bytes: int = DEFAULT_BUDGET_BYTES
    per_head: bool = False
    path: str = "auto"  # auto: kernel-LSE where a kernel applies, else fallback; fallback: always the chunked path
    results: dict[int, LayerShares] = field(default_factory=dict)
    _paths: dict[int, list[str]] = field(default_factory=dict, repr=False)
    _implementation: ExitStack = field(default_factory=ExitStack, repr=False)
    _sinks: list[Any] = field(default_factory=list, repr=False)
    _stop_after: int | None = field(default=None, repr=False)
    active: bool = field(default=False, repr=False)

    @property
    def paths(self) -> dict[int, str]:
        """Per captured layer, how its shares were computed (every distinct way seen, joined by " | ")."""
        return {layer: " | ".join(ways) for layer, ways in self._paths.items()}

    # -- context -----------------------------------------------------------------
    def __enter__(self) -> AttentionShareCapture:
        model = self.model
        if self.path not in PATHS:
            raise SysbenchError(f"capture path {self.path!r} is not one of {', '.join(PATHS)}")
        if not hasattr(model, "set_attn_implementation") or not hasattr(model, "config"):
            raise SysbenchError(
                f"{type(model).__name__} is not a transformers PreTrainedModel; cannot capture attention"
            )
        if hasattr(type(model), "_can_set_attn_implementation") and not type(model)._can_set_attn_implementation():
            raise SysbenchError(
                f"{type(model).__name__} does not route attention through transformers' AttentionInterface "
                "(its attention modules compute attention themselves); attention capture is not supported for it"
            )
        modules = attention_modules(model)
        missing = sorted(set(self.layers) - set(modules))
        if missing:
            raise SysbenchError(
                f"{type(model).__name__}: no attention module with layer_idx {missing} "
                f"(found {len(modules)}); the model does not expose transformers-style attention layers"
            )
        current = model.config._attn_implementation
        # Under a key bias (modeling.key_bias) the base is SDPA, and the capture function applies the bias itself.
        base = current if current in ("sdpa", "eager") else "sdpa"
        if base != current:
            log.info("attention capture wraps SDPA (the model was loaded with %s)", current)
        name = register_capture_attention(base)
        self._implementation = ExitStack()
        try:
            # The switch and its undo are modeling.registry's, shared with knockout and steering.
            self._implementation.enter_context(attention_implementation(model, name))
            for layer in self.layers:
                module = modules[layer]
                setattr(module, CAPTURE_ATTR, LayerSink(layer, self))
                self._sinks.append(module)
        except BaseException:
            self._restore()
            raise
        self.active = True
        self.results = {}
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._restore()

    def _restore(self) -> None:
        for module in self._sinks:
            if CAPTURE_ATTR in module.__dict__:
                delattr(module, CAPTURE_ATTR)
        self._sinks = []
        self._implementation.close()
        self.active = False

    # -- use -----------------------------------------------------------------------
    def prepare(self, spans: Sequence[tuple[int, int]]) -> None:
        """Set the key spans for the next forward and clear earlier results."""
        self.spans = [(int(a), int(b)) for a, b in spans]
        self.results = {}

    def forward(self, input_ids: torch.Tensor, stop_early: bool = True) -> dict[int, LayerShares]:
        """One teacher-forced forward (no cache, one logit kept); stops after the deepest selected layer."""
        import torch

        if not self.active:
            raise SysbenchError("AttentionShareCapture.forward called outside its `with` block")
        self.results = {}
        self._stop_after = max(self.layers) if stop_early else None
        try:
            with torch.inference_mode():
                self.model(input_ids=input_ids, use_cache=False, logits_to_keep=1)
        except _StopForward:
            pass
        finally:
            self._stop_after = None
        self.check_complete()
        return self.results

    def check_complete(self) -> None:
        missing = sorted(set(self.layers) - set(self.results))
        if missing:
            raise SysbenchError(
                f"{type(self.model).__name__}: layer(s) {missing} never called transformers' attention interface "
                "during the forward; this model bypasses it and is not supported"
            )

    def _attend(
        self,
        layer: int,
        module: Any,
        base: str,
        base_fn: Any,
        query: Any,
        key: Any,
        value: Any,
        attention_mask: Any,
        kwargs: dict[str, Any],
    ) -> Any:
        """One captured layer: its attention output for the model, and its span shares into ``results``."""
        call = _LayerCall.read(layer, module, base, attention_mask, kwargs)
        plan_heads = query.shape[0] * query.shape[1]
        choice = choose_kernel(query, key, value, call.mask, base) if self.path == "auto" else None
        kernel = None
        if choice is not None and choice.function is not None:
            try:
                kernel = choice.function(
                    query, key, value, call.mask, KernelInputs(call.scale, call.sdpa_is_causal(query))
                )
            # A kernel this GPU or build lacks: keep the model's call.
            except (RuntimeError, ValueError, ImportError) as error:
                reason = f"{choice.name} failed: {str(error).splitlines()[0][:200]}"
                log.warning("layer %d: %s; using the fallback path", layer, reason)
                choice = None
                self._note(layer, f"fallback ({reason})")
        if kernel is not None:
            plan = plan_chunks(
                1,
                plan_heads,
                query.shape[2],
                _span_hull(self.spans, key.shape[2]),
                self.budget_bytes,
                self.chunk_tokens,
                query.device.type,
            )
            shares = span_share_given_lse(
                query,
                key,
                self.spans,
                kernel.lse,
                scale=call.scale,
                q_chunk=plan.q_chunk,
                k_chunk=plan.k_chunk,
                causal=call.causal,
                mask=call.mask,
            )
            output: Any = (kernel.output, None)
            self._note(layer, f"kernel-lse ({choice.name}){call.note}")
        else:
            output = base_fn(module, query, key, value, attention_mask, **kwargs)
            plan = plan_chunks(
                1, plan_heads, query.shape[2], key.shape[2], self.budget_bytes, self.chunk_tokens, query.device.type
            )
            shares = span_share(
                query,
                key,
                self.spans,
                scale=call.scale,
                q_chunk=plan.q_chunk,
                k_chunk=plan.k_chunk,
                causal=call.causal,
                softcap=call.softcap,
                mask=call.mask,
            )
            if choice is not None or self.path == "fallback":
                why = "requested" if self.path == "fallback" else choice.reason
                self._note(layer, f"fallback ({why}){call.note}")
        self.results[layer] = LayerShares(
            mean=shares.mean(dim=1).cpu(), per_head=shares.cpu() if self.per_head else None
        )
        if self._stop_after is not None and layer >= self._stop_after and set(self.layers) <= set(self.results):
            raise _StopForward()
        return output

    def _note(self, layer: int, description: str) -> None:
        """Record how a layer's shares were made (each distinct way once, logged the first time)."""
        known = self._paths.setdefault(layer, [])
        if description not in known:
            level = logging.WARNING if "not applied" in description else logging.INFO
            log.log(level, "attention capture, layer %d: %s", layer, description)
            known.append(description)
