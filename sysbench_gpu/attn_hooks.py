"""Attention share of key spans, captured through transformers' attention interface.

Two parts:

* ``span_share``: pure torch math. For every query q and key span S it returns
  ``sum_{k in S, k visible from q} softmax_k(q . k * scale)``, computed with an
  online log-sum-exp over key chunks and queries processed in chunks, so the peak
  extra memory is O(heads x q_chunk x k_chunk), never heads x T x T. Grouped-query
  attention is handled by viewing queries as [B, KV heads, group, T, D]; keys are
  never repeated. Accumulation is fp32.

* ``AttentionShareCapture``: a context manager that switches a transformers model
  to a registered attention function wrapping the model's normal path (SDPA, or the
  model file's own eager function when the model runs eager), so outputs are
  unchanged; at the selected layers (``module.layer_idx``) it feeds the post-RoPE
  queries and keys to ``span_share``. On exit it always restores the model's
  attention implementation and removes every attribute it set.

No model-specific code: anything that calls
``ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, ...)`` works
(Llama, Qwen2, Mistral, Gemma, GLM-4, ...). A model that bypasses the interface is
detected (its layers never report) and refused with a clear error.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from sysbench_gpu.errors import SysbenchError

if TYPE_CHECKING:  # pragma: no cover
    import torch

log = logging.getLogger(__name__)

CAPTURE_ATTR = "_sysbench_share_sink"
IMPL_PREFIX = "sysbench_share_"
DEFAULT_BUDGET_BYTES = 256 << 20
MAX_Q_CHUNK = 1024
MAX_K_CHUNK = 4096
# Live fp32 blocks of size heads x q_chunk x k_chunk at the peak (scores, updated in place, plus
# temporaries such as a broadcast mask or a span slice reduction): budget three.
_LIVE_BLOCKS = 3


# ----------------------------------------------------------------- chunk planning


@dataclass(frozen=True)
class ChunkPlan:
    q_chunk: int
    k_chunk: int

    def peak_bytes(self, batch: int, heads: int) -> int:
        return _LIVE_BLOCKS * 4 * batch * heads * self.q_chunk * self.k_chunk


def plan_chunks(
    batch: int,
    heads: int,
    t_q: int,
    t_k: int,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    chunk_tokens: int | None = None,
) -> ChunkPlan:
    """Chunk lengths for queries and keys.

    ``chunk_tokens`` fixes both; otherwise keys go in chunks of up to 4096 and the
    query chunk is the largest (up to 1024) that keeps the fp32 score blocks within
    ``budget_bytes``, so the blocks never grow with T beyond 1024 x 4096 per head.
    """
    if chunk_tokens is not None:
        if chunk_tokens < 1:
            raise SysbenchError(f"--chunk-tokens must be positive, got {chunk_tokens}")
        return ChunkPlan(q_chunk=min(chunk_tokens, max(t_q, 1)), k_chunk=min(chunk_tokens, max(t_k, 1)))
    k_chunk = max(1, min(t_k, MAX_K_CHUNK))
    per_query = _LIVE_BLOCKS * 4 * batch * heads * k_chunk
    q_chunk = max(1, min(t_q, MAX_Q_CHUNK, budget_bytes // max(per_query, 1)))
    return ChunkPlan(q_chunk=q_chunk, k_chunk=k_chunk)


# ----------------------------------------------------------------- the math


def span_share(
    query: "torch.Tensor",
    key: "torch.Tensor",
    spans: Sequence[tuple[int, int]],
    scale: float | None = None,
    q_chunk: int | None = None,
    k_chunk: int | None = None,
    *,
    causal: bool = True,
    sliding_window: int | None = None,
    softcap: float | None = None,
    mask: "torch.Tensor | None" = None,
) -> "torch.Tensor":
    """Attention share of each key span for every query, per head.

    Args:
        query: [B, H, Tq, D] (post-RoPE). The last query sits at the last key
            position (``q_offset = Tk - Tq``), as with a prefix cache.
        key: [B, KVH, Tk, D] with H a multiple of KVH (grouped-query attention).
        spans: half-open key ranges ``(start, end)``; they may overlap.
        scale: score scale; default ``D ** -0.5``.
        q_chunk, k_chunk: chunk lengths (default: all at once).
        causal: keys after the query are invisible.
        sliding_window: a key is visible when ``q_pos - k_pos < sliding_window``.
        softcap: scores become ``softcap * tanh(score / softcap)`` (Gemma 2).
        mask: optional 4-D mask as the model built it, [B|1, H|1, Tq, Tk], boolean
            (True = visible) or additive float; it replaces causal/window logic
            except that keys after the query are still skipped when ``causal``.

    Returns:
        fp32 tensor [B, H, Tq, n_spans]; a query that sees no key gets zeros.
    """
    import torch

    if query.dim() != 4 or key.dim() != 4:
        raise SysbenchError(f"span_share expects 4-D query and key, got {tuple(query.shape)} and {tuple(key.shape)}")
    batch, heads, t_q, dim = query.shape
    kv_heads, t_k = key.shape[1], key.shape[2]
    if heads % kv_heads:
        raise SysbenchError(f"query heads ({heads}) are not a multiple of key heads ({kv_heads})")
    if t_q > t_k:
        raise SysbenchError(f"more queries ({t_q}) than keys ({t_k})")
    group = heads // kv_heads
    scale = dim**-0.5 if scale is None else float(scale)
    q_chunk = t_q if not q_chunk else max(1, int(q_chunk))
    k_chunk = t_k if not k_chunk else max(1, int(k_chunk))
    spans = [(max(0, int(a)), min(t_k, int(b))) for a, b in spans]
    n_spans = len(spans)
    offset = t_k - t_q
    device = query.device

    grouped_q = query.reshape(batch, kv_heads, group, t_q, dim)
    out = torch.zeros(batch, kv_heads, group, t_q, n_spans, dtype=torch.float32, device=device)
    mask_view = _grouped_mask(mask, batch, kv_heads, group, t_q, t_k) if mask is not None else None
    neg_inf = float("-inf")

    for q0 in range(0, t_q, q_chunk):
        q1 = min(q0 + q_chunk, t_q)
        q_block = grouped_q[:, :, :, q0:q1].float()  # [B, KVH, G, C, D]
        q_pos = torch.arange(q0 + offset, q1 + offset, device=device)
        k_stop = (q1 - 1 + offset + 1) if causal else t_k
        k_start = 0
        if sliding_window and mask is None:
            k_start = max(0, q0 + offset - int(sliding_window) + 1)
        running_max = torch.full((batch, kv_heads, group, q1 - q0), neg_inf, dtype=torch.float32, device=device)
        total = torch.zeros_like(running_max)
        acc = torch.zeros(batch, kv_heads, group, q1 - q0, n_spans, dtype=torch.float32, device=device)
        for k0 in range(k_start, k_stop, k_chunk):
            k1 = min(k0 + k_chunk, k_stop)
            k_block = key[:, :, k0:k1].float().unsqueeze(2)  # [B, KVH, 1, K, D]
            scores = torch.matmul(q_block, k_block.transpose(-1, -2)).mul_(scale)  # [B, KVH, G, C, K]
            if softcap:
                scores = scores.div_(softcap).tanh_().mul_(softcap)
            if mask_view is not None:
                block_mask = mask_view[..., q0:q1, k0:k1]
                if block_mask.dtype == torch.bool:
                    scores.masked_fill_(~block_mask, neg_inf)
                else:
                    scores.add_(block_mask)
            # Causal/window masking only where the block crosses the diagonal or the window edge.
            crosses_diagonal = causal and k1 - 1 > q0 + offset
            crosses_window = bool(sliding_window) and mask_view is None and q1 - 1 + offset - k0 >= int(sliding_window)
            if crosses_diagonal or crosses_window:
                k_pos = torch.arange(k0, k1, device=device)
                visible = k_pos[None, :] <= q_pos[:, None]
                if crosses_window:
                    visible = visible & ((q_pos[:, None] - k_pos[None, :]) < int(sliding_window))
                scores.masked_fill_(~visible, neg_inf)
            block_max = scores.amax(dim=-1)
            new_max = torch.maximum(running_max, block_max)
            # Rows with nothing visible yet keep -inf; shift by 0 there to avoid inf - inf.
            shift = torch.where(torch.isfinite(new_max), new_max, torch.zeros_like(new_max))
            rescale = torch.exp(running_max - shift)
            weights = scores.sub_(shift.unsqueeze(-1)).exp_()  # in place: no second block
            total = total * rescale + weights.sum(dim=-1)
            acc = acc * rescale.unsqueeze(-1)
            for index, (start, end) in enumerate(spans):
                lo, hi = max(start, k0), min(end, k1)
                if lo < hi:
                    acc[..., index] += weights[..., lo - k0 : hi - k0].sum(dim=-1)
            del scores, weights
            running_max = new_max
        safe_total = torch.where(total > 0, total, torch.ones_like(total))
        out[:, :, :, q0:q1] = torch.where((total > 0).unsqueeze(-1), acc / safe_total.unsqueeze(-1), torch.zeros_like(acc))
    return out.reshape(batch, heads, t_q, n_spans)


def _grouped_mask(mask: "torch.Tensor", batch: int, kv_heads: int, group: int, t_q: int, t_k: int) -> "torch.Tensor":
    """View a [B|1, H|1, Tq, Tk] mask as [B|1, KVH|1, G|1, Tq, Tk] without copying."""
    if mask.dim() != 4:
        raise SysbenchError(f"attention mask must be 4-D, got shape {tuple(mask.shape)}")
    m_b, m_h = mask.shape[0], mask.shape[1]
    mask = mask[..., -t_q:, -t_k:] if (mask.shape[2] != t_q or mask.shape[3] != t_k) else mask
    if m_h == 1:
        return mask.unsqueeze(2)
    if m_h == kv_heads * group:
        return mask.reshape(m_b, kv_heads, group, mask.shape[2], mask.shape[3])
    raise SysbenchError(f"attention mask has {m_h} heads, expected 1 or {kv_heads * group}")


# ----------------------------------------------------------------- registration


def _registered_name(base: str) -> str:
    return IMPL_PREFIX + base


def _make_capture_function(base: str):
    """The attention function registered for ``base``: run the base path, then report spans."""

    def capture_attention(module, query, key, value, attention_mask, **kwargs):
        base_fn = _base_function(module, base)
        result = base_fn(module, query, key, value, attention_mask, **kwargs)
        sink = getattr(module, CAPTURE_ATTR, None)
        if sink is not None:
            sink.record(module, query, key, attention_mask, kwargs)
        return result

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


# ----------------------------------------------------------------- layers


def attention_modules(model: Any) -> dict[int, Any]:
    """Attention modules by ``layer_idx`` (the modules transformers' interface is called with)."""
    found: dict[int, Any] = {}
    for module in model.modules():
        index = getattr(module, "layer_idx", None)
        if isinstance(index, int) and not isinstance(index, bool) and "Attention" in type(module).__name__:
            found.setdefault(index, module)
    return found


def num_layers(model: Any) -> int:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    count = getattr(config, "num_hidden_layers", None)
    if not isinstance(count, int):
        raise SysbenchError(f"{type(model).__name__}: config has no num_hidden_layers")
    return count


def resolve_layers(spec: str, n_layers: int) -> dict[str, int]:
    """``mid``, ``last``, ``all`` or comma-separated indices (negatives count from the end) -> {label: index}.

    ``mid`` is ``n_layers // 2`` (layer 16 of 32 for Llama-3.1-8B, 40 of 80 for Qwen2-72B,
    as upstream used), ``last`` is ``n_layers - 1``.
    """
    labels: dict[str, int] = {}
    for part in [p.strip() for p in str(spec).split(",") if p.strip()]:
        if part == "mid":
            labels["mid"] = n_layers // 2
        elif part == "last":
            labels["last"] = n_layers - 1
        elif part == "all":
            for index in range(n_layers):
                labels.setdefault(f"layer{index}", index)
        else:
            try:
                index = int(part)
            except ValueError:
                raise SysbenchError(f"--layers: {part!r} is not mid, last, all or a layer number") from None
            if index < 0:
                index += n_layers
            if not 0 <= index < n_layers:
                raise SysbenchError(f"--layers: layer {part} is out of range (the model has {n_layers} layers)")
            labels.setdefault(f"layer{index}", index)
    if not labels:
        raise SysbenchError("--layers: no layer selected")
    return labels


# ----------------------------------------------------------------- capture


@dataclass
class LayerSink:
    """Receives one layer's queries/keys and keeps the head-mean (and optionally per-head) span shares."""

    layer: int
    capture: "AttentionShareCapture"

    def record(self, module: Any, query: Any, key: Any, attention_mask: Any, kwargs: dict[str, Any]) -> None:
        self.capture._record(self.layer, module, query, key, attention_mask, kwargs)


class _StopForward(Exception):
    """Raised after the deepest selected layer when the rest of the forward is not needed."""


@dataclass
class LayerShares:
    mean: "torch.Tensor"  # [B, T, n_spans] fp32, mean over heads
    per_head: "torch.Tensor | None" = None  # [B, H, T, n_spans]


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
    results: dict[int, LayerShares] = field(default_factory=dict)
    _saved_impl: list[tuple[Any, Any, bool]] = field(default_factory=list, repr=False)
    _sinks: list[Any] = field(default_factory=list, repr=False)
    _stop_after: int | None = field(default=None, repr=False)
    active: bool = field(default=False, repr=False)

    # -- context -----------------------------------------------------------------
    def __enter__(self) -> "AttentionShareCapture":
        model = self.model
        if not hasattr(model, "set_attn_implementation") or not hasattr(model, "config"):
            raise SysbenchError(f"{type(model).__name__} is not a transformers PreTrainedModel; cannot capture attention")
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
        base = current if current in ("sdpa", "eager") else "sdpa"
        if base != current:
            log.info("attention capture wraps SDPA (the model was loaded with %s)", current)
        name = register_capture_attention(base)
        self._saved_impl = [
            (config, config.__dict__.get("_attn_implementation_internal"), "_attn_was_changed" in config.__dict__)
            for config in _all_configs(model)
        ]
        try:
            model.set_attn_implementation(name)
            if model.config._attn_implementation != name:
                raise SysbenchError(
                    f"{type(model).__name__} refused the attention implementation {name!r}; "
                    "it does not support switching attention through transformers' AttentionInterface"
                )
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
        for config, value, had_flag in self._saved_impl:
            config._attn_implementation_internal = value
            if not had_flag and "_attn_was_changed" in config.__dict__:
                del config.__dict__["_attn_was_changed"]
        self._saved_impl = []
        self.active = False

    # -- use -----------------------------------------------------------------------
    def prepare(self, spans: Sequence[tuple[int, int]]) -> None:
        """Set the key spans for the next forward and clear earlier results."""
        self.spans = [(int(a), int(b)) for a, b in spans]
        self.results = {}

    def forward(self, input_ids: "torch.Tensor", stop_early: bool = True) -> dict[int, LayerShares]:
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

    def _record(self, layer: int, module: Any, query: Any, key: Any, attention_mask: Any, kwargs: dict[str, Any]) -> None:
        for unsupported in ("position_bias", "s_aux", "sinks"):
            if kwargs.get(unsupported) is not None:
                raise SysbenchError(
                    f"layer {layer} ({type(module).__name__}) uses {unsupported}; attention share capture does not model it"
                )
        if getattr(module, "training", False) and kwargs.get("dropout"):
            raise SysbenchError("attention capture needs the model in eval mode (dropout is on)")
        scale = kwargs.get("scaling")
        if scale is None:
            scale = getattr(module, "scaling", None)
        softcap = kwargs.get("softcap")
        window = kwargs.get("sliding_window")
        is_causal = kwargs.get("is_causal")
        if is_causal is None:
            is_causal = getattr(module, "is_causal", True)
        mask = attention_mask if (attention_mask is not None and getattr(attention_mask, "dim", lambda: 0)() == 4) else None
        if attention_mask is not None and mask is None:
            raise SysbenchError(
                f"layer {layer}: attention mask of shape {tuple(attention_mask.shape)} is not supported (padding?); "
                "run one unpadded sequence per forward"
            )
        batch, heads = query.shape[0], query.shape[1]
        plan = plan_chunks(batch, heads, query.shape[2], key.shape[2], self.budget_bytes, self.chunk_tokens)
        shares = span_share(
            query,
            key,
            self.spans,
            scale=scale,
            q_chunk=plan.q_chunk,
            k_chunk=plan.k_chunk,
            causal=bool(is_causal),
            sliding_window=window,
            softcap=softcap,
            mask=mask,
        )
        self.results[layer] = LayerShares(
            mean=shares.mean(dim=1).cpu(),
            per_head=shares.cpu() if self.per_head else None,
        )
        if self._stop_after is not None and layer >= self._stop_after and set(self.layers) <= set(self.results):
            raise _StopForward()


def _all_configs(model: Any) -> list[Any]:
    """Every config object reachable from the model's modules and their sub-configs (deduplicated)."""
    seen: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is None or not hasattr(config, "_attn_implementation"):
            continue
        stack = [config]
        while stack:
            item = stack.pop()
            if id(item) in seen:
                continue
            seen[id(item)] = item
            for key in getattr(item, "sub_configs", {}) or {}:
                sub = getattr(item, key, None)
                if sub is not None and hasattr(sub, "_attn_implementation"):
                    stack.append(sub)
    return list(seen.values())


def eager_reference_shares(attentions: "torch.Tensor", spans: Sequence[tuple[int, int]]) -> "torch.Tensor":
    """Span shares from a materialized [B, H, T, T] attention matrix (for tests and benchmarks)."""
    import torch

    columns = [attentions[..., a:b].float().sum(dim=-1) for a, b in spans]
    return torch.stack(columns, dim=-1)
