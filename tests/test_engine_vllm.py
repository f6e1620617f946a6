"""The vllm engine: pure helpers (fast), then real vLLM on the CPU (marked ``vllm``).

The data-parallel replicas (Ray actors) are tested with stand-in backends in test_ray_replicas.py.

Real vLLM runs in subprocesses (it spawns workers and needs a ``__main__`` guard).
They hold ``/tmp/vllm.lock`` so that two test sessions on one machine never start
vLLM at the same time (its CPU build takes a fixed share of memory).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.engines.base import Completion, SamplingSpec
from sysbench_gpu.engines.replicas import ReplicaShape, assign_replicas, check_capacity, session_key
from sysbench_gpu.engines.vllm_engine import VLLMEngine

REPO_ROOT = Path(__file__).resolve().parent.parent
HAS_VLLM = importlib.util.find_spec("vllm") is not None


# --- a stand-in backend (built in this process by replica_factory) -------------------


class EchoBackend:
    """Answers with its replica's CUDA_VISIBLE_DEVICES and the last user message."""

    def __init__(self, model: str, **options: Any) -> None:
        if model == "fail-to-load":
            raise RuntimeError("weights not found")
        self.devices = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        self.served = 0

    def chat(self, conversations: Sequence[Sequence[dict[str, str]]], sampling: SamplingSpec) -> list[Completion]:
        if any(c[-1]["content"] == "boom" for c in conversations):
            raise SysbenchError("session 9, turn 2: exploded")
        self.served += len(conversations)
        return [
            Completion(text=f"{c[-1]['content']}@{self.devices}", prompt_tokens=len(c), output_tokens=1)
            for c in conversations
        ]

    def count_prompt_tokens(self, conversation: Sequence[dict[str, str]]) -> int:
        return sum(len(m["content"].split()) for m in conversation)

    def supports_system_role(self) -> bool:
        return True

    def runtime_info(self) -> dict[str, Any]:
        return {"max_model_len": 4096, "served": self.served, "devices": self.devices}

    def close(self) -> None:
        pass


ECHO = "test_engine_vllm:EchoBackend"


class RecordingBackend(EchoBackend):
    """Reports the options the engine built it with."""

    def __init__(self, model: str, **options: Any) -> None:
        super().__init__(model)
        self.options = options

    def runtime_info(self) -> dict[str, Any]:
        return {**super().runtime_info(), "options": self.options}


def session(system: str, *turns: str) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}]
    for index, user in enumerate(turns):
        if index:
            messages.append({"role": "assistant", "content": f"reply {index}"})
        messages.append({"role": "user", "content": user})
    return messages


# --- pure helpers ------------------------------------------------------------------


def test_assign_replicas_balances_new_sessions_and_keeps_old_ones_sticky() -> None:
    sticky: dict[str, int] = {}
    first = assign_replicas(["a", "b", "c", "d", "e"], 2, sticky)
    assert first == [0, 1, 0, 1, 0]
    # Next turn: "b" finished, order changed, a new session "f" arrives.
    second = assign_replicas(["e", "a", "f", "d", "c"], 2, sticky)
    assert second[:2] == [0, 0] and second[3:] == [1, 0]
    assert second[2] == 1  # the less loaded replica
    # Several turns of one session in one call (reference history) stay together.
    sticky = {}
    assert assign_replicas(["s1", "s1", "s2", "s2", "s3"], 2, sticky) == [0, 0, 1, 1, 0]


def test_session_key_ignores_later_turns() -> None:
    assert session_key(session("sys", "q1")) == session_key(session("sys", "q1", "q2", "q3"))
    assert session_key(session("sys", "q1")) != session_key(session("sys", "other"))


def test_replica_placement_groups_reserve_each_replicas_gpus() -> None:
    # TP 2 on vLLM's own workers: the actor holds both GPUs, on one node.
    shape = ReplicaShape(cpus=1, gpus=2)
    assert shape.bundles() == [{"CPU": 1.0, "GPU": 2.0}] and shape.strategy == "STRICT_PACK" and shape.actor_gpus == 2
    # vLLM's Ray executor (PP across nodes): one bundle per GPU for its workers; the actor takes none.
    spread = ReplicaShape(cpus=1, gpus=4, gpu_bundles=True)
    assert spread.bundles() == [{"CPU": 1.0}] + [{"GPU": 1.0}] * 4
    assert spread.strategy == "PACK" and spread.actor_gpus == 0
    check_capacity("vllm engine", 4, shape, {"CPU": 16.0, "GPU": 8.0})
    with pytest.raises(SysbenchError, match="replicas x 2 GPUs each need 8 GPUs, but the Ray cluster has 4"):
        check_capacity("vllm engine", 4, shape, {"CPU": 16.0, "GPU": 4.0})


def test_invalid_layouts_are_refused_before_loading() -> None:
    with pytest.raises(SysbenchError, match="external_launcher"):
        VLLMEngine("m", data_parallel_size=2, distributed_executor_backend="external_launcher")
    with pytest.raises(SysbenchError, match="ray_address places data-parallel replicas"):
        VLLMEngine("m", ray_address="auto")
    with pytest.raises(SysbenchError, match="ray_address 'http://x': expected auto or HOST:PORT"):
        VLLMEngine("m", data_parallel_size=2, ray_address="http://x")
    with pytest.raises(SysbenchError, match="tensor_parallel_size"):
        VLLMEngine("m", tensor_parallel_size=0)
    with pytest.raises(SysbenchError, match="gpu_memory_utilization"):
        VLLMEngine("m", gpu_memory_utilization=1.5)


def test_the_scheduler_budget_reaches_the_engine_and_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    engine = VLLMEngine(
        "m",
        max_num_batched_tokens=2048,
        max_num_seqs=128,
        kv_cache_memory_bytes=1 << 30,
        replica_factory="test_engine_vllm:RecordingBackend",
    )
    described = engine.describe()
    assert described["max_num_batched_tokens"] == 2048 and described["max_num_seqs"] == 128
    options = described["options"]
    assert (options["max_num_batched_tokens"], options["max_num_seqs"], options["kv_cache_memory_bytes"]) == (
        2048,
        128,
        1 << 30,
    )
    with pytest.raises(SysbenchError, match="max_num_seqs must be >= 1, got 0"):
        VLLMEngine("m", max_num_seqs=0, replica_factory=ECHO)


def test_engine_config_reads_what_vllm_resolved() -> None:
    from types import SimpleNamespace

    from sysbench_gpu.engines.vllm_engine import engine_config

    config = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_batched_tokens=2048, max_num_seqs=128, enable_chunked_prefill=True),
        cache_config=SimpleNamespace(
            enable_prefix_caching=True,
            kv_cache_memory_bytes=1 << 30,
            kv_cache_size_tokens=46592,
            num_gpu_blocks=364,
            block_size=128,
            cache_dtype="auto",
        ),
        model_config=SimpleNamespace(dtype="torch.bfloat16", max_model_len=8192),
    )
    found = engine_config(SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=config)))
    assert found["max_num_batched_tokens"] == 2048 and found["max_num_seqs"] == 128
    assert found["dtype"] == "bfloat16" and found["kv_cache_size_tokens"] == 46592
    assert engine_config(SimpleNamespace())["max_num_seqs"] is None  # an older vLLM without the field


def test_generate_takes_the_budget_flags_for_vllm_only() -> None:
    import argparse

    from sysbench_gpu.generation.cli import engine_options_from_args, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    common = ["generate", "--data", "demo", "--model", "m", "--out", "o"]
    budget = ["--max-num-batched-tokens", "2048", "--max-num-seqs", "128", "--kv-cache-memory-bytes", "1024"]
    args = parser.parse_args([*common, "--engine", "vllm", *budget])
    assert engine_options_from_args("vllm", args) == {
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 128,
        "kv_cache_memory_bytes": 1024,
    }
    args = parser.parse_args([*common, "--engine", "hf", "--max-num-seqs", "8"])
    with pytest.raises(SysbenchError, match="--max-num-seqs is a flag of the vllm engine"):
        engine_options_from_args("hf", args)


def test_external_launcher_rank_decides_the_primary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.setenv("RANK", "2")
    engine = VLLMEngine("m", distributed_executor_backend="external_launcher", replica_factory=ECHO)
    assert engine.is_primary is False
    monkeypatch.setenv("RANK", "0")
    engine = VLLMEngine("m", distributed_executor_backend="external_launcher", replica_factory=ECHO)
    assert engine.is_primary is True


# --- real vLLM on the CPU --------------------------------------------------------------


@contextlib.contextmanager
def vllm_lock() -> Iterator[None]:
    with open("/tmp/vllm.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def vllm_env(kv_cache_gib: str | None = None) -> dict[str, str]:
    """The environment for a vLLM subprocess; ``kv_cache_gib`` pins the CPU KV cache instead of the engine's plan."""
    env = dict(os.environ)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    if kv_cache_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = kv_cache_gib
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def run_logged(command: list[str], log_path: Path, timeout: float, kv_cache_gib: str | None = None) -> None:
    with open(log_path, "w", encoding="utf-8") as log, vllm_lock():
        result = subprocess.run(
            command, cwd=REPO_ROOT, env=vllm_env(kv_cache_gib), stdout=log, stderr=subprocess.STDOUT, timeout=timeout
        )
    if result.returncode != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-4000:]
        pytest.fail(f"{' '.join(command)} exited {result.returncode}:\n{tail}")


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")
def test_vllm_smoke_on_cpu(tmp_path: Path, smollm2_path: str) -> None:
    report_path = tmp_path / "smoke.json"
    run_logged(
        [sys.executable, str(REPO_ROOT / "tests" / "vllm_smoke.py"), str(report_path)],
        tmp_path / "smoke.log",
        timeout=600,
    )
    report = json.loads(report_path.read_text(encoding="utf-8"))
    print(f"vllm smoke: load {report['load_s']:.1f} s, total {report['total_s']:.1f} s")

    assert report["context_length"] == 2048 and report["supports_system_role"] and report["is_primary"]
    described = report["describe"]
    assert described["enable_prefix_caching"] is True and described["vllm_version"]
    # Memory sized from what the node has free, and why, in the manifest's engine record.
    memory = described["memory"]
    assert memory["device"] == "cpu" and memory["source"] == "auto" and memory["kv_cache_memory_bytes"] > 0
    assert memory["kv_cache_gib"] < memory["node_available_gib"] and "available on" in memory["why"]
    assert described["batch_invariant"] is False and "VLLM_BATCH_INVARIANT" in described
    assert report["startup_log_has_vllm_output"]  # vLLM's chatter went to the log, not the terminal
    assert described["defaults"]["max_tokens"] == report["defaults"]["expected_default_max_tokens"]

    batch = report["batch"]
    assert len(batch) == 3
    for item in batch:
        assert item["text"] and 1 <= item["output_tokens"] <= 8
        assert item["prompt_tokens"] == item["counted_prompt_tokens"]  # our count matches vLLM's prompt
        assert item["finish_reason"] in ("stop", "length")
        assert item["cached_prompt_tokens"] is not None
    # Requests 1 and 3 share the long system prompt: at least one of them is served from the cache.
    assert batch[0]["cached_prompt_tokens"] + batch[2]["cached_prompt_tokens"] > 0
    # The follow-up turn reuses the first turn's blocks (the CPU build caches whole 128-token blocks here).
    follow = report["follow_up"]
    assert 0 < follow["cached_prompt_tokens"] < follow["prompt_tokens"]

    verdicts = json.loads(report["json"]["text"])  # constrained decoding: always parses
    assert set(verdicts) == {"1", "2"} and set(verdicts.values()) <= {"yes", "no"}

    assert report["seeded"]["alone"] == report["seeded"]["in_company"]
    assert report["defaults"]["default_max_tokens"] == report["defaults"]["expected_default_max_tokens"]
    assert report["defaults"]["explicit"] == [5, 0.2, 3]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")
def test_generate_end_to_end_under_torchrun(tmp_path: Path, sessions_file: Path, smollm2_path: str) -> None:
    """`sysbench-gpu generate --engine vllm --model smollm2`, 2 sessions x 5 turns, as launch/ starts it with torchrun.

    One rank with vLLM's external launcher keeps vLLM in this one process (the
    default layout, vLLM's own engine and worker processes, runs in the smoke test).
    Sessions 289 and 461 have the shortest prompts of the shared file (~230 tokens at
    turn 1), which keeps CPU prefill short while still filling whole 128-token cache blocks.
    """
    out = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "1",
        "--master-port",
        str(free_port()),
        "-m",
        "sysbench_gpu",
        "generate",
        "--data",
        str(sessions_file),
        "--engine",
        "vllm",
        "--model",
        "smollm2",
        "--out",
        str(out),
        "--sessions",
        "289,461",
        "--max-tokens",
        "8",
        "--no-progress",
        "--max-model-len",
        "4096",
        "--enforce-eager",
        "--distributed-executor-backend",
        "external_launcher",
    ]
    run_logged(command, tmp_path / "generate.log", timeout=600, kv_cache_gib="1")

    from sysbench_gpu.core.rundir import RunDir

    run = RunDir(out)
    records = run.generations.read()
    assert sorted({turn for _, turn in records}) == [1, 2, 3, 4, 5] and len(records) == 10
    for (_system_id, turn), record in records.items():
        assert record.status == "ok" and record.response is not None
        assert 1 <= (record.output_tokens or 0) <= 8 and record.prompt_tokens
        assert record.finish_reason in ("stop", "length")
        if turn > 1:
            # The history this turn shares with the previous one comes from the prefix cache.
            assert record.cached_prompt_tokens and record.cached_prompt_tokens > 0
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    described = json.dumps(manifest)
    assert "external_launcher" in described and "enable_prefix_caching" in described
    stats = json.loads(run.stats_path.read_text(encoding="utf-8"))
    assert stats["totals"]["requests"] == 10 and stats["totals"]["output_tokens"] <= 80
    assert stats["totals"]["cached_prompt_tokens"] > 0


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")
def test_a_vllm_start_failure_is_one_line_naming_cause_and_fix(tmp_path: Path, smollm2_path: str) -> None:
    """0.99 of the node's memory never fits: vLLM's engine core fails; the terminal gets one line.

    Before, this printed about 200 lines of two tracebacks (the worker's and the front end's).
    """
    command = [
        sys.executable,
        "-m",
        "sysbench_gpu",
        "generate",
        "--data",
        "demo",
        "--engine",
        "vllm",
        "--model",
        "smollm2",
        "--out",
        str(tmp_path / "run"),
        "--limit",
        "1",
        "--no-progress",
        "--enforce-eager",
        "--gpu-memory-utilization",
        "0.99",
    ]
    with vllm_lock():
        result = subprocess.run(command, cwd=REPO_ROOT, env=vllm_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, lines
    error = errors[0]
    assert re.match(
        r"error: vllm engine for '[^']*SmolLM2-135M-Instruct' failed to start: "
        r"ValueError: Available memory on node \d",
        error,
    ), error
    assert "to change:" in error and "VLLM_CPU_KVCACHE_SPACE" in error
    log_path = Path(error.rsplit("(full output: ", 1)[1].rstrip(")"))
    assert "Traceback" in log_path.read_text(encoding="utf-8")  # the traceback is kept, in the log
    # Nothing else but our own log lines reaches the terminal: no traceback, no vLLM chatter.
    assert all(line == error or " INFO sysbench_gpu." in line for line in lines), lines
