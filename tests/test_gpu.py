"""CUDA paths: attention capture (each kernel that returns LSE, the fallback) and the hf engine. Skipped without CUDA.

The CPU suite checks the same logic; these make sure nothing CPU-only (dtypes, device
placement, the CUDA kernels and their LSE layouts) breaks it. Run with ``-s`` to see how
far each kernel's logits are from the model's own SDPA call.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from sysbench_gpu.attention.capture.hooks import AttentionShareCapture  # noqa: E402 (after importorskip: torch and transformers are optional)
from sysbench_gpu.attention.capture.kernels import flash_attn_installed  # noqa: E402 (after importorskip: torch and transformers are optional)
from sysbench_gpu.attention.capture.span_math import eager_reference_shares, span_share, span_share_given_lse  # noqa: E402 (after importorskip: torch and transformers are optional)
from sysbench_gpu.engines.base import SamplingSpec  # noqa: E402 (after importorskip: torch and transformers are optional)

pytestmark = pytest.mark.gpu


def _tiny(kind: str, dtype: torch.dtype):
    torch.manual_seed(0)
    common = dict(
        vocab_size=97,
        hidden_size=128,
        intermediate_size=192,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    if kind == "mistral-window":
        model = transformers.MistralForCausalLM(transformers.MistralConfig(**common, sliding_window=300))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    return model.to(device="cuda", dtype=dtype).eval()


def test_span_math_on_cuda_matches_cpu():
    torch.manual_seed(0)
    q, k = torch.randn(1, 8, 700, 64), torch.randn(1, 2, 700, 64)
    spans = [(0, 5), (5, 300)]
    on_cpu = span_share(q, k, spans, scale=0.125, q_chunk=128, k_chunk=200)
    on_gpu = span_share(q.cuda(), k.cuda(), spans, scale=0.125, q_chunk=128, k_chunk=200)
    assert torch.allclose(on_gpu.cpu(), on_cpu, atol=1e-5)
    lse = (
        (q @ k.repeat_interleave(4, dim=1).transpose(-1, -2) * 0.125)
        .masked_fill(torch.ones(700, 700, dtype=torch.bool).triu(1), float("-inf"))
        .logsumexp(-1)
    )
    given_cpu = span_share_given_lse(q, k, spans, lse, scale=0.125, q_chunk=128, k_chunk=200)
    given_gpu = span_share_given_lse(q.cuda(), k.cuda(), spans, lse.cuda(), scale=0.125, q_chunk=128, k_chunk=200)
    assert torch.allclose(given_gpu.cpu(), given_cpu, atol=1e-5) and torch.allclose(given_cpu, on_cpu, atol=1e-5)


def test_tf32_enabled_by_the_user_does_not_reach_the_share_math():
    torch.manual_seed(0)
    q, k = torch.randn(1, 8, 600, 128, device="cuda") * 3, torch.randn(1, 2, 600, 128, device="cuda") * 3
    exact = span_share(q.double(), k.double(), [(0, 50)], q_chunk=100, k_chunk=128)
    saved = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    try:
        got = span_share(q, k, [(0, 50)], q_chunk=100, k_chunk=128)
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"  # restored
    finally:
        torch.backends.cuda.matmul.fp32_precision = saved
    assert torch.allclose(got, exact.float(), atol=1e-5)


# (model kind, dtype, expected kernel, tolerance of shares vs eager)
CASES = [
    ("llama", torch.float32, "torch-cuda-efficient", 1e-5),
    ("llama", torch.bfloat16, "flash-attn" if flash_attn_installed() else "torch-cuda-flash", 2e-2),
    ("mistral-window", torch.bfloat16, "torch-cuda-efficient", 2e-2),  # T > window: a mask, the efficient kernel
    ("mistral-window", torch.float32, "torch-cuda-efficient", 1e-5),
]


@pytest.mark.parametrize("kind,dtype,kernel,tolerance", CASES)
def test_capture_on_cuda_kernels_matches_eager_and_keeps_logits(kind, dtype, kernel, tolerance):
    model = _tiny(kind, dtype)
    ids = torch.randint(0, 97, (1, 1500), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    spans = [(0, 3), (3, 400)]
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True).attentions
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    for path in ("auto", "fallback"):
        with (
            AttentionShareCapture(model, layers=[2, 3], spans=spans, chunk_tokens=512, path=path) as capture,
            torch.no_grad(),
        ):
            logits = model(input_ids=ids).logits
        difference = float((logits.float() - plain.float()).abs().max())
        print(
            f"{kind} {dtype} {path}: logits differ from the model's own SDPA by {difference:.2e}; paths {capture.paths}"
        )
        # The same kernel as SDPA picks gives equal logits; another kernel (flash-attn, efficient for fp32)
        # rounds differently.
        assert difference <= (0.0 if path == "fallback" else 5e-2 if dtype == torch.bfloat16 else 1e-4)
        for layer in (2, 3):
            if path == "auto":
                assert capture.paths[layer].startswith(f"kernel-lse ({kernel})"), capture.paths[layer]
            expected = eager_reference_shares(attentions[layer].float(), spans).mean(dim=1)
            got = capture.results[layer].mean.float().to(expected.device)
            assert torch.allclose(got, expected, atol=tolerance), (path, layer, float((got - expected).abs().max()))


@pytest.mark.parametrize("name", ["cuda_flash_attention", "cuda_efficient_attention", "flash_attn_attention"])
def test_each_cuda_kernel_returns_sdpa_output_and_dense_lse(name):
    from sysbench_gpu.attention.capture import kernels as attn_kernels

    if name == "flash_attn_attention" and not flash_attn_installed():
        pytest.skip("flash-attn is not installed (the [flash] extra)")
    torch.manual_seed(0)
    dtype = torch.float32 if name == "cuda_efficient_attention" else torch.bfloat16
    q = torch.randn(1, 8, 333, 64, device="cuda", dtype=dtype)
    k, v = (
        torch.randn(1, 2, 333, 64, device="cuda", dtype=dtype),
        torch.randn(1, 2, 333, 64, device="cuda", dtype=dtype),
    )
    result = getattr(attn_kernels, name)(q, k, v, None, attn_kernels.KernelInputs(scale=None, is_causal=True))
    reference = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True
    )
    assert result.output.shape == (1, 333, 8, 64) and result.lse.shape == (1, 8, 333)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(result.output.float(), reference.transpose(1, 2), atol=tolerance)
    keys = k.float().repeat_interleave(4, dim=1)
    scores = (q.float() @ keys.transpose(-1, -2)) * 64**-0.5
    dense = scores.masked_fill(torch.ones(333, 333, dtype=torch.bool, device="cuda").triu(1), float("-inf")).logsumexp(
        -1
    )
    assert torch.allclose(result.lse.float(), dense, atol=1e-3 if dtype == torch.bfloat16 else 1e-5)
    # Shares from this LSE equal those of the dense softmax.
    shares = span_share_given_lse(q, k, [(0, 40)], result.lse)
    probs = scores.masked_fill(torch.ones(333, 333, dtype=torch.bool, device="cuda").triu(1), float("-inf")).softmax(-1)
    assert torch.allclose(shares[..., 0], probs[..., :40].sum(-1), atol=tolerance)


def test_peak_memory_reads_the_device_it_is_given():
    """Issue 8 item 5: PeakMemory measures its own device, not the current one."""
    import sys
    from pathlib import Path

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "kernels_bench"))
    from bench_attention_capture import PeakMemory

    torch.cuda.set_device(0)
    with PeakMemory("cuda:1") as memory:
        block = torch.empty(256 << 20, dtype=torch.uint8, device="cuda:1")
        del block
    assert memory.peak >= 256 << 20


def test_hf_engine_generates_on_cuda(smollm2_path):
    from sysbench_gpu.engines.hf import HFEngine

    engine = HFEngine(smollm2_path, device="cuda")
    try:
        conversations = [
            [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": f"Say {word}."}]
            for word in ("yes", "no", "maybe")
        ]
        completions = engine.chat(conversations, SamplingSpec(max_tokens=8))
        assert len(completions) == 3
        assert all(c.output_tokens and c.output_tokens <= 8 for c in completions)
        assert engine.describe()["dtype"] == "bfloat16"
    finally:
        engine.close()
