"""CUDA paths: attention capture and the hf engine on a GPU. Skipped without CUDA.

The CPU suite checks the same logic; these make sure nothing CPU-only (dtypes, device
placement, kernels chosen by SDPA on the GPU) breaks it.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from sysbench_gpu.attn_hooks import AttentionShareCapture, eager_reference_shares, span_share  # noqa: E402
from sysbench_gpu.engines.base import SamplingSpec  # noqa: E402

pytestmark = pytest.mark.gpu


def _tiny_llama(dtype: torch.dtype):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=97, hidden_size=128, intermediate_size=192, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096,
    )
    return transformers.LlamaForCausalLM(config).to(device="cuda", dtype=dtype).eval()


def test_span_share_on_cuda_matches_cpu():
    torch.manual_seed(0)
    q, k = torch.randn(1, 8, 700, 64), torch.randn(1, 2, 700, 64)
    spans = [(0, 5), (5, 300)]
    on_cpu = span_share(q, k, spans, scale=0.125, q_chunk=128, k_chunk=200)
    on_gpu = span_share(q.cuda(), k.cuda(), spans, scale=0.125, q_chunk=128, k_chunk=200)
    assert torch.allclose(on_gpu.cpu(), on_cpu, atol=1e-5)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_capture_on_cuda_matches_eager_and_keeps_logits(dtype, tolerance):
    model = _tiny_llama(dtype)
    ids = torch.randint(0, 97, (1, 1500), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    spans = [(0, 3), (3, 400)]
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True).attentions
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    with AttentionShareCapture(model, layers=[2, 3], spans=spans, chunk_tokens=512) as capture:
        with torch.no_grad():
            logits = model(input_ids=ids).logits
    assert torch.equal(logits, plain)
    for layer in (2, 3):
        expected = eager_reference_shares(attentions[layer].float(), spans).mean(dim=1)
        assert torch.allclose(capture.results[layer].mean.float().to(expected.device), expected, atol=tolerance)


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
