"""The math of attention shares: pure torch, no model code.

For a query q and a key span S the share is ``share_S(q) = exp(LSE_S(q) - LSE_all(q))``,
with ``LSE_X(q)`` the log-sum-exp of q's scores over the keys of X that q can see.

* ``span_share_given_lse``: with ``LSE_all`` taken from the attention kernel that computed
  the layer's output (``attn_kernels``), the share needs only the span's keys,
  O(T x |S| x d), summed as ``exp(s - LSE_all)``: the kernel-LSE path, all the capture adds
  to a forward.
* ``span_share``: the fallback where no kernel returns LSE (eager attention): an online
  log-sum-exp over all keys in chunks, a second attention pass, O(T^2 x d).

Both handle grouped-query attention without repeating keys: the query heads that share a
KV head are folded into the query rows (``[B, KVH, G x C, D] @ [B, KVH, D, K]``), so the
key block is never copied per group and each matmul is one large GEMM. Scores are fp32
with IEEE matmuls even where the user enabled TF32 (``ieee_fp32_matmul``), and peak extra
memory is a few fp32 blocks of ``heads x q_chunk x k_chunk`` (``plan_chunks``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sysbench_gpu.core.errors import SysbenchError

if TYPE_CHECKING:  # pragma: no cover
    import torch


# ----------------------------------------------------------------- chunk planning


# ----------------------------------------------------------------- fp32 precision


@contextlib.contextmanager
def ieee_fp32_matmul() -> Iterator[None]:
    """fp32 matmuls in full IEEE precision inside the block, whatever the user set (TF32 on CUDA, bf16 on oneDNN).

    Uses torch's per-backend ``fp32_precision`` settings (reading and restoring them never
    mixes with the legacy ``allow_tf32`` API in a way torch refuses); older torch: ``allow_tf32``.
    """
    import torch

    backends = [
        b for b in (torch.backends.cuda.matmul, getattr(torch.backends.mkldnn, "matmul", None)) if b is not None
    ]
    if all(hasattr(b, "fp32_precision") for b in backends):
        saved = [b.fp32_precision for b in backends]
        for backend in backends:
            backend.fp32_precision = "ieee"
        try:
            yield
        finally:
            for backend, value in zip(backends, saved, strict=False):
                backend.fp32_precision = value
        return
    saved_tf32 = torch.backends.cuda.matmul.allow_tf32  # pragma: no cover (torch before fp32_precision)
    torch.backends.cuda.matmul.allow_tf32 = False  # pragma: no cover
    try:  # pragma: no cover
        yield
    finally:  # pragma: no cover
        torch.backends.cuda.matmul.allow_tf32 = saved_tf32


# ----------------------------------------------------------------- shared pieces


@dataclass(frozen=True)
class _Shape:
    batch: int
    heads: int
    kv_heads: int
    group: int
    t_q: int
    t_k: int
    dim: int

    @property
    def offset(self) -> int:
        """Position of query 0 among the keys: the queries are the last ``t_q`` positions (as with a prefix cache)."""
        return self.t_k - self.t_q


def _shape(query: torch.Tensor, key: torch.Tensor) -> _Shape:
    if query.dim() != 4 or key.dim() != 4:
        raise SysbenchError(
            f"attention shares expect 4-D query and key, got {tuple(query.shape)} and {tuple(key.shape)}"
        )
    batch, heads, t_q, dim = query.shape
    kv_heads, t_k = key.shape[1], key.shape[2]
    if heads % kv_heads:
        raise SysbenchError(f"query heads ({heads}) are not a multiple of key heads ({kv_heads})")
    if t_q > t_k:
        raise SysbenchError(f"more queries ({t_q}) than keys ({t_k})")
    return _Shape(batch, heads, kv_heads, heads // kv_heads, t_q, t_k, dim)


def _query_rows(query: torch.Tensor, shape: _Shape, q0: int, q1: int) -> torch.Tensor:
    """Queries q0..q1 of every head as fp32 rows ``[B, KVH, G x C, D]`` (group folded into rows; a small copy)."""
    grouped = query.reshape(shape.batch, shape.kv_heads, shape.group, shape.t_q, shape.dim)
    return grouped[:, :, :, q0:q1].float().reshape(shape.batch, shape.kv_heads, shape.group * (q1 - q0), shape.dim)


def _scores(
    rows: torch.Tensor,
    key: torch.Tensor,
    k0: int,
    k1: int,
    scale: float,
    softcap: float | None,
    shape: _Shape,
    chunk: int,
) -> torch.Tensor:
    """fp32 scores of the query rows against keys k0..k1, as a ``[B, KVH, G, C, K]`` view of one GEMM's output."""
    import torch

    keys = key[:, :, k0:k1].float().transpose(-1, -2)  # [B, KVH, D, K]: a view for fp32 keys, never repeated per group
    scores = torch.matmul(rows, keys).mul_(scale)  # [B, KVH, G*C, K]
    if softcap:
        scores = scores.div_(softcap).tanh_().mul_(softcap)
    return scores.view(shape.batch, shape.kv_heads, shape.group, chunk, k1 - k0)


def _apply_visibility(
    scores: torch.Tensor,
    mask_view: torch.Tensor | None,
    q0: int,
    q1: int,
    k0: int,
    k1: int,
    shape: _Shape,
    causal: bool,
    sliding_window: int | None,
) -> None:
    """Set invisible scores to -inf in place: the model's mask if given, else causal and window limits."""
    import torch

    neg_inf = float("-inf")
    if mask_view is not None:
        block_mask = mask_view[..., q0:q1, k0:k1]
        if block_mask.dtype == torch.bool:
            scores.masked_fill_(~block_mask, neg_inf)
        else:
            scores.add_(block_mask)
    offset = shape.offset
    # Causal/window masking only where the block crosses the diagonal or the window edge.
    crosses_diagonal = causal and k1 - 1 > q0 + offset
    crosses_window = bool(sliding_window) and mask_view is None and q1 - 1 + offset - k0 >= int(sliding_window)
    if crosses_diagonal or crosses_window:
        device = scores.device
        q_pos = torch.arange(q0 + offset, q1 + offset, device=device)
        k_pos = torch.arange(k0, k1, device=device)
        visible = (
            k_pos[None, :] <= q_pos[:, None]
            if causal
            else torch.ones(q1 - q0, k1 - k0, dtype=torch.bool, device=device)
        )
        if crosses_window:
            visible = visible & ((q_pos[:, None] - k_pos[None, :]) < int(sliding_window))
        scores.masked_fill_(~visible, neg_inf)


def _key_range(
    q0: int, q1: int, lo: int, hi: int, shape: _Shape, causal: bool, sliding_window: int | None, has_mask: bool
) -> tuple[int, int]:
    """Keys in [lo, hi) that queries q0..q1 may see (causal limit, window start); empty when start >= stop."""
    stop = min(hi, q1 + shape.offset) if causal else hi
    start = lo
    if sliding_window and not has_mask:
        start = max(lo, q0 + shape.offset - int(sliding_window) + 1)
    return start, stop


def _grouped_mask(mask: torch.Tensor, batch: int, kv_heads: int, group: int, t_q: int, t_k: int) -> torch.Tensor:
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


def _clip_spans(spans: Sequence[tuple[int, int]], t_k: int) -> list[tuple[int, int]]:
    return [(max(0, int(a)), min(t_k, int(b))) for a, b in spans]


# ----------------------------------------------------------------- kernel-LSE path


def span_share_given_lse(
    query: torch.Tensor,
    key: torch.Tensor,
    spans: Sequence[tuple[int, int]],
    lse_all: torch.Tensor,
    scale: float | None = None,
    q_chunk: int | None = None,
    k_chunk: int | None = None,
    *,
    causal: bool = True,
    softcap: float | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention share of each key span per query and head, given each row's log-sum-exp over all its keys.

    ``share_S(q) = exp(LSE_S(q) - LSE_all(q)) = sum_{k in S, visible} exp(s_qk - LSE_all(q))``: with
    ``LSE_all`` from the attention kernel (``lse_all``: [B, H, Tq]), only the spans' keys are read,
    O(Tq x |spans| x D), and no running maximum is needed since every term is at most 1.
    Other arguments as ``span_share``. Returns fp32 ``[B, H, Tq, n_spans]``: 0 where a query sees
    no key of the span (a query before the span starts, or the mask hides it).
    """
    import torch

    shape = _shape(query, key)
    scale = shape.dim**-0.5 if scale is None else float(scale)
    spans = _clip_spans(spans, shape.t_k)
    lead = (shape.batch, shape.kv_heads, shape.group)
    out = torch.zeros(*lead, shape.t_q, len(spans), dtype=torch.float32, device=query.device)
    live = [(a, b) for a, b in spans if a < b]
    if not live:
        return out.reshape(shape.batch, shape.heads, shape.t_q, len(spans))
    lo, hi = min(a for a, _ in live), max(b for _, b in live)
    q_chunk = shape.t_q if not q_chunk else max(1, int(q_chunk))
    k_chunk = (hi - lo) if not k_chunk else max(1, int(k_chunk))
    row_lse = lse_all.float().reshape(*lead, shape.t_q)
    mask_view = (
        _grouped_mask(mask, shape.batch, shape.kv_heads, shape.group, shape.t_q, shape.t_k)
        if mask is not None
        else None
    )
    with ieee_fp32_matmul():
        for q0 in range(0, shape.t_q, q_chunk):
            q1 = min(q0 + q_chunk, shape.t_q)
            k_start, k_stop = _key_range(q0, q1, lo, hi, shape, causal, None, mask is not None)
            if k_start >= k_stop:
                continue  # these queries see no key of any span
            rows = _query_rows(query, shape, q0, q1) * scale  # a fresh tensor: never scale the model's query in place
            shift = row_lse[:, :, :, q0:q1].reshape(shape.batch, shape.kv_heads, -1, 1)
            block_out = out[:, :, :, q0:q1]
            for k0 in range(k_start, k_stop, k_chunk):
                k1 = min(k0 + k_chunk, k_stop)
                weights = _exp_scores(rows, key, k0, k1, shift, softcap, mask_view, q0, q1, shape, causal)
                for index, (start, end) in enumerate(spans):
                    a, b = max(start, k0), min(end, k1)
                    if a < b:
                        block_out[..., index] += weights[..., a - k0 : b - k0].sum(dim=-1)
                del weights
    # A row that sees no key at all (LSE_all = -inf) has no share of anything.
    out = torch.where(torch.isfinite(row_lse).unsqueeze(-1), out, torch.zeros_like(out))
    return out.reshape(shape.batch, shape.heads, shape.t_q, len(spans))


def _exp_scores(
    rows: torch.Tensor,
    key: torch.Tensor,
    k0: int,
    k1: int,
    shift: torch.Tensor,
    softcap: float | None,
    mask_view: torch.Tensor | None,
    q0: int,
    q1: int,
    shape: _Shape,
    causal: bool,
) -> torch.Tensor:
    """``exp(score - LSE_all)`` of the (pre-scaled) query rows against keys k0..k1, invisible keys 0.

    Shape [B, KVH, G, C, K].
    """
    import torch

    keys = key[:, :, k0:k1].float().transpose(-1, -2)  # [B, KVH, D, K]: a view for fp32 keys, never repeated per group
    scores = torch.matmul(rows, keys)  # [B, KVH, G*C, K], already scaled through the rows
    if softcap:
        scores = scores.div_(softcap).tanh_().mul_(softcap)
    view = scores.view(shape.batch, shape.kv_heads, shape.group, q1 - q0, k1 - k0)
    block_mask = None if mask_view is None else mask_view[..., q0:q1, k0:k1]
    if block_mask is not None and block_mask.dtype != torch.bool:
        view.add_(block_mask)  # an additive mask acts before the exponential
    scores.sub_(shift).exp_()  # in place: one block
    if block_mask is not None and block_mask.dtype == torch.bool:
        view.masked_fill_(~block_mask, 0.0)
    offset = shape.offset
    if causal and k1 - 1 > q0 + offset:  # the block crosses the diagonal: keys after their query are invisible
        q_pos = torch.arange(q0 + offset, q1 + offset, device=scores.device)
        k_pos = torch.arange(k0, k1, device=scores.device)
        view.masked_fill_(k_pos[None, :] > q_pos[:, None], 0.0)
    return view


# ----------------------------------------------------------------- fallback path


def span_share(
    query: torch.Tensor,
    key: torch.Tensor,
    spans: Sequence[tuple[int, int]],
    scale: float | None = None,
    q_chunk: int | None = None,
    k_chunk: int | None = None,
    *,
    causal: bool = True,
    sliding_window: int | None = None,
    softcap: float | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention share of each key span for every query, per head, from all keys (the fallback path).

    Args:
        query: [B, H, Tq, D] (post-RoPE). The last query sits at the last key
            position (``q_offset = Tk - Tq``), as with a prefix cache.
        key: [B, KVH, Tk, D] with H a multiple of KVH (grouped-query attention).
        spans: half-open key ranges ``(start, end)``; they may overlap.
        scale: score scale; default ``D ** -0.5``.
        q_chunk, k_chunk: chunk lengths (default: all at once).
        causal: keys after the query are invisible.
        sliding_window: a key is visible when ``q_pos - k_pos < sliding_window``.
        softcap: scores become ``softcap * tanh(score / softcap)`` (Gemma 2, eager).
        mask: optional 4-D mask as the model built it, [B|1, H|1, Tq, Tk], boolean
            (True = visible) or additive float; it replaces causal/window logic
            except that keys after the query are still skipped when ``causal``.

    Returns:
        fp32 tensor [B, H, Tq, n_spans]; a query that sees no key gets zeros.
    """
    import torch

    shape = _shape(query, key)
    scale = shape.dim**-0.5 if scale is None else float(scale)
    q_chunk = shape.t_q if not q_chunk else max(1, int(q_chunk))
    k_chunk = shape.t_k if not k_chunk else max(1, int(k_chunk))
    spans = _clip_spans(spans, shape.t_k)
    n_spans = len(spans)
    device = query.device
    lead = (shape.batch, shape.kv_heads, shape.group)
    out = torch.zeros(*lead, shape.t_q, n_spans, dtype=torch.float32, device=device)
    mask_view = (
        _grouped_mask(mask, shape.batch, shape.kv_heads, shape.group, shape.t_q, shape.t_k)
        if mask is not None
        else None
    )
    with ieee_fp32_matmul():
        for q0 in range(0, shape.t_q, q_chunk):
            q1 = min(q0 + q_chunk, shape.t_q)
            rows = _query_rows(query, shape, q0, q1)
            k_start, k_stop = _key_range(q0, q1, 0, shape.t_k, shape, causal, sliding_window, mask is not None)
            running_max = torch.full((*lead, q1 - q0), float("-inf"), dtype=torch.float32, device=device)
            total = torch.zeros_like(running_max)
            acc = torch.zeros(*lead, q1 - q0, n_spans, dtype=torch.float32, device=device)
            for k0 in range(k_start, k_stop, k_chunk):
                k1 = min(k0 + k_chunk, k_stop)
                scores = _scores(rows, key, k0, k1, scale, softcap, shape, q1 - q0)
                _apply_visibility(scores, mask_view, q0, q1, k0, k1, shape, causal, sliding_window)
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
            out[:, :, :, q0:q1] = torch.where(
                (total > 0).unsqueeze(-1), acc / safe_total.unsqueeze(-1), torch.zeros_like(acc)
            )
    return out.reshape(shape.batch, shape.heads, shape.t_q, n_spans)


def eager_reference_shares(attentions: torch.Tensor, spans: Sequence[tuple[int, int]]) -> torch.Tensor:
    """Span shares from a materialized [B, H, T, T] attention matrix (for tests and benchmarks)."""
    import torch

    columns = [attentions[..., a:b].float().sum(dim=-1) for a, b in spans]
    return torch.stack(columns, dim=-1)
