"""The share math: span LSE (kernel-LSE path) and the chunked fallback against a dense softmax; memory;
fp32 precision."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from sysbench_gpu.attention.capture.chunks import CPU_BLOCK_BYTES, CPU_MAX_K_CHUNK, plan_chunks  # noqa: E402 (after importorskip: torch is optional)
from sysbench_gpu.attention.capture.span_math import ieee_fp32_matmul, span_share, span_share_given_lse  # noqa: E402 (after importorskip: torch is optional)
from sysbench_gpu.core.errors import SysbenchError  # noqa: E402

TOL = 1e-5
REPO_ROOT = Path(__file__).resolve().parent.parent


def dense_scores(q, k, scale, mask_fn=None, softcap=None):
    """float64 scores with invisible keys at -inf: repeat keys, no chunking."""
    heads, kv_heads = q.shape[1], k.shape[1]
    keys = k.repeat_interleave(heads // kv_heads, dim=1)
    scores = (q.double() @ keys.double().transpose(-1, -2)) * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    t_q, t_k = q.shape[2], k.shape[2]
    qi = torch.arange(t_q)[:, None] + (t_k - t_q)
    ki = torch.arange(t_k)[None, :]
    visible = ki <= qi if mask_fn is None else mask_fn(qi, ki)
    return scores.masked_fill(~visible, float("-inf"))


def naive_shares(q, k, spans, scale, mask_fn=None, softcap=None):
    probs = dense_scores(q, k, scale, mask_fn, softcap).softmax(-1)
    return torch.stack([probs[..., a:b].sum(-1) for a, b in spans], dim=-1).float()


def kernel_lse_shares(q, k, spans, scale, q_chunk=None, k_chunk=None, mask_fn=None, softcap=None, **kwargs):
    """The kernel-LSE path with LSE_all from a dense reference (standing in for the kernel's)."""
    lse_all = dense_scores(q, k, scale, mask_fn, softcap).logsumexp(-1).float()
    return span_share_given_lse(
        q, k, spans, lse_all, scale=scale, q_chunk=q_chunk, k_chunk=k_chunk, softcap=softcap, **kwargs
    )


CHUNKS = [(1, 1), (5, 7), (7, 64), (None, None), (13, 3)]


@pytest.mark.parametrize("q_chunk,k_chunk", CHUNKS)
def test_fallback_span_share_matches_dense_softmax_with_gqa(q_chunk, k_chunk):
    torch.manual_seed(0)
    q, k = torch.randn(2, 6, 29, 16) * 2, torch.randn(2, 2, 29, 16) * 2
    spans = [(0, 3), (3, 17), (10, 29), (28, 40)]
    got = span_share(q, k, spans, scale=0.25, q_chunk=q_chunk, k_chunk=k_chunk)
    assert got.shape == (2, 6, 29, 4)
    assert torch.allclose(got, naive_shares(q, k, spans, 0.25), atol=TOL)


@pytest.mark.parametrize("q_chunk,k_chunk", CHUNKS)
def test_shares_given_the_kernels_lse_match_dense_softmax_with_gqa(q_chunk, k_chunk):
    torch.manual_seed(0)
    q, k = torch.randn(2, 6, 29, 16) * 2, torch.randn(2, 2, 29, 16) * 2
    spans = [(0, 3), (3, 17), (10, 29), (28, 40), (5, 5)]
    got = kernel_lse_shares(q, k, spans, 0.25, q_chunk, k_chunk)
    assert got.shape == (2, 6, 29, 5)
    assert torch.allclose(got, naive_shares(q, k, spans, 0.25), atol=TOL)


def test_causal_visibility_of_a_span():
    """A query inside a span sees only its part up to the query; a query before the span gives it exactly 0."""
    torch.manual_seed(2)
    q, k = torch.randn(1, 4, 20, 8), torch.randn(1, 2, 20, 8)
    spans = [(6, 12)]
    shares = kernel_lse_shares(q, k, spans, 0.3, 4, 5)
    assert torch.equal(shares[:, :, :6], torch.zeros_like(shares[:, :, :6]))
    # Query 8 sees keys 6, 7, 8 of the span: its share is their softmax mass, nothing of keys 9-11.
    assert torch.allclose(shares, naive_shares(q, k, spans, 0.3), atol=TOL)
    # A row whose kernel saw no key at all (LSE -inf, e.g. fully masked) has share 0, not inf or nan.
    lse_all = dense_scores(q, k, 0.3).logsumexp(-1).float()
    lse_all[:, :, 10] = float("-inf")
    got = span_share_given_lse(q, k, spans, lse_all, scale=0.3)
    assert torch.equal(got[:, :, 10], torch.zeros_like(got[:, :, 10])) and torch.isfinite(got).all()


@pytest.mark.parametrize("path", ["fallback", "kernel-lse"])
def test_window_softcap_masks_and_offset(path):
    torch.manual_seed(1)
    q, k = torch.randn(1, 4, 23, 8), torch.randn(1, 4, 23, 8)
    spans = [(0, 5), (5, 23)]
    window_fn = lambda qi, ki: (ki <= qi) & (qi - ki < 5)  # noqa: E731
    expected = naive_shares(q, k, spans, 0.5, mask_fn=window_fn, softcap=3.0)
    if path == "fallback":  # a window given as a number (the kernel path gets windows only as the model's mask)
        windowed = span_share(q, k, spans, scale=0.5, q_chunk=4, k_chunk=6, sliding_window=5, softcap=3.0)
        assert torch.allclose(windowed, expected, atol=TOL)
    # The window given as the model's boolean mask, and as an additive float mask.
    qi, ki = torch.arange(23)[:, None], torch.arange(23)[None, :]
    bool_mask = ((ki <= qi) & (qi - ki < 5))[None, None]
    float_mask = torch.zeros(1, 1, 23, 23).masked_fill(~bool_mask, torch.finfo(torch.float32).min)
    for mask in (bool_mask, float_mask):
        if path == "fallback":
            got = span_share(q, k, spans, scale=0.5, q_chunk=9, k_chunk=4, softcap=3.0, mask=mask)
        else:
            got = kernel_lse_shares(q, k, spans, 0.5, 9, 4, mask_fn=window_fn, softcap=3.0, mask=mask)
        assert torch.allclose(got, expected, atol=TOL)
    # Fewer queries than keys: the queries are the last positions (prefix cache).
    if path == "fallback":
        tail = span_share(q[:, :, -6:], k, spans, scale=0.5, q_chunk=4, k_chunk=5)
    else:
        lse_all = dense_scores(q, k, 0.5).logsumexp(-1).float()[:, :, -6:]
        tail = span_share_given_lse(q[:, :, -6:], k, spans, lse_all, scale=0.5, q_chunk=4, k_chunk=5)
    assert torch.allclose(tail, naive_shares(q, k, spans, 0.5)[:, :, -6:], atol=TOL)


def test_per_head_mask_and_shape_errors():
    torch.manual_seed(3)
    q, k = torch.randn(1, 4, 10, 8), torch.randn(1, 2, 10, 8)
    qi, ki = torch.arange(10)[:, None], torch.arange(10)[None, :]
    per_head = torch.stack([(ki <= qi) & (qi - ki < w) for w in (2, 3, 4, 10)])[None]  # [1, 4, T, T]
    expected = []
    for head, w in enumerate((2, 3, 4, 10)):
        fn = lambda a, b, w=w: (b <= a) & (a - b < w)  # noqa: E731
        expected.append(naive_shares(q[:, head : head + 1], k[:, head // 2 : head // 2 + 1], [(0, 4)], 0.4, mask_fn=fn))
    expected = torch.cat(expected, dim=1)
    assert torch.allclose(
        span_share(q, k, [(0, 4)], scale=0.4, q_chunk=3, k_chunk=4, mask=per_head), expected, atol=TOL
    )
    dense = dense_scores(q, k, 0.4).masked_fill(~per_head, float("-inf")).logsumexp(-1).float()
    got = span_share_given_lse(q, k, [(0, 4)], dense, scale=0.4, q_chunk=3, k_chunk=3, mask=per_head)
    assert torch.allclose(got, expected, atol=TOL)
    with pytest.raises(SysbenchError, match="not a multiple"):
        span_share_given_lse(torch.randn(1, 3, 4, 8), torch.randn(1, 2, 4, 8), [(0, 1)], torch.zeros(1, 3, 4))
    with pytest.raises(SysbenchError, match="more queries"):
        span_share(torch.randn(1, 2, 5, 8), torch.randn(1, 2, 4, 8), [(0, 1)])


def test_plan_chunks_stays_within_budget():
    plan = plan_chunks(1, 64, 8192, 8192, budget_bytes=64 << 20)
    assert plan.peak_bytes(1, 64) <= 64 << 20
    assert plan.k_chunk == 4096 and plan.q_chunk >= 1
    assert plan_chunks(1, 9, 100, 100, chunk_tokens=33) == type(plan)(33, 33)
    # On the CPU one score block stays near the cache-sized target, whatever the budget allows.
    cpu = plan_chunks(1, 9, 2048, 2048, budget_bytes=256 << 20, device_type="cpu")
    assert cpu.k_chunk == CPU_MAX_K_CHUNK and 4 * 9 * cpu.q_chunk * cpu.k_chunk <= CPU_BLOCK_BYTES
    assert plan_chunks(1, 9, 2048, 2048, budget_bytes=256 << 20) == type(plan)(1024, 2048)  # CUDA: the budget decides
    assert plan_chunks(1, 9, 2048, 2048, chunk_tokens=64, device_type="cpu") == type(plan)(
        64, 64
    )  # the user's choice wins
    with pytest.raises(SysbenchError):
        plan_chunks(1, 9, 100, 100, chunk_tokens=0)


# ----------------------------------------------------------------- memory (issue 8 item 10)

_PEAK_SCRIPT = textwrap.dedent(
    """
    import ctypes, sys
    from pathlib import Path
    import torch
    from sysbench_gpu.attention.capture.span_math import span_share, span_share_given_lse

    def status(field):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024

    torch.set_num_threads(1)
    which = sys.argv[1]
    torch.manual_seed(0)
    # 32 query heads over 2 KV heads, 4096 keys of dimension 512: the key block is 16 MiB, and a copy
    # per group member would be 256 MiB; 16 queries keep the score blocks themselves at 8 MiB.
    q, k = torch.randn(1, 32, 16, 512), torch.randn(1, 2, 4096, 512)
    lse = torch.randn(1, 32, 16) + 20
    if which == "fallback":
        fn = span_share
    else:
        fn = lambda q_, k_, spans, **kw: span_share_given_lse(q_, k_, spans, lse[:, :, : q_.shape[2]], **kw)
    fn(q[:, :, :2], k[:, :, :64], [(0, 8)], q_chunk=16, k_chunk=4096)  # warm up allocator and kernels
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    base = status("VmRSS")
    fn(q, k, [(0, 3), (3, 4000)], q_chunk=16, k_chunk=4096)
    print((status("VmHWM") - base) / 2**20)
    """
)


@pytest.mark.parametrize("which", ["fallback", "kernel-lse"])
def test_grouped_query_heads_do_not_copy_the_key_block(which):
    """Issue 8 item 10: the keys are not repeated per query group; the peak stays near the score blocks."""
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux /proc to reset the peak RSS")
    result = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, which],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    peak_mib = float(result.stdout.strip().splitlines()[-1])
    # Score block 32 x 16 x 4096 fp32 = 8 MiB (a few live at once); a per-group key copy alone is 256 MiB.
    assert peak_mib < 64, f"peak {peak_mib:.0f} MiB: the key block was copied per group"


# ----------------------------------------------------------------- fp32 precision (issue 8 item 10)


def test_tf32_set_by_the_user_does_not_reach_the_score_matmuls(monkeypatch):
    matmul, mkldnn = torch.backends.cuda.matmul, torch.backends.mkldnn.matmul
    saved = (matmul.fp32_precision, mkldnn.fp32_precision)
    seen = []
    real = torch.matmul

    def spy(a, b):
        seen.append((matmul.fp32_precision, mkldnn.fp32_precision))
        return real(a, b)

    monkeypatch.setattr(torch, "matmul", spy)
    try:
        torch.backends.cuda.matmul.allow_tf32 = True  # the user's legacy switch
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        q, k = torch.randn(1, 2, 6, 4), torch.randn(1, 1, 6, 4)
        span_share(q, k, [(0, 2)], q_chunk=3, k_chunk=4)
        span_share_given_lse(q, k, [(0, 2)], torch.zeros(1, 2, 6), q_chunk=3, k_chunk=4)
        assert seen and all(pair == ("ieee", "ieee") for pair in seen)
        # The user's settings are back afterwards, readable through the legacy API too.
        assert (matmul.fp32_precision, mkldnn.fp32_precision) == ("tf32", "bf16")
        assert torch.backends.cuda.matmul.allow_tf32 is True
        with ieee_fp32_matmul():
            assert matmul.fp32_precision == "ieee"
        assert matmul.fp32_precision == "tf32"
    finally:
        matmul.fp32_precision, mkldnn.fp32_precision = saved
