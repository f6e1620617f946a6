"""Steering (PASTA-style) in the hf engine on SmolLM2 (CPU): α = 1 is plain generation; α = 2 raises the share."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # loads SmolLM2

from sysbench_gpu.attention.capture.hooks import AttentionShareCapture  # noqa: E402
from sysbench_gpu.attention.capture.segments import TurnText, layout_conversation  # noqa: E402
from sysbench_gpu.benchmarks.registry import load_dataset  # noqa: E402
from sysbench_gpu.cli import main  # noqa: E402
from sysbench_gpu.core.errors import SysbenchError  # noqa: E402
from sysbench_gpu.core.messages import conversation_for_turn  # noqa: E402
from sysbench_gpu.engines.base import SamplingSpec  # noqa: E402
from sysbench_gpu.modeling.key_bias import key_bias  # noqa: E402
from sysbench_gpu.modeling.registry import attention_modules  # noqa: E402
from sysbench_gpu.modeling.steering import Steering, read_steer_heads  # noqa: E402

MAX_TOKENS = 10
SESSIONS = 2
STEER_LAYERS = "10-19"


@pytest.fixture(scope="module")
def loaded(smollm2_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two spinning threads on a shared 2-core box are several times slower
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()
    yield model, tokenizer
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def demo():
    return load_dataset("demo").sessions[:SESSIONS]


def _engine(loaded, steering):
    from sysbench_gpu.engines.hf import HFEngine

    model, tokenizer = loaded
    return HFEngine.from_model(model, tokenizer, "smollm2", batch_size=2, steering=steering)


def _generated_ids(engine, conversations, monkeypatch):
    """The token ids ``generate`` returned, per batch (recorded around the model's own generate)."""
    seen = []
    original = engine.hf_model.generate

    def recording(*args, **kwargs):
        output = original(*args, **kwargs)
        seen.append(output.tolist())
        return output

    monkeypatch.setattr(engine.hf_model, "generate", recording)
    texts = [c.text for c in engine.chat(conversations, SamplingSpec(max_tokens=MAX_TOKENS))]
    monkeypatch.undo()
    return seen, texts


def test_alpha_one_is_plain_generation_token_for_token(loaded, demo, monkeypatch):
    conversations = [conversation_for_turn(s, 1, {}) for s in demo]
    plain = _generated_ids(_engine(loaded, None), conversations, monkeypatch)
    # α = 1 must not hook attention at all: building a key bias would fail here.
    monkeypatch.setattr("sysbench_gpu.engines.hf.key_bias", lambda *a, **k: pytest.fail("α = 1 installed a hook"))
    steered_engine = _engine(loaded, Steering(alpha=1.0, layers_spec=STEER_LAYERS))
    seen, texts = [], []
    original = steered_engine.hf_model.generate

    def recording(*args, **kwargs):
        assert steered_engine.hf_model.config._attn_implementation == "sdpa"
        output = original(*args, **kwargs)
        seen.append(output.tolist())
        return output

    steered_engine.hf_model.generate = recording
    try:
        texts = [c.text for c in steered_engine.chat(conversations, SamplingSpec(max_tokens=MAX_TOKENS))]
    finally:
        del steered_engine.hf_model.generate
    assert (seen, texts) == plain
    assert steered_engine.describe()["steering"]["path"].startswith("plain")


def test_alpha_two_generates_and_cleans_up(loaded, demo):
    conversations = [conversation_for_turn(s, 1, {}) for s in demo]
    engine = _engine(loaded, Steering(alpha=2.0, layers_spec=STEER_LAYERS))
    spans = [engine.system_span(c) for c in conversations]
    for span, conversation in zip(spans, conversations, strict=True):
        text = engine.tokenizer.decode(engine.prompt_ids(conversation)[span[0] : span[1]])
        assert text.strip() == conversation[0]["content"].strip()
    completions = engine.chat(conversations, SamplingSpec(max_tokens=MAX_TOKENS))
    assert all(c.output_tokens > 0 for c in completions)  # what steering does to the replies is reported, not asserted
    assert engine.hf_model.config._attn_implementation == "sdpa"
    assert not any(hasattr(m, "_sysbench_key_bias") for m in attention_modules(engine.hf_model).values())
    described = engine.describe()["steering"]
    assert described["alpha"] == 2.0 and described["layers"] == list(range(10, 20))


def test_alpha_two_raises_system_share_at_steered_layers_only(loaded, demo):
    model, tokenizer = loaded
    steering = Steering(alpha=2.0, layers_spec=STEER_LAYERS)
    layers = steering.layers(30)
    below, measured = 5, [5, 10, 15, 19]
    for session in demo:
        turns = [TurnText(1, session.turns[0].user[:120], "Of course, chef! Here is a dish for you.")]
        layout = layout_conversation(tokenizer, session.system_prompt, turns, "system")
        ids = torch.tensor([layout.token_ids])
        after = slice(layout.system[1], None)
        with AttentionShareCapture(model, layers=measured, spans=[layout.system]) as capture:
            plain = {layer: r.mean[0, after, 0] for layer, r in capture.forward(ids, stop_early=False).items()}
        with key_bias(model, layers, steering.value, steering.heads_by_layer(30)) as bias:
            bias.set_spans([layout.system])
            with AttentionShareCapture(model, layers=measured, spans=[layout.system]) as capture:
                steered = {layer: r.mean[0, after, 0] for layer, r in capture.forward(ids, stop_early=False).items()}
        assert torch.equal(steered[below], plain[below]), f"session {session.system_id}: layer {below} changed"
        for layer in measured[1:]:
            assert steered[layer].mean() > plain[layer].mean(), f"session {session.system_id}, layer {layer}"
            assert bool((steered[layer] > plain[layer]).all())
    assert model.config._attn_implementation == "sdpa"


def test_steer_heads_file_and_engine_refusals(tmp_path):
    bare, wrapped, bad = tmp_path / "bare.json", tmp_path / "wrapped.json", tmp_path / "bad.json"
    bare.write_text(json.dumps([[12, 3], [14, 0]]))
    wrapped.write_text(json.dumps({"heads": [[12, 3]], "metric": "share"}))
    bad.write_text(json.dumps({"heads": [[12]]}))
    assert read_steer_heads(bare) == ((12, 3), (14, 0)) and read_steer_heads(wrapped) == ((12, 3),)
    with pytest.raises(SysbenchError, match=r"bad.json: heads\[0\] is \[12\]"):
        read_steer_heads(bad)
    steering = Steering(alpha=2.0, heads=read_steer_heads(bare))
    assert steering.layers(30) == [12, 14] and steering.heads_by_layer(30) == {12: (3,), 14: (0,)}
    with pytest.raises(SysbenchError, match="--steer-system must be greater than 0"):
        Steering(alpha=0.0)
    for engine in ("vllm", "openai"):
        args = ["generate", "--data", "demo", "--model", "smollm2", "--engine", engine, "--out", str(tmp_path / engine)]
        assert main([*args, "--steer-system", "2"]) == 2
    assert not (tmp_path / "vllm").exists()


def test_manifest_records_steering_and_a_rerun_must_match(tmp_path, demo):
    from fake_engine import FakeEngine

    from sysbench_gpu.core.rundir import RunDir
    from sysbench_gpu.generation.run import run_generation
    from sysbench_gpu.generation.settings import GenerateSettings

    dataset = load_dataset("demo")
    run = RunDir(tmp_path / "run")
    steered = Steering(alpha=2.0, layers_spec=STEER_LAYERS).describe()
    settings = GenerateSettings(model="smollm2", engine="hf", steering=steered)
    run_generation(FakeEngine(), dataset, list(demo[:1]), run, settings, progress=False)
    section = run.read_manifest()["stages"]["generate"]
    assert section["steering"]["alpha"] == 2.0 and section["steering"]["layers_spec"] == STEER_LAYERS
    plain = GenerateSettings(model="smollm2", engine="hf")
    with pytest.raises(SysbenchError, match="field 'steering' was"):
        run_generation(FakeEngine(), dataset, list(demo[:1]), run, plain, progress=False)


def _top_heads():
    """top_heads.json as attention-analyze writes it: head 2 carries the outcome (significant), the rest do not."""
    pytest.importorskip("scipy")
    import numpy as np

    from sysbench_gpu.attention.analysis import heads
    from sysbench_gpu.attention.analysis.head_table import HeadTable

    rng = np.random.default_rng(1)
    n_sessions, turns = 30, 5
    passed = (rng.random(n_sessions * turns) > 0.4).astype(float)
    shares = rng.normal(0.3, 0.05, size=(passed.size, 1, 4))
    shares[:, 0, 2] += 0.1 * passed
    shares[:, 0, 0] += 0.004 * passed  # a weak positive r: in the top list, not significant
    table = HeadTable(
        np.repeat(np.arange(n_sessions), turns),
        np.tile(np.arange(1, turns + 1), n_sessions),
        np.full(passed.size, 20),
        shares,
        passed,
        [12],
        ["mid"],
    )
    return heads.top_heads(heads.head_map(table, n_boot=50, seed=0, permutations=2000), 4)


def test_steer_heads_warns_once_on_heads_that_are_not_significant(tmp_path, caplog):
    top = _top_heads()
    by_head = {(item["layer"], item["head"]): item for item in top["details"]}
    assert by_head[(12, 2)]["significant"] and not by_head[(12, 0)]["significant"]
    weak = [pair for pair, item in by_head.items() if not item["significant"]]

    written = tmp_path / "top_heads.json"
    written.write_text(json.dumps(top))
    with caplog.at_level("WARNING", logger="sysbench_gpu.modeling.steering"):
        pairs = read_steer_heads(written)
    assert [list(pair) for pair in pairs] == top["heads"]  # the file stays readable by --steer-heads
    (record,) = caplog.records
    assert f"{len(weak)} of {len(pairs)} heads are not significant" in record.getMessage()
    assert "[12, 0]" in record.getMessage() and "[12, 2]" not in record.getMessage()

    only_significant = tmp_path / "significant.json"
    only_significant.write_text(json.dumps({**top, "heads": [[12, 2]]}))
    caplog.clear()
    with caplog.at_level("WARNING", logger="sysbench_gpu.modeling.steering"):
        assert read_steer_heads(only_significant) == ((12, 2),)
    assert not caplog.records

    # A file written before the session permutation test: its q treated turns as independent, so it counts as none.
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"heads": [[12, 2]], "details": [{"layer": 12, "head": 2, "q": 0.001}]}))
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps([[12, 2]]))
    for path, reason in ((old, "predates attention-analyze's session permutation test"), (bare, "bare list")):
        caplog.clear()
        with caplog.at_level("WARNING", logger="sysbench_gpu.modeling.steering"):
            read_steer_heads(path)
        (record,) = caplog.records
        assert "1 of 1 heads are not significant" in record.getMessage() and reason in record.getMessage()
