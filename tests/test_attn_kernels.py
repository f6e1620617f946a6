"""Kernels that return the row LSE: the CPU kernel against SDPA and a dense log-sum-exp; which kernel is chosen
where."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from sysbench_gpu.attention.capture import kernels as attn_kernels  # noqa: E402
from sysbench_gpu.attention.capture.kernels import (  # noqa: E402
    KernelInputs,
    additive_mask,
    choose_kernel,
    cpu_flash_attention,
)


def _qkv(heads=6, kv_heads=2, t=37, dim=16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shape = lambda h: (1, h, t, dim)  # noqa: E731
    return (
        torch.randn(*shape(heads), generator=generator),
        torch.randn(*shape(kv_heads), generator=generator),
        torch.randn(*shape(kv_heads), generator=generator),
    )


def _dense_lse(q, k, scale, visible):
    keys = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = (q.double() @ keys.double().transpose(-1, -2)) * scale
    return scores.masked_fill(~visible, float("-inf")).logsumexp(-1)


def test_cpu_kernel_output_is_sdpas_bit_for_bit_and_its_lse_a_dense_one():
    """The CPU kernel is what SDPA runs: grouped-query keys (enable_gqa) without a mask, repeated keys with one."""
    q, k, v = _qkv()
    t = q.shape[2]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    result = cpu_flash_attention(q, k, v, None, KernelInputs(scale=0.3, is_causal=True))
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
    assert torch.equal(result.output, sdpa.transpose(1, 2).contiguous())
    assert result.output.shape == (1, t, 6, 16) and result.lse.shape == (1, 6, t) and result.lse.dtype == torch.float32
    assert torch.allclose(result.lse.double(), _dense_lse(q, k, 0.3, causal), atol=1e-5)
    # A model's boolean window mask, keys repeated as transformers does when it passes a mask.
    window = causal & (torch.arange(t)[:, None] - torch.arange(t)[None, :] < 5)
    k_rep, v_rep = k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1)
    masked = cpu_flash_attention(q, k_rep, v_rep, window[None, None], KernelInputs(scale=None, is_causal=False))
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k_rep, v_rep, attn_mask=window[None, None])
    assert torch.equal(masked.output, sdpa.transpose(1, 2).contiguous())
    assert torch.allclose(masked.lse.double(), _dense_lse(q, k, 16**-0.5, window), atol=1e-5)


def test_additive_mask_is_sdpas_conversion():
    mask = torch.tensor([[True, False], [True, True]])
    assert torch.equal(additive_mask(mask, torch.float32), torch.tensor([[0.0, float("-inf")], [0.0, 0.0]]))
    assert additive_mask(mask, torch.bfloat16).dtype == torch.bfloat16
    floats = torch.zeros(2, 2)
    assert additive_mask(floats, torch.float32) is floats and additive_mask(None, torch.float32) is None


def test_efficient_kernel_bias_is_padded_to_aligned_rows():
    bias = torch.zeros(1, 1, 5, 37)
    aligned = attn_kernels._aligned_bias(bias)
    assert aligned.shape == bias.shape and aligned.stride(-2) == 48
    ready = torch.zeros(1, 1, 5, 32)
    assert attn_kernels._aligned_bias(ready) is ready


def _fake(device="cuda", dtype=torch.bfloat16, heads=8, kv_heads=2, t=10, dim=128):
    return (
        SimpleNamespace(device=SimpleNamespace(type=device), dtype=dtype, shape=(1, heads, t, dim)),
        SimpleNamespace(shape=(1, kv_heads, t, dim)),
        SimpleNamespace(shape=(1, kv_heads, t, dim)),
    )


@pytest.mark.parametrize(
    "case,expected",
    [
        (dict(device="cpu", dtype=torch.float32), "torch-cpu-flash"),
        (dict(), "flash-attn"),
        (dict(flash_attn=False), "torch-cuda-flash"),
        (dict(dtype=torch.float32), "torch-cuda-efficient"),  # the flash kernels take no fp32
        (dict(dim=80 + 4), "torch-cuda-efficient"),  # head size not a multiple of 8
        (dict(mask=True), "torch-cuda-efficient"),  # only the efficient kernel takes a mask
        (dict(device="mps"), None),
        (dict(base="eager"), None),
        (dict(capability=(7, 5)), "torch-cuda-efficient"),  # T4: no flash kernel below sm80
        (dict(capability=(7, 0), flash_attn=False), "torch-cuda-efficient"),
        (dict(capability=(8, 0)), "flash-attn"),
    ],
)
def test_kernel_choice(case, expected):
    q, k, v = _fake(**{key: case[key] for key in ("device", "dtype", "dim") if key in case})
    mask = torch.ones(1, 1, 10, 10, dtype=torch.bool) if case.get("mask") else None
    choice = choose_kernel(
        q,
        k,
        v,
        mask,
        case.get("base", "sdpa"),
        flash_attn_available=case.get("flash_attn", True),
        capability=case.get("capability", (9, 0)),
    )
    if expected is None:
        assert choice.function is None and choice.reason
    else:
        assert choice.name == expected and callable(choice.function)


def test_kernel_choice_refusals_say_why():
    q, k, v = _fake(device="cpu")
    assert choose_kernel(q, k, v, None, "eager").reason == "eager attention returns no log-sum-exp"
    short_q = SimpleNamespace(device=q.device, dtype=q.dtype, shape=(1, 8, 4, 128))
    assert "differ in length" in choose_kernel(short_q, k, v, None, "sdpa").reason
    assert "no kernel with log-sum-exp on mps" in choose_kernel(*_fake(device="mps"), None, "sdpa").reason
