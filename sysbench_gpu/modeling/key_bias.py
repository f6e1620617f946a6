"""An additive bias on the logits of one key span, at chosen layers and heads: knockout (-inf) and steering (log α).

The bias reaches the queries at or after the span's end (the tokens that read the span;
the span's own tokens and the template before it are left alone). ``key_bias(model, ...)``
switches the model to a registered SDPA wrapper that adds the bias to the mask of the
hooked layers; every other layer runs SDPA unchanged. The spans are set per forward
(``SpanBias.set_spans``), one per batch row, in the key positions of that forward (with
a KV cache and left padding: the padded positions, which the cache keeps).

The bias is a dense ``[B, H|1, Tq, Tk]`` tensor: fine on the CPU and for short prompts; a
path without T×T (flex attention's block mask, or a two-segment log-sum-exp merge) is not
written yet. ``PATH`` names what runs, for the manifests.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.modeling.registry import attention_implementation, attention_modules, registered_attention

if TYPE_CHECKING:  # pragma: no cover
    import torch

KEY_BIAS_ATTR = "_sysbench_key_bias"
IMPL_NAME = "sysbench_key_bias_sdpa"
PATH = (
    "sdpa-dense-bias: SDPA with an explicit additive [B, H|1, Tq, Tk] mask at the hooked layers, plain SDPA elsewhere"
)


@dataclass
class SpanBias:
    """The bias shared by every hooked layer; ``spans`` change per forward."""

    value: float  # added to the span keys' logits: -inf hides them (knockout), log α steers
    spans: list[tuple[int, int]] = field(default_factory=list)  # per batch row, key positions [start, end)

    def set_spans(self, spans: Sequence[tuple[int, int]]) -> None:
        self.spans = [(int(a), int(b)) for a, b in spans]


@dataclass(frozen=True)
class LayerBias:
    """What one hooked module carries: the shared bias and the query heads that get it (None: all)."""

    bias: SpanBias
    heads: tuple[int, ...] | None = None


def steering_value(alpha: float) -> float:
    """log α: PASTA-style scaling of the span's attention weights before renormalisation."""
    if not alpha > 0:
        raise SysbenchError(f"--steer-system must be greater than 0, got {alpha:g}")
    return math.log(alpha)


def biased_mask(
    bias: SpanBias,
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor | None,
    heads: Sequence[int] | None = None,
) -> torch.Tensor:
    """The model's mask (None: causal) as an additive mask, plus ``bias.value`` on the span keys after the span."""
    import torch

    batch, n_heads, t_q, _ = query.shape
    t_k = key.shape[2]
    device = query.device
    neg_inf = torch.tensor(float("-inf"), dtype=query.dtype, device=device)
    zero = torch.zeros((), dtype=query.dtype, device=device)
    q_pos = torch.arange(t_k - t_q, t_k, device=device)
    k_pos = torch.arange(t_k, device=device)
    if mask is None:
        base = torch.where(k_pos[None, :] <= q_pos[:, None], zero, neg_inf)[None, None]
    elif mask.dtype == torch.bool:
        base = torch.where(mask[..., :t_k], zero, neg_inf)
    else:
        base = mask[..., :t_k].to(query.dtype)
    if len(bias.spans) not in (1, batch):
        raise SysbenchError(f"key bias: {len(bias.spans)} spans for a batch of {batch}")
    spans = torch.tensor(bias.spans, device=device).reshape(-1, 2)
    starts, ends = spans[:, :1], spans[:, 1:]
    in_span = (k_pos[None, :] >= starts) & (k_pos[None, :] < ends)  # [B, Tk]
    after = q_pos[None, :] >= ends  # [B, Tq]
    hit = (after[:, :, None] & in_span[:, None, :])[:, None]  # [B, 1, Tq, Tk]
    if heads is not None:
        chosen = torch.zeros(n_heads, dtype=torch.bool, device=device)
        chosen[list(heads)] = True
        hit = hit & chosen[None, :, None, None]
    value = torch.tensor(bias.value, dtype=query.dtype, device=device)
    return base + torch.where(hit, value, zero)


def apply_key_bias(module: Any, query: Any, key: Any, mask: Any) -> Any:
    """The mask a hooked module's attention should use (unchanged where the module carries no bias)."""
    hooked = getattr(module, KEY_BIAS_ATTR, None)
    if hooked is None or not hooked.bias.spans:
        return mask
    return biased_mask(hooked.bias, query, key, mask, hooked.heads)


def key_bias_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
    """The registered function: transformers' SDPA path with the module's bias added to its mask."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    mask = apply_key_bias(module, query, key, attention_mask)
    return sdpa_attention_forward(module, query, key, value, mask, **kwargs)


def head_count(model: Any) -> int:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.num_attention_heads)


@contextmanager
def key_bias(
    model: Any, layers: Sequence[int], value: float, heads: Mapping[int, Sequence[int]] | None = None
) -> Iterator[SpanBias]:
    """The model runs with ``value`` added to the span keys' logits at ``layers`` for the block.

    ``heads``: per layer, the query heads that get the bias (a layer it leaves out gets none);
    None: every head of every layer in ``layers``.
    """
    modules = attention_modules(model)
    missing = sorted(set(layers) - set(modules))
    if missing:
        raise SysbenchError(f"{type(model).__name__}: no attention module with layer_idx {missing}")
    n_heads = head_count(model)
    bad = sorted(h for group in (heads or {}).values() for h in group if not 0 <= h < n_heads)
    if bad:
        raise SysbenchError(f"key bias: heads {bad} out of range (the model has {n_heads} heads)")
    bias = SpanBias(float(value))
    hooked: list[Any] = []
    with registered_attention(IMPL_NAME, key_bias_attention), attention_implementation(model, IMPL_NAME):
        try:
            for layer in sorted(set(layers)):
                if heads is not None and not heads.get(layer):
                    continue
                chosen = None if heads is None else tuple(sorted(set(heads[layer])))
                setattr(modules[layer], KEY_BIAS_ATTR, LayerBias(bias, chosen))
                hooked.append(modules[layer])
            yield bias
        finally:
            for module in hooked:
                module.__dict__.pop(KEY_BIAS_ATTR, None)


def layer_heads(pairs: Sequence[Sequence[int]], layers: Sequence[int]) -> dict[int, tuple[int, ...]]:
    """[layer, head] pairs grouped by layer, kept to ``layers`` (the head map's list, ``--steer-heads``)."""
    grouped: dict[int, set[int]] = {}
    for layer, head in pairs:
        if layer in layers:
            grouped.setdefault(int(layer), set()).add(int(head))
    return {layer: tuple(sorted(heads)) for layer, heads in grouped.items()}
