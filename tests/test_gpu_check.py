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


def _gpu_check():
    sys.path.insert(0, str(BENCH_DIR))
    try:
        return importlib.import_module("gpu_check")
    finally:
        sys.path.remove(str(BENCH_DIR))


def test_bench_measure_has_the_contract_gpu_check_calls() -> None:
    """gpu_check calls bench_attention_capture.measure directly (no stand-in)."""
    pytest.importorskip("torch")
    gpu_check = _gpu_check()
    assert gpu_check.DEFAULT_MEASURE == "bench_attention_capture:measure"
    sys.path.insert(0, str(BENCH_DIR))
    try:
        measure = gpu_check.load_measure(gpu_check.DEFAULT_MEASURE)
    finally:
        sys.path.remove(str(BENCH_DIR))
    parameters = inspect.signature(measure).parameters
    assert list(parameters)[:4] == list(gpu_check.MEASURE_CONTRACT)
    assert {"repeats", "eager", "eager_max_gib", "chunk_mib", "input_ids_for"} <= set(parameters)


def test_configs_are_the_published_shapes_and_scaled_ones_keep_the_architecture() -> None:
    gpu_check = _gpu_check()
    qwen, llama = gpu_check.published_config("qwen2-7b"), gpu_check.published_config("llama-3.1-8b")
    assert (
        qwen["num_hidden_layers"],
        qwen["hidden_size"],
        qwen["num_attention_heads"],
        qwen["num_key_value_heads"],
        qwen["intermediate_size"],
        qwen["vocab_size"],
        qwen["rope_theta"],
    ) == (28, 3584, 28, 4, 18944, 152064, 1e6)
    assert (
        llama["num_hidden_layers"],
        llama["hidden_size"],
        llama["num_attention_heads"],
        llama["num_key_value_heads"],
        llama["intermediate_size"],
        llama["vocab_size"],
        llama["rope_theta"],
    ) == (32, 4096, 32, 8, 14336, 128256, 500000.0)
    assert llama["rope_scaling"]["rope_type"] == "llama3"
    for name in gpu_check.MODELS:
        full, scaled = gpu_check.published_config(name), gpu_check.model_config(name, scaled=True)
        assert scaled["model_type"] == full["model_type"] and scaled["rope_theta"] == full["rope_theta"]
        groups = full["num_attention_heads"] // full["num_key_value_heads"]
        assert scaled["num_attention_heads"] // scaled["num_key_value_heads"] == groups  # same GQA grouping
        assert scaled["num_hidden_layers"] == 2 and scaled["hidden_size"] < 512
        assert gpu_check.model_config(name, scaled=False) == full


@pytest.mark.slow
def test_gpu_check_quick_on_cpu_writes_attention_and_generation_rows(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, str(BENCH_DIR / "gpu_check.py"), "--device", "cpu", "--quick", "--json", str(out)]
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
        assert row["plain_peak_mib"] is not None and row["capture_peak_mib"] is not None
        assert row["max_abs_diff_vs_eager"] < 1e-5  # fp32 capture agrees with eager attention
        assert set(row["capture_paths"].values()) == {"kernel-lse (torch-cpu-flash)"}
    generation = report["generation"]
    assert {row["model"] for row in generation} == {"qwen2-7b", "llama-3.1-8b"}
    for row in generation:
        assert row["output_tokens"] == row["sessions"] * row["turns"] * row["max_tokens"]
        assert row["turn_sync_s"] > 0 and row["sequential_s"] > 0 and row["sequential_over_turn_sync_time"] > 0
    assert "attention capture" in result.stdout and "hf generation" in result.stdout
    # The head to head: transformers serve is installed here, so all three ways ran on each model.
    head_to_head = report["head_to_head"]
    assert {row["model"] for row in head_to_head} == {"qwen2-7b", "llama-3.1-8b"}
    for row in head_to_head:
        assert row["engine"] == "hf" and row["serve_missing"] is None
        assert [m["name"] for m in row["methods"]] == ["upstream", "in_process", "server"]
        assert row["checks"]["same_turns_and_tokens"] is True
        assert all(m["output_tokens"] == row["sessions"] * row["turns"] * row["max_tokens"] for m in row["methods"])
        assert row["measured_ratio"] > 0
    assert "head to head on hf, two engines" in result.stdout
    assert "token check: every way" in result.stdout and report["token_check"] == {"ok": True, "problems": []}
    for row in head_to_head:
        assert row["sessions"] == row["distinct_sessions"] and set(row["engines"]) == {
            "upstream",
            "in_process",
            "server",
        }
        assert all(m["timed"] == "first request to last reply" for m in row["methods"])


def test_a_measure_without_the_contract_is_refused_clearly() -> None:
    gpu_check = _gpu_check()
    with pytest.raises(SystemExit, match="has no parameter.*model, lengths, layers, device"):
        gpu_check.load_measure("json:dumps")
    with pytest.raises(SystemExit, match="cannot import no_such_module:measure"):
        gpu_check.load_measure("no_such_module:measure")


@pytest.mark.parametrize(
    "device,visible,expected",
    [
        ("cuda:1", None, "1"),  # nothing set: the index is the physical GPU
        ("cuda:1", "2,3", "3"),  # cuda:1 is the second GPU this process sees
        ("cuda:0", "2,3", "2"),
        ("cuda:1", "GPU-aaa,GPU-bbb", "GPU-bbb"),  # UUIDs pass through as written
        ("cuda:0", "MIG-1234", "MIG-1234"),
        ("cuda", "2,3", None),  # no index: the child sees what this process sees
    ],
)
def test_the_child_sees_the_gpu_the_device_names(device, visible, expected) -> None:
    assert _gpu_check().visible_devices_for(device, visible) == expected


def test_an_index_beyond_the_visible_gpus_is_refused() -> None:
    with pytest.raises(SystemExit, match="CUDA_VISIBLE_DEVICES='2,3' makes only 2 GPU"):
        _gpu_check().visible_devices_for("cuda:2", "2,3")
    with pytest.raises(SystemExit, match="is not cuda:N"):
        _gpu_check().visible_devices_for("cuda:x", None)


def test_gpu_tests_run_on_the_physical_gpu_behind_the_device(monkeypatch) -> None:
    gpu_check = _gpu_check()
    seen: dict[str, str] = {}

    def fake_run(command, cwd, env, capture_output, text):
        seen["visible"] = env["CUDA_VISIBLE_DEVICES"]
        return subprocess.CompletedProcess(command, 0, stdout="3 passed in 1.0s\n", stderr="")

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setattr(gpu_check.subprocess, "run", fake_run)
    result = gpu_check.run_gpu_tests("cuda:1")
    assert seen["visible"] == "3" and result["status"] == "passed" and result["counts"] == {"passed": 3}


def test_head_to_head_without_transformers_serve_says_so_and_runs_in_process_alone(tmp_path, monkeypatch, capsys):
    """A GPU machine without transformers[serving]: one line, then (b) alone, and the report says which ran."""
    torch = pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    gpu_check = _gpu_check()
    monkeypatch.setattr(gpu_check, "serve_available", lambda: (False, "transformers serve needs it; missing: fastapi"))
    monkeypatch.setattr("tempfile.mkdtemp", lambda prefix="": str(tmp_path / "h2h"))
    (tmp_path / "h2h").mkdir()
    config = dict(gpu_check.model_config("qwen2-7b", scaled=True), num_hidden_layers=1)
    _, sessions = __import__("bench_turn_sync").pick_sessions(None, 2, 1)
    tokenizer = gpu_check.offline_tokenizer([s.system_prompt for s in sessions] + [s.turns[0].user for s in sessions])
    args = gpu_check.parse_args(["--device", "cpu", "--threads", "2"])
    row = gpu_check.head_to_head("qwen2-7b", config, tokenizer, "cpu", torch.float32, 2, 1, 2, args)
    out = capsys.readouterr().out
    assert "head to head runs (b) in process alone: transformers serve needs it; missing: fastapi" in out
    assert row["serve_missing"] and row["server"] is None and row["engine"] == "hf"
    assert [m["name"] for m in row["methods"]] == ["in_process"]
    assert row["methods"][0]["output_tokens"] == 2 * 1 * 2 and row["measured_ratio"] is None
    assert (
        row["sessions"] == row["distinct_sessions"] == 2 and row["methods"][0]["timed"] == "first request to last reply"
    )
    settings = row["methods"][0]["engine_settings"]
    assert settings["dtype"] == "float32" and settings["max_num_seqs"] == 2  # the batch: min(max_num_seqs, N)
    assert row["engines"]["in_process"].startswith("transformers generate()")


def _report_with(head_to_head_problems: list[str], generation_tokens: int = 16) -> dict:
    return {
        "generation": [
            {"model": "qwen2-7b", "sessions": 2, "turns": 1, "max_tokens": 8, "output_tokens": generation_tokens}
        ],
        "head_to_head": [
            {
                "model": "qwen2-7b",
                "methods": [{"name": "upstream"}, {"name": "in_process"}],
                "checks": {"same_turns_and_tokens": not head_to_head_problems, "problems": head_to_head_problems},
            }
        ],
    }


def test_the_token_check_names_every_way_that_decoded_other_tokens() -> None:
    gpu_check = _gpu_check()
    assert gpu_check.token_check(_report_with([])) == []
    problems = gpu_check.token_check(_report_with(["server: 2 turns and 15 output tokens, expected 2 and 16"], 12))
    assert problems == [
        "qwen2-7b generation: 12 output tokens in each mode, expected 16",
        "qwen2-7b head to head: server: 2 turns and 15 output tokens, expected 2 and 16",
    ]


def test_a_failed_token_check_is_printed_and_exits_1(monkeypatch, capsys) -> None:
    gpu_check = _gpu_check()
    report = {
        "gpu_tests": {"status": "skipped", "reason": "cpu"},
        **_report_with(["in_process: 2 turns and 15 output tokens, expected 2 and 16"]),
    }
    monkeypatch.setattr(gpu_check, "check", lambda args: report)
    monkeypatch.setattr(gpu_check, "print_tables", lambda report: None)
    monkeypatch.setattr(gpu_check, "print_head_to_head", lambda report: None)
    assert gpu_check.main(["--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "token check FAILED: qwen2-7b head to head: in_process: 2 turns and 15 output tokens" in out
    assert report["token_check"]["ok"] is False
    report["head_to_head"][0]["checks"] = {"same_turns_and_tokens": True, "problems": []}
    assert gpu_check.main(["--device", "cpu"]) == 0
    assert "token check: every way" in capsys.readouterr().out


def test_the_hf_head_to_head_is_labelled_as_two_engines() -> None:
    engines = _gpu_check().HF_ENGINES
    assert engines["upstream"] == engines["server"] != engines["in_process"]
    assert "continuous-batching" in engines["upstream"] and "generate()" in engines["in_process"]
