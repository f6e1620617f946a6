"""Attention-share capture: chunked math against eager attention, restore, refusals."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from sysbench_gpu.attn_hooks import (  # noqa: E402
    CAPTURE_ATTR,
    AttentionShareCapture,
    eager_reference_shares,
    plan_chunks,
    resolve_layers,
    span_share,
)
from sysbench_gpu.errors import SysbenchError  # noqa: E402

TOL = 1e-5


def naive_shares(q, k, spans, scale, mask_fn=None, softcap=None):
    """Dense reference: repeat keys, full softmax, sum columns."""
    heads, kv_heads = q.shape[1], k.shape[1]
    keys = k.repeat_interleave(heads // kv_heads, dim=1)
    scores = (q.double() @ keys.double().transpose(-1, -2)) * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    t_q, t_k = q.shape[2], k.shape[2]
    qi = torch.arange(t_q)[:, None] + (t_k - t_q)
    ki = torch.arange(t_k)[None, :]
    visible = ki <= qi if mask_fn is None else mask_fn(qi, ki)
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = scores.softmax(-1)
    return torch.stack([probs[..., a:b].sum(-1) for a, b in spans], dim=-1).float()


@pytest.mark.parametrize("q_chunk,k_chunk", [(1, 1), (5, 7), (7, 64), (None, None), (13, 3)])
def test_span_share_matches_dense_softmax_with_gqa(q_chunk, k_chunk):
    torch.manual_seed(0)
    q, k = torch.randn(2, 6, 29, 16) * 2, torch.randn(2, 2, 29, 16) * 2
    spans = [(0, 3), (3, 17), (10, 29), (28, 40)]
    got = span_share(q, k, spans, scale=0.25, q_chunk=q_chunk, k_chunk=k_chunk)
    assert got.shape == (2, 6, 29, 4)
    assert torch.allclose(got, naive_shares(q, k, spans, 0.25), atol=TOL)


def test_span_share_window_softcap_masks_and_offset():
    torch.manual_seed(1)
    q, k = torch.randn(1, 4, 23, 8), torch.randn(1, 4, 23, 8)
    spans = [(0, 5), (5, 23)]
    windowed = span_share(q, k, spans, scale=0.5, q_chunk=4, k_chunk=6, sliding_window=5, softcap=3.0)
    expected = naive_shares(q, k, spans, 0.5, mask_fn=lambda qi, ki: (ki <= qi) & (qi - ki < 5), softcap=3.0)
    assert torch.allclose(windowed, expected, atol=TOL)
    # The same window given as the model's boolean mask, and as an additive float mask.
    qi, ki = torch.arange(23)[:, None], torch.arange(23)[None, :]
    bool_mask = ((ki <= qi) & (qi - ki < 5))[None, None]
    float_mask = torch.zeros(1, 1, 23, 23).masked_fill(~bool_mask, torch.finfo(torch.float32).min)
    for mask in (bool_mask, float_mask):
        got = span_share(q, k, spans, scale=0.5, q_chunk=9, k_chunk=4, softcap=3.0, mask=mask)
        assert torch.allclose(got, expected, atol=TOL)
    # Fewer queries than keys: the queries are the last positions (prefix cache).
    tail = span_share(q[:, :, -6:], k, spans, scale=0.5, q_chunk=4, k_chunk=5)
    assert torch.allclose(tail, naive_shares(q, k, spans, 0.5)[:, :, -6:], atol=TOL)


def test_plan_chunks_stays_within_budget():
    plan = plan_chunks(1, 64, 8192, 8192, budget_bytes=64 << 20)
    assert plan.peak_bytes(1, 64) <= 64 << 20
    assert plan.k_chunk == 4096 and plan.q_chunk >= 1
    assert plan_chunks(1, 9, 100, 100, chunk_tokens=33) == type(plan)(33, 33)
    with pytest.raises(SysbenchError):
        plan_chunks(1, 9, 100, 100, chunk_tokens=0)


def test_resolve_layers():
    assert resolve_layers("mid,last", 30) == {"mid": 15, "last": 29}
    assert resolve_layers("0,-1", 4) == {"layer0": 0, "layer3": 3}
    assert len(resolve_layers("all", 5)) == 5
    with pytest.raises(SysbenchError, match="out of range"):
        resolve_layers("7", 4)


def _tiny(kind: str):
    torch.manual_seed(0)
    common = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    if kind == "llama":
        config = transformers.LlamaConfig(**common)
        return transformers.LlamaForCausalLM(config).eval()
    if kind == "qwen2":
        config = transformers.Qwen2Config(**common)
        return transformers.Qwen2ForCausalLM(config).eval()
    if kind == "mistral-window":
        config = transformers.MistralConfig(**common, sliding_window=8)
        return transformers.MistralForCausalLM(config).eval()
    if kind == "gemma2-softcap":  # alternating sliding-window layers, attention logit softcapping
        config = transformers.Gemma2Config(**common, head_dim=16, sliding_window=8, attn_logit_softcapping=5.0,
                                           final_logit_softcapping=None, query_pre_attn_scalar=16)
        return transformers.Gemma2ForCausalLM(config).eval()
    if kind == "glm4":
        config = transformers.Glm4Config(**common, pad_token_id=0)
        return transformers.Glm4ForCausalLM(config).eval()
    raise ValueError(kind)


def _eager_attentions(model, ids):
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return model(input_ids=ids, output_attentions=True).attentions
    finally:
        model.set_attn_implementation("sdpa")


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral-window", "gemma2-softcap", "glm4"])
def test_tiny_models_match_eager_and_keep_logits(kind):
    model = _tiny(kind)
    ids = torch.randint(0, 97, (1, 41), generator=torch.Generator().manual_seed(3))
    spans = [(0, 2), (2, 25)]
    layers = [2, 3]  # middle and last of 4
    attentions = _eager_attentions(model, ids)
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    for chunk in (None, 6, 16):
        with AttentionShareCapture(model, layers=layers, spans=spans, chunk_tokens=chunk) as capture:
            with torch.no_grad():
                logits = model(input_ids=ids).logits
        assert torch.equal(logits, plain), "capture changed the model's output"
        for layer in layers:
            expected = eager_reference_shares(attentions[layer], spans).mean(dim=1)
            assert torch.allclose(capture.results[layer].mean, expected, atol=TOL), (kind, chunk, layer)
    assert model.config._attn_implementation == "sdpa"


def test_smollm2_grouped_query_matches_eager(smollm2_path):
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()
    assert model.config.num_attention_heads == 9 and model.config.num_key_value_heads == 3
    ids = torch.randint(0, 5000, (1, 50), generator=torch.Generator().manual_seed(5))
    spans = [(0, 3), (3, 31)]
    attentions = _eager_attentions(model, ids)
    n_layers = model.config.num_hidden_layers
    layers = [n_layers // 2, n_layers - 1]
    for chunk in (7, 32):
        with AttentionShareCapture(model, layers=layers, spans=spans, chunk_tokens=chunk, per_head=True) as capture:
            results = capture.forward(ids, stop_early=chunk == 7)
        for layer in layers:
            per_head = eager_reference_shares(attentions[layer], spans)
            assert torch.allclose(results[layer].per_head, per_head, atol=TOL)
            assert torch.allclose(results[layer].mean, per_head.mean(dim=1), atol=TOL)


def test_context_manager_restores_after_exception():
    model = _tiny("llama")
    before = model.config._attn_implementation
    with pytest.raises(RuntimeError, match="boom"):
        with AttentionShareCapture(model, layers=[1], spans=[(0, 2)]):
            assert model.config._attn_implementation != before
            raise RuntimeError("boom")
    assert model.config._attn_implementation == before
    assert not any(CAPTURE_ATTR in module.__dict__ for module in model.modules())
    assert "_attn_was_changed" not in model.config.__dict__
    # An eager model stays eager, and its capture wraps the model file's own eager function.
    model.set_attn_implementation("eager")
    ids = torch.randint(0, 97, (1, 12))
    with AttentionShareCapture(model, layers=[3], spans=[(0, 4)]) as capture:
        capture.forward(ids)
    assert model.config._attn_implementation == "eager"
    assert capture.results[3].mean.shape == (1, 12, 1)


def test_model_bypassing_the_interface_is_refused():
    model = _tiny("llama")
    attention = model.model.layers[1].self_attn

    def bypass(hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
        # An attention that computes its own output without the interface.
        return attention.o_proj(attention.q_proj(hidden_states)), None

    attention.forward = bypass
    ids = torch.randint(0, 97, (1, 10))
    with AttentionShareCapture(model, layers=[1, 3], spans=[(0, 2)]) as capture:
        with pytest.raises(SysbenchError, match=r"layer\(s\) \[1\] never called"):
            capture.forward(ids, stop_early=False)
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(SysbenchError, match="no attention module with layer_idx"):
        with AttentionShareCapture(model, layers=[9], spans=[(0, 2)]):
            pass
