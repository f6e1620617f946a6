"""Engine start-up failures as one line; vLLM's own output kept in a log; memory sized from what is free."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.engines.startup import (
    capture_output,
    hint_for,
    root_cause_line,
    startup_failure,
    startup_log_path,
)
from sysbench_gpu.engines.vllm_memory import (
    CPU_KV_MAX_BYTES,
    CPU_KV_MIN_BYTES,
    CPU_RESERVE_BYTES,
    GIB,
    NodeMemory,
    UtilizationDefault,
    plan_memory,
)

# What vLLM 0.32's CPU build wrote when the fixed 0.9 did not fit (this machine, the code before the fix),
# abridged: the worker's error, then the engine core's and the front end's wrappers. A backslash at the end of
# a line continues that log line on the next one.
ENGINE_CORE_LOG = """\
(VllmWorker-0 pid=30256) ERROR 11-22 14:49:45 [multiproc_executor.py:953] WorkerProc failed to start.
(VllmWorker-0 pid=30256) ERROR 11-22 14:49:45 [multiproc_executor.py:953] Traceback (most recent call last):
(VllmWorker-0 pid=30256) ERROR 11-22 14:49:45 [multiproc_executor.py:953]     raise ValueError(
(VllmWorker-0 pid=30256) ERROR 11-22 14:49:45 [multiproc_executor.py:953] ValueError: Available memory on node 0 \
(11.59/17.34 GiB) on startup is less than desired CPU memory utilization (0.9, 15.6 GiB). On the CPU backend, \
the `--gpu-memory-utilization` flag controls the fraction of CPU memory reserved (despite its name). \
To resolve: decrease `--gpu-memory-utilization` (e.g. `--gpu-memory-utilization 0.5`) or reduce CPU memory used \
by other processes.
(EngineCore pid=30187) ERROR 11-22 14:49:50 [core.py:1510] EngineCore failed to start.
(EngineCore pid=30187) ERROR 11-22 14:49:50 [core.py:1510] Traceback (most recent call last):
(EngineCore pid=30187) ERROR 11-22 14:49:50 [core.py:1510]     raise e from None
(EngineCore pid=30187) ERROR 11-22 14:49:50 [core.py:1510] Exception: WorkerProc initialization failed due to an \
exception in a background process. See stack trace for root cause.
Process EngineCore:
Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace for root cause.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}
"""


def test_the_root_cause_is_the_engine_cores_error_not_the_wrapper() -> None:
    cause = root_cause_line(ENGINE_CORE_LOG)
    assert cause is not None and cause.startswith("ValueError: Available memory on node 0 (11.59/17.34 GiB)")
    assert "VLLM_CPU_KVCACHE_SPACE" in (hint_for(cause) or "")
    assert root_cause_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB") == (
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"
    )
    assert "--max-model-len" in (hint_for("OutOfMemoryError: CUDA out of memory") or "")
    assert "VLLM_PORT" in (hint_for("OSError: [Errno 98] Address already in use") or "")
    assert root_cause_line("no exception here\njust text") is None


def test_startup_failure_is_one_line_with_cause_hint_and_log(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(ENGINE_CORE_LOG, encoding="utf-8")
    wrapper = RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    error = startup_failure("vllm engine for 'smollm2' failed to start", wrapper, log)
    message = str(error)
    assert "\n" not in message
    assert message.startswith(
        "vllm engine for 'smollm2' failed to start: ValueError: Available memory on node 0 (11.59"
    )
    assert "to change: free memory" in message and "VLLM_CPU_KVCACHE_SPACE" in message
    assert message.endswith(f"(full output: {log})")
    # Without a log, the error itself (first line only) is the cause.
    plain = startup_failure("hf engine could not load model 'x'", ValueError("first line\nsecond\nthird"))
    assert str(plain).startswith("hf engine could not load model 'x': ValueError: first line") and "\n" not in str(
        plain
    )
    # A SysbenchError is already one clear line and passes through unchanged.
    clear = SysbenchError("model '/nope': no such folder")
    assert startup_failure("anything", clear) is clear


def test_capture_output_sends_a_child_processes_stderr_to_the_log(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log = startup_log_path(tmp_path / "logs", "vllm")
    with capture_output(log):
        os.write(2, b"from this process\n")  # what vLLM's front end writes to the terminal
        subprocess.run(
            [sys.executable, "-c", "import sys; print('child out'); print('child err', file=sys.stderr)"], check=True
        )
    print("after the block")
    captured = capfd.readouterr()
    written = log.read_text(encoding="utf-8")
    assert "from this process" in written and "child out" in written and "child err" in written
    assert "child err" not in captured.err and "child out" not in captured.out
    assert "after the block" in captured.out


def test_old_startup_logs_are_pruned(tmp_path: Path) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    for index in range(30):
        (folder / f"vllm-2020{index:02d}.log").write_text("x", encoding="utf-8")
    startup_log_path(folder, "vllm")
    assert len(list(folder.glob("vllm-*.log"))) < 20


# --- memory plans -------------------------------------------------------------------


def node(available_gib: float, total_gib: float = 9.71) -> NodeMemory:
    return NodeMemory(0, int(total_gib * GIB), int(available_gib * GIB))


def test_cpu_auto_plan_fits_in_what_is_free_where_the_fixed_fraction_did_not() -> None:
    # The machine of issue 8: 8.27 of 9.71 GiB available; 0.9 of the total (8.74) did not fit.
    weights = GIB // 2
    plan = plan_memory(
        on_cpu=True,
        gpu_memory_utilization=None,
        kv_cache_memory_bytes=None,
        environ={},
        node=node(8.27),
        weights_bytes=weights,
    )
    kv = plan.engine_args["kv_cache_memory_bytes"]
    assert plan.source == "auto" and "gpu_memory_utilization" not in plan.engine_args
    assert kv + weights + CPU_RESERVE_BYTES < 8.27 * GIB
    assert kv == pytest.approx(0.5 * (8.27 * GIB - weights - CPU_RESERVE_BYTES), abs=1 << 20)
    described = plan.describe()
    assert (
        described["numa_node"] == 0
        and described["node_available_gib"] == 8.27
        and "available on NUMA node 0" in described["why"]
    )
    # Another process holds 3 GiB: the plan shrinks instead of failing.
    smaller = plan_memory(
        on_cpu=True,
        gpu_memory_utilization=None,
        kv_cache_memory_bytes=None,
        environ={},
        node=node(5.27),
        weights_bytes=weights,
    )
    assert smaller.engine_args["kv_cache_memory_bytes"] < kv
    # Two replicas starting together split what is free.
    shared = plan_memory(
        on_cpu=True,
        gpu_memory_utilization=None,
        kv_cache_memory_bytes=None,
        environ={},
        node=node(8.27),
        weights_bytes=weights,
        replicas=2,
    )
    assert 2 * (shared.engine_args["kv_cache_memory_bytes"] + weights + CPU_RESERVE_BYTES) < 8.27 * GIB
    # Bounds.
    tiny = plan_memory(on_cpu=True, gpu_memory_utilization=None, kv_cache_memory_bytes=None, environ={}, node=node(1.0))
    huge = plan_memory(
        on_cpu=True, gpu_memory_utilization=None, kv_cache_memory_bytes=None, environ={}, node=node(500.0)
    )
    assert tiny.engine_args["kv_cache_memory_bytes"] == CPU_KV_MIN_BYTES
    assert huge.engine_args["kv_cache_memory_bytes"] == CPU_KV_MAX_BYTES


def test_a_users_choice_wins_and_is_recorded() -> None:
    env = plan_memory(
        on_cpu=True,
        gpu_memory_utilization=None,
        kv_cache_memory_bytes=None,
        environ={"VLLM_CPU_KVCACHE_SPACE": "2"},
        node=node(8.0),
    )
    assert (
        env.source == "VLLM_CPU_KVCACHE_SPACE"
        and env.engine_args == {}
        and env.describe()["VLLM_CPU_KVCACHE_SPACE"] == "2"
    )
    kv = plan_memory(on_cpu=True, gpu_memory_utilization=None, kv_cache_memory_bytes=GIB, environ={}, node=node(8.0))
    assert kv.source == "kv_cache_memory_bytes" and kv.engine_args == {"kv_cache_memory_bytes": GIB}
    fraction = plan_memory(
        on_cpu=True, gpu_memory_utilization=0.3, kv_cache_memory_bytes=None, environ={}, node=node(8.0)
    )
    assert fraction.source == "gpu_memory_utilization" and fraction.engine_args == {"gpu_memory_utilization": 0.3}
    gpu = plan_memory(
        on_cpu=False,
        gpu_memory_utilization=None,
        kv_cache_memory_bytes=None,
        environ={"VLLM_CPU_KVCACHE_SPACE": "2"},
        utilization_default=UtilizationDefault(0.92),
    )
    # vLLM applies its own default; the plan records it (tests/test_gpu_paths.py reads the real one).
    assert gpu.source == "default" and gpu.engine_args == {}
    assert gpu.describe()["gpu_memory_utilization_default"] == 0.92
    assert plan_memory(
        on_cpu=False, gpu_memory_utilization=0.8, kv_cache_memory_bytes=None, environ={}
    ).engine_args == {"gpu_memory_utilization": 0.8}


def test_an_unwritable_log_folder_falls_back_to_the_temp_folder(tmp_path: Path) -> None:
    from sysbench_gpu.engines.vllm_engine import _startup_log

    blocker = tmp_path / "a-file"
    blocker.write_text("x", encoding="utf-8")
    fallback = _startup_log(blocker / "logs")  # a folder below a file cannot be created
    assert fallback is not None and fallback.parent.name == "sysbench-gpu-logs"
    assert _startup_log(tmp_path / "logs").parent == tmp_path / "logs"
