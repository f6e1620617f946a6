"""kernels_bench/gpu_check.py runs on the CPU (``--device cpu --quick``), so the GPU check cannot rot."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO_ROOT / "kernels_bench"
STANDIN = "gpu_check_standin:measure"


def _gpu_check():
    sys.path.insert(0, str(BENCH_DIR))
    try:
        return importlib.import_module("gpu_check")
    finally:
        sys.path.remove(str(BENCH_DIR))


def attention_measure_option() -> list[str]:
    """The real ``bench_attention_capture.measure`` once it has the contract, else the test's stand-in."""
    pytest.importorskip("torch")
    sys.path.insert(0, str(BENCH_DIR))
    try:
        bench = importlib.import_module("bench_attention_capture")
    finally:
        sys.path.remove(str(BENCH_DIR))
    parameters = inspect.signature(getattr(bench, "measure", lambda: None)).parameters
    if all(name in parameters for name in _gpu_check().MEASURE_CONTRACT):
        return []
    return ["--attention-measure", STANDIN]


def test_scaled_configs_keep_the_architecture() -> None:
    gpu_check = _gpu_check()
    for name, full in gpu_check.CONFIGS.items():
        scaled = gpu_check.model_config(name, scaled=True)
        assert scaled["model_type"] == full["model_type"] and scaled["rope_theta"] == full["rope_theta"]
        groups = full["num_attention_heads"] // full["num_key_value_heads"]
        assert scaled["num_attention_heads"] // scaled["num_key_value_heads"] == groups  # same GQA grouping
        assert scaled["num_hidden_layers"] == 2 and scaled["hidden_size"] < 512
        assert gpu_check.model_config(name, scaled=False) == full  # the published shape, untouched
    assert gpu_check.CONFIGS["qwen2-7b"]["num_hidden_layers"] == 28
    assert gpu_check.CONFIGS["llama-3.1-8b"]["rope_scaling"]["rope_type"] == "llama3"


@pytest.mark.slow
def test_gpu_check_quick_on_cpu_writes_attention_and_generation_rows(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), str(REPO_ROOT / "tests"), env.get("PYTHONPATH")]))
    command = [sys.executable, str(BENCH_DIR / "gpu_check.py"), "--device", "cpu", "--quick", "--json", str(out),
               *attention_measure_option()]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["device"] == "cpu" and report["torch"] and report["scaled_shapes"] is True
    assert report["gpu_tests"]["status"] == "skipped"
    assert set(report["configs"]) == {"qwen2-7b", "llama-3.1-8b"}
    attention = report["attention"]
    assert {row["model"] for row in attention} == {"qwen2-7b", "llama-3.1-8b"}
    assert {row["tokens"] for row in attention} == {512, 1024}
    for row in attention:
        assert row["plain_s"] > 0 and row["capture_s"] > 0 and row["eager_s"] > 0
        assert row["max_abs_diff_vs_eager"] < 1e-4  # fp32 capture agrees with eager attention
    generation = report["generation"]
    assert {row["model"] for row in generation} == {"qwen2-7b", "llama-3.1-8b"}
    for row in generation:
        assert row["output_tokens"] == row["sessions"] * row["turns"] * row["max_tokens"]
        assert row["turn_sync_s"] > 0 and row["sequential_s"] > 0 and row["sequential_over_turn_sync_time"] > 0
    assert "attention capture" in result.stdout and "hf generation" in result.stdout


def test_a_measure_without_the_contract_is_refused_clearly() -> None:
    gpu_check = _gpu_check()
    with pytest.raises(SystemExit, match="has no parameter.*model, lengths, layers, device"):
        gpu_check.load_measure("json:dumps")
    with pytest.raises(SystemExit, match="cannot import no_such_module:measure"):
        gpu_check.load_measure("no_such_module:measure")
