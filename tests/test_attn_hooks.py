"""Attention-share capture on real model code: both paths against eager attention, logits unchanged, restore,
refusals."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from sysbench_gpu.attention.capture import kernels as attn_kernels  # noqa: E402 (after importorskip: torch and transformers are optional)
from sysbench_gpu.attention.capture.hooks import CAPTURE_ATTR, AttentionShareCapture  # noqa: E402 (after importorskip: torch and transformers are optional)
from sysbench_gpu.attention.capture.layers import attention_modules, resolve_layers  # noqa: E402 (after importorskip: torch and transformers are optional)
from sysbench_gpu.attention.capture.span_math import eager_reference_shares  # noqa: E402 (after importorskip: torch and transformers are optional)
from sysbench_gpu.core.errors import SysbenchError  # noqa: E402 (after importorskip: torch and transformers are optional)

TOL = 1e-5
PATHS = ("auto", "fallback")


def test_resolve_layers():
    assert resolve_layers("mid,last", 30) == {"mid": 15, "last": 29}
    assert resolve_layers("0,-1", 4) == {"layer0": 0, "layer3": 3}
    assert len(resolve_layers("all", 5)) == 5
    with pytest.raises(SysbenchError, match="out of range"):
        resolve_layers("7", 4)


def _tiny(kind: str):
    torch.manual_seed(0)
    common = dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
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
        config = transformers.Gemma2Config(
            **common,
            head_dim=16,
            sliding_window=8,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=None,
            query_pre_attn_scalar=16,
        )
        return transformers.Gemma2ForCausalLM(config).eval()
    if kind == "glm4":
        config = transformers.Glm4Config(**common, pad_token_id=0)
        return transformers.Glm4ForCausalLM(config).eval()
    raise ValueError(kind)


def _eager_attentions(model, ids, without_softcap=False):
    """Eager attention probabilities of every layer; ``without_softcap``: as SDPA computes them
    (no logit softcapping)."""
    modules = attention_modules(model)
    saved = {i: getattr(m, "attn_logit_softcapping", None) for i, m in modules.items()}
    model.set_attn_implementation("eager")
    try:
        if without_softcap:
            for module in modules.values():
                if hasattr(module, "attn_logit_softcapping"):
                    module.attn_logit_softcapping = None
        with torch.no_grad():
            out = model(input_ids=ids, output_attentions=True)
        return out.attentions, out.logits
    finally:
        for index, module in modules.items():
            if hasattr(module, "attn_logit_softcapping"):
                module.attn_logit_softcapping = saved[index]
        model.set_attn_implementation("sdpa")


KINDS = ["llama", "qwen2", "mistral-window", "gemma2-softcap", "glm4"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", KINDS)
def test_tiny_models_match_eager_and_keep_logits(kind, path):
    """Both paths equal eager attention (as SDPA runs it) on mid and last layers; chunks 6 and 16 do not
    divide T = 41."""
    model = _tiny(kind)
    ids = torch.randint(0, 97, (1, 41), generator=torch.Generator().manual_seed(3))
    spans = [(0, 2), (2, 25)]
    layers = [2, 3]  # middle and last of 4
    attentions, _ = _eager_attentions(model, ids, without_softcap=True)  # SDPA ignores softcap
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    for chunk in (None, 6, 16):
        with (
            AttentionShareCapture(model, layers=layers, spans=spans, chunk_tokens=chunk, path=path) as capture,
            torch.no_grad(),
        ):
            logits = model(input_ids=ids).logits
        assert torch.equal(logits, plain), f"capture changed the model's output ({kind}, {path})"
        for layer in layers:
            expected = eager_reference_shares(attentions[layer], spans).mean(dim=1)
            assert torch.allclose(capture.results[layer].mean, expected, atol=TOL), (kind, chunk, layer)
            recorded = capture.paths[layer]
            assert recorded.startswith("kernel-lse (torch-cpu-flash)" if path == "auto" else "fallback (requested)"), (
                recorded
            )
    assert model.config._attn_implementation == "sdpa"


def test_smollm2_grouped_query_matches_eager_on_both_paths(smollm2_path):
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()
    assert model.config.num_attention_heads == 9 and model.config.num_key_value_heads == 3
    ids = torch.randint(0, 5000, (1, 50), generator=torch.Generator().manual_seed(5))
    spans = [(0, 3), (3, 31)]
    attentions, _ = _eager_attentions(model, ids)
    n_layers = model.config.num_hidden_layers
    layers = [n_layers // 2, n_layers - 1]
    for path in PATHS:
        for chunk in (7, 32):
            with AttentionShareCapture(
                model, layers=layers, spans=spans, chunk_tokens=chunk, per_head=True, path=path
            ) as capture:
                results = capture.forward(ids, stop_early=chunk == 7)
            for layer in layers:
                per_head = eager_reference_shares(attentions[layer], spans)
                assert torch.allclose(results[layer].per_head, per_head, atol=TOL), (path, chunk, layer)
                assert torch.allclose(results[layer].mean, per_head.mean(dim=1), atol=TOL)


def test_gemma2_shares_describe_the_attention_each_path_ran(caplog):
    """Issue 8 item 9: transformers' SDPA path drops Gemma 2's softcap, eager applies it; the shares follow each."""
    model = _tiny("gemma2-softcap")
    with torch.no_grad():  # random weights give scores far below the cap of 5; scale q and k so that it bites
        for module in attention_modules(model).values():
            module.q_proj.weight.mul_(12)
            module.k_proj.weight.mul_(12)
    ids = torch.randint(0, 97, (1, 41), generator=torch.Generator().manual_seed(3))
    spans = [(0, 2), (2, 25)]
    capped, capped_logits = _eager_attentions(model, ids)
    uncapped, uncapped_logits = _eager_attentions(model, ids, without_softcap=True)
    with torch.no_grad():
        sdpa_logits = model(input_ids=ids).logits
    # What SDPA really computes: the attention without softcap (its logits match that eager run, not the capped one).
    assert torch.allclose(sdpa_logits, uncapped_logits, atol=1e-5)
    assert not torch.allclose(sdpa_logits, capped_logits, atol=1e-3)
    differs = max(
        float((eager_reference_shares(capped[i], spans) - eager_reference_shares(uncapped[i], spans)).abs().max())
        for i in (2, 3)
    )
    assert differs > 0.05  # the softcap changes the shares visibly: the comparison below can tell them apart
    for path in PATHS:
        with (
            caplog.at_level(logging.INFO, logger="sysbench_gpu.attention.capture.hooks"),
            AttentionShareCapture(model, layers=[2, 3], spans=spans, path=path) as capture,
            torch.no_grad(),
        ):
            assert torch.equal(model(input_ids=ids).logits, sdpa_logits)
        for layer in (2, 3):
            assert torch.allclose(
                capture.results[layer].mean, eager_reference_shares(uncapped[layer], spans).mean(dim=1), atol=TOL
            )
            assert "softcap 5 not applied: the model's sdpa attention ignores it" in capture.paths[layer]
    assert "softcap 5 not applied" in caplog.text
    # Eager: the model file's eager function applies the softcap, and the capture (fallback path) does too.
    model.set_attn_implementation("eager")
    with AttentionShareCapture(model, layers=[2, 3], spans=spans) as capture, torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, capped_logits)
    for layer in (2, 3):
        assert torch.allclose(
            capture.results[layer].mean, eager_reference_shares(capped[layer], spans).mean(dim=1), atol=TOL
        )
        assert capture.paths[layer] == "fallback (eager attention returns no log-sum-exp)"


def test_a_failing_kernel_falls_back_to_the_models_own_call(monkeypatch):
    model = _tiny("llama")
    ids = torch.randint(0, 97, (1, 30), generator=torch.Generator().manual_seed(4))
    spans = [(0, 2), (2, 12)]
    attentions, _ = _eager_attentions(model, ids)
    with torch.no_grad():
        plain = model(input_ids=ids).logits

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel image is available for execution on the device\nsecond line")

    monkeypatch.setattr(attn_kernels, "cpu_flash_attention", broken)
    with AttentionShareCapture(model, layers=[3], spans=spans) as capture, torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, plain)
    assert (
        capture.paths[3]
        == "fallback (torch-cpu-flash failed: no kernel image is available for execution on the device)"
    )
    assert torch.allclose(capture.results[3].mean, eager_reference_shares(attentions[3], spans).mean(dim=1), atol=TOL)


def test_context_manager_restores_after_exception():
    model = _tiny("llama")
    before = model.config._attn_implementation
    with pytest.raises(RuntimeError, match="boom"), AttentionShareCapture(model, layers=[1], spans=[(0, 2)]):
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
    with (
        AttentionShareCapture(model, layers=[1, 3], spans=[(0, 2)]) as capture,
        pytest.raises(SysbenchError, match=r"layer\(s\) \[1\] never called"),
    ):
        capture.forward(ids, stop_early=False)
    assert model.config._attn_implementation == "sdpa"
    with (
        pytest.raises(SysbenchError, match="no attention module with layer_idx"),
        AttentionShareCapture(model, layers=[9], spans=[(0, 2)]),
    ):
        pass
