"""kernels_bench/estimate_attention_run.py: exact per-layer arithmetic, the Qwen2 BPE adapter, and an end-to-end run."""

from __future__ import annotations

import base64
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from sysbench_gpu.attention.capture.segments import TurnText, fit_layout
from sysbench_gpu.benchmarks.registry import save_run_sessions
from sysbench_gpu.core.records import GenerationRecord
from sysbench_gpu.core.rundir import RunDir

SCRIPT = Path(__file__).resolve().parent.parent / "kernels_bench" / "estimate_attention_run.py"


@pytest.fixture(scope="module")
def estimate():
    spec = importlib.util.spec_from_file_location("estimate_attention_run", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_qwen2_72b_shape_and_layer_arithmetic(estimate):
    shape = estimate.ModelShape.from_config(estimate.QWEN2_72B)
    assert shape.head_dim == 128 and shape.n_kv_heads * shape.head_dim == 1024 and shape.qkv_bias
    assert abs(shape.total_params / 72.7e9 - 1) < 0.005  # Qwen2-72B's published size
    t = 1000
    matmul_weights = 8192 * (8192 + 2 * 1024) + 8192 * 8192 + 3 * 8192 * 29568
    assert estimate.layer_flops(shape, t) == 2 * t * matmul_weights + 2 * 8192 * t * (t + 1)
    assert estimate.layer_flops(shape, t, full=False) == 2 * t * 8192 * (8192 + 2 * 1024) + 2 * 8192 * t * (t + 1)
    assert estimate.capture_flops(shape, t, 300, "kernel-lse") == 2 * 8192 * t * 300
    assert estimate.capture_flops(shape, t, 300, "fallback") == 8192 * t * (t + 1)
    # At SysBench lengths a layer is compute-bound on an H100 (ridge ~ 989e12 / 3.35e12 = 295 FLOP/B).
    assert estimate.layer_flops(shape, t) / estimate.layer_bytes(shape, t) > 295


def test_tensor_parallel_splits_the_work_and_pays_all_reduces(estimate):
    shape = estimate.ModelShape.from_config(estimate.QWEN2_72B)
    hw = estimate.Hardware(989e12, 67e12, 3.35e12, 0.5, 0.8, 250e9, 20e-6, 0.0, 80 * 2**30)
    forward = estimate.Forward(1, "system", 2000, 300)
    whole = estimate.forward_seconds(shape, forward, hw, "device-map", 4, 2, "kernel-lse")
    split = estimate.forward_seconds(shape, forward, hw, "tensor-parallel", 4, 2, "kernel-lse")
    all_reduces = 2 * 79 * estimate.allreduce_seconds(2 * 2000 * 8192, 4, hw)
    assert split == pytest.approx(
        estimate.forward_seconds(shape, forward, hw, "one-gpu", 1, 2, "kernel-lse") / 4 + all_reduces
    )
    assert whole / 4 < split < whole / 2


def _ranks_file(path: Path) -> Path:
    """A byte-level BPE with no merges: every byte is one token (ranks 0-255)."""
    path.write_bytes(b"".join(base64.b64encode(bytes([b])) + b" " + str(b).encode() + b"\n" for b in range(256)))
    return path


def test_qwen_tiktoken_adapter_gives_chatml_layouts(estimate, tmp_path):
    pytest.importorskip("tiktoken")
    tokenizer = estimate.QwenTiktokenChat(_ranks_file(tmp_path / "bytes.tiktoken"))
    turns = [TurnText(1, "hi", "ok")]
    layout = fit_layout(tokenizer, "sys", turns, "system", None)
    text = "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n"
    specials = 3 * len("<|im_start|>") + 3 * len("<|im_end|>")
    assert layout.n_tokens == len(text.encode()) - specials + 6  # each special is one token, every other byte one
    im_start, im_end = 256 + 1, 256 + 2
    assert layout.token_ids[0] == im_start and layout.token_ids.count(im_end) == 3
    assert layout.system == (1 + len("system\n"), 1 + len("system\nsys"))  # one token per byte after <|im_start|>
    control = fit_layout(tokenizer, "sys", turns, "control", None)
    assert control.n_tokens > layout.n_tokens  # Qwen2's template inserts its default system message


def test_estimate_end_to_end_on_a_small_run(estimate, tmp_path, dataset, monkeypatch, capsys):
    pytest.importorskip("transformers")
    sessions = [dataclasses.replace(s, system_prompt=s.system_prompt[:200]) for s in dataset.select(limit=2)]
    run = RunDir(tmp_path / "run")
    run.update_manifest(stage="generate", model="x")
    save_run_sessions(run, sessions, dataset)
    for session in sessions:
        run.generations.append(
            [GenerationRecord(session.system_id, t.index, t.user, "好的。" * 20) for t in session.turns]
        )
    bench = tmp_path / "bench.json"
    bench.write_text(
        json.dumps(
            {
                "rows": [
                    {"tokens": 1024, "capture_over_plain_time": 1.05},
                    {"tokens": 8192, "capture_over_plain_time": 1.5},
                ]
            }
        )
    )
    out = tmp_path / "estimate.json"
    monkeypatch.setattr(
        sys,
        "argv",
        ["estimate", str(run.path), "--tokenizer", "smollm2", "--bench-json", str(bench), "--json", str(out)],
    )
    assert estimate.main() == 0
    report = json.loads(out.read_text())
    stats = report["tokenizers"]["smollm2"]
    assert stats["forwards"] == 4 and stats["sessions"] == 2
    assert report["measured_capture"]["tokens"] == 1024  # the row nearest the mean length
    assert report["measured_capture"]["extra_per_captured_layer"] == pytest.approx(0.05 * 30 / 2)
    layouts = {row["layout"]: row for row in report["layouts"]}
    assert layouts["tensor-parallel"]["hours"][0] < layouts["device-map"]["hours"][0]
    assert layouts["tensor-parallel"]["hours"][0] < layouts["tensor-parallel"]["hours"][1]
    assert layouts["data-parallel"]["fits"] is False and "more than one 80 GB GPU" in layouts["data-parallel"]["why"]
    for layout in (
        "device-map",
        "tensor-parallel",
    ):  # the kernel-LSE path reads only the span keys: less than a second pass
        capture = layouts[layout]["capture_s"]
        assert (
            0 < capture["kernel-lse"][0] < capture["fallback"][0]
            and capture["kernel-lse"][0] < capture["kernel-lse"][1]
        )
    assert "| tensor-parallel | 34 GiB |" in capsys.readouterr().out


def test_capture_cost_is_measured_at_the_models_head_shape(estimate):
    pytest.importorskip("torch")
    shape = estimate.ModelShape.from_config({**estimate.QWEN2_72B, "num_hidden_layers": 2})
    cost = estimate.measure_capture(shape, tokens=96, span_keys=20, heads=16, repeats=1)
    assert (cost["heads"], cost["kv_heads"], cost["head_dim"]) == (16, 2, 128)
    assert cost["attention_kernel_s"] > 0 and cost["kernel_lse_extra_s"] > 0 and cost["fallback_extra_s"] > 0
    assert cost["kernel_lse_over_attention_kernel"] == pytest.approx(
        cost["kernel_lse_extra_s"] / cost["attention_kernel_s"]
    )
