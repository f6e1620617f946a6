"""The attention manifest says how shares were made, and whether the model's softcap was applied (issue 8 item 9)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from sysbench_gpu.attention.capture.layout import Distributed, LoadPlan  # noqa: E402
from sysbench_gpu.attention.capture.measure import _manifest_fields  # noqa: E402


def _fields(model):
    args = SimpleNamespace(chunk_tokens=None, chunk_mib=256)
    return _manifest_fields(
        args,
        model,
        SimpleNamespace(chat_template="t"),
        "path",
        {"mid": 1},
        128,
        Distributed(0, 1, 0),
        LoadPlan("single"),
    )


def test_manifest_says_whether_softcap_was_applied():
    torch.manual_seed(0)
    config = transformers.Gemma2Config(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=8,
        attn_logit_softcapping=5.0,
        final_logit_softcapping=None,
        query_pre_attn_scalar=16,
    )
    model = transformers.Gemma2ForCausalLM(config).eval()
    model.set_attn_implementation("sdpa")
    fields = _fields(model)
    assert fields["attn_logit_softcapping"].startswith(
        "5 in the config, not applied: the capture runs transformers' SDPA"
    )
    assert "capture_paths says which ran" in fields["capture_method"]
    model.set_attn_implementation("eager")
    assert _fields(model)["attn_logit_softcapping"] == "5, applied by the model's eager attention and in the shares"
    llama = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=97,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    )
    assert _fields(llama)["attn_logit_softcapping"] is None
