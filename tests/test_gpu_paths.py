"""GPU code paths checked on the CPU with fakes (issue 21, part 2).

* a flash-attn build that does not import counts as not installed (one warning, one import);
* no flash kernel below sm80;
* vLLM's default ``gpu_memory_utilization`` is read from the installed vLLM, or recorded as unknown;
* tensor-parallel ranks agree on their to-do list before the collectives (two gloo ranks).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from sysbench_gpu.attention.capture import kernels  # noqa: E402
from sysbench_gpu.attention.capture.kernels import choose_kernel, flash_attn_installed  # noqa: E402
from sysbench_gpu.engines import vllm_memory  # noqa: E402
from sysbench_gpu.engines.vllm_memory import (  # noqa: E402
    FALLBACK_GPU_MEMORY_UTILIZATION,
    UtilizationDefault,
    plan_memory,
    vllm_default_utilization,
)

JOIN_TIMEOUT_S = 120


# ----------------------------------------------------------------- flash-attn that does not import


@pytest.fixture
def fresh_flash_attn_check():
    """No cached answer and no flash_attn module before or after the test."""
    flash_attn_installed.cache_clear()
    sys.modules.pop("flash_attn", None)
    yield
    flash_attn_installed.cache_clear()
    sys.modules.pop("flash_attn", None)


def _fake_flash_attn(root: Path, body: str) -> Path:
    """A ``flash_attn`` package under ``root`` whose ``__init__`` counts its imports in ``imports.txt``, then runs
    ``body``."""
    package = root / "flash_attn"
    package.mkdir()
    counter = root / "imports.txt"
    (package / "__init__.py").write_text(
        f"with open({str(counter)!r}, 'a') as handle:\n    handle.write('x')\n{body}\n", encoding="utf-8"
    )
    return counter


def _cuda_query(dtype=torch.bfloat16, heads=8, kv_heads=2, t=10, dim=128, index=None):
    device = SimpleNamespace(type="cuda", index=index)
    return (
        SimpleNamespace(device=device, dtype=dtype, shape=(1, heads, t, dim)),
        SimpleNamespace(shape=(1, kv_heads, t, dim)),
        SimpleNamespace(shape=(1, kv_heads, t, dim)),
    )


def test_a_flash_attn_built_for_another_torch_is_not_installed(
    tmp_path, monkeypatch, caplog, fresh_flash_attn_check
) -> None:
    error = "flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi"
    counter = _fake_flash_attn(tmp_path, f"raise ImportError({error!r})")
    monkeypatch.syspath_prepend(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger=kernels.__name__):
        answers = [flash_attn_installed() for _ in range(3)]
        choice = choose_kernel(*_cuda_query(), None, "sdpa", capability=(9, 0))
    assert answers == [False, False, False]
    assert counter.read_text() == "x"  # the import was tried once
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "does not import" in warnings[0] and "undefined symbol" in warnings[0]
    assert choice.name == "torch-cuda-flash"  # torch's own kernel instead


def test_a_flash_attn_that_imports_is_installed(tmp_path, monkeypatch, fresh_flash_attn_check) -> None:
    counter = _fake_flash_attn(tmp_path, "flash_attn_func = None")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert flash_attn_installed() and flash_attn_installed()
    assert counter.read_text() == "x"
    assert choose_kernel(*_cuda_query(), None, "sdpa", capability=(8, 0)).name == "flash-attn"


def test_no_flash_attn_at_all_is_not_installed_and_silent(tmp_path, monkeypatch, caplog, fresh_flash_attn_check):
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # what an absent package looks like to the import
    with caplog.at_level(logging.WARNING, logger=kernels.__name__):
        assert flash_attn_installed() is False
    assert not caplog.records


# ----------------------------------------------------------------- compute capability


def test_below_sm80_neither_flash_kernel_is_chosen(monkeypatch) -> None:
    asked: list[Any] = []

    def capability(device=None):
        asked.append(device)
        return (7, 5)  # a T4

    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    choice = choose_kernel(*_cuda_query(index=1), None, "sdpa", flash_attn_available=True)
    assert choice.name == "torch-cuda-efficient" and choice.function is kernels.cuda_efficient_attention
    assert "sm75" in choice.reason and "sm80" in choice.reason
    assert asked == [1]  # the query's own GPU
    fp32 = choose_kernel(*_cuda_query(dtype=torch.float32), None, "sdpa", flash_attn_available=True)
    assert fp32.name == "torch-cuda-efficient"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert choose_kernel(*_cuda_query(), None, "sdpa", flash_attn_available=False).name == "torch-cuda-flash"


# ----------------------------------------------------------------- vLLM's default memory share


@pytest.fixture
def fresh_vllm_default():
    vllm_default_utilization.cache_clear()
    yield
    vllm_default_utilization.cache_clear()


@pytest.mark.vllm
def test_the_recorded_default_is_the_installed_vllms(fresh_vllm_default) -> None:
    arg_utils = pytest.importorskip("vllm.engine.arg_utils")
    plan = plan_memory(on_cpu=False, gpu_memory_utilization=None, kv_cache_memory_bytes=None, environ={})
    described = plan.describe()
    assert described["gpu_memory_utilization_default"] == arg_utils.EngineArgs.gpu_memory_utilization
    assert "gpu_memory_utilization_default_why" not in described
    assert plan.engine_args == {}  # vLLM applies its own default


def test_without_vllm_the_manifest_records_no_default_and_why(monkeypatch, fresh_vllm_default) -> None:
    for name in [name for name in sys.modules if name == "vllm" or name.startswith("vllm.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "vllm", None)
    plan = plan_memory(on_cpu=False, gpu_memory_utilization=None, kv_cache_memory_bytes=None, environ={})
    described = plan.describe()
    assert described["gpu_memory_utilization_default"] is None
    assert described["gpu_memory_utilization_default_why"] == "vllm is not installed"
    assert vllm_default_utilization().value_or_fallback()[0] == FALLBACK_GPU_MEMORY_UTILIZATION


def test_profile_reads_the_share_through_the_engines_function(monkeypatch) -> None:
    from sysbench_gpu.core.errors import SysbenchError
    from sysbench_gpu.profiling.stage import memory_utilization_for

    monkeypatch.setattr(vllm_memory, "vllm_default_utilization", lambda: UtilizationDefault(0.87))
    monkeypatch.setattr("sysbench_gpu.profiling.stage.vllm_default_utilization", lambda: UtilizationDefault(0.87))
    assert memory_utilization_for(None, 80e9) == (0.87, "vllm.engine.arg_utils.EngineArgs default")
    assert memory_utilization_for(0.5, 80e9) == (0.5, "--memory-utilization")
    missing = UtilizationDefault(None, "vllm is not installed")
    monkeypatch.setattr("sysbench_gpu.profiling.stage.vllm_default_utilization", lambda: missing)
    value, source = memory_utilization_for(None, 80e9)
    assert value == FALLBACK_GPU_MEMORY_UTILIZATION and "vllm is not installed" in source
    with pytest.raises(SysbenchError, match="--memory-utilization must lie in"):
        memory_utilization_for(1.5, 80e9)


# ----------------------------------------------------------------- tensor-parallel to-do agreement


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _torchrun_env(rank: int, world: int, port: int) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        CUDA_VISIBLE_DEVICES="",
    )


def _agree_rank(rank: int, port: int, todos: list[list[int]], results: Any) -> None:
    """One rank: agree, then the collective the model load stands for, entered only with work to do."""
    import torch.distributed as torch_dist

    from sysbench_gpu.attention.capture.layout import Distributed
    from sysbench_gpu.attention.stage import agree_on_todo

    _torchrun_env(rank, len(todos), port)
    todo = agree_on_todo(todos[rank], Distributed.from_env())
    if todo:
        torch_dist.barrier()  # hangs the other ranks if one skips it
    torch_dist.destroy_process_group()
    results.put((rank, todo))


def _stage_rank(rank: int, port: int, outs: list[str], results: Any) -> None:
    """One rank of the stage's own code, each rank reading its own view of the output folder."""
    import argparse

    import torch.distributed as torch_dist

    from sysbench_gpu.attention import stage
    from sysbench_gpu.attention.capture.layout import Distributed, LoadPlan

    _torchrun_env(rank, len(outs), port)
    measured: list[list[int]] = []

    def fake_measure_sessions(args, runs, todo, *rest) -> None:
        if not torch_dist.is_initialized():  # as transformers' tensor-parallel load does
            torch_dist.init_process_group("gloo")
        torch_dist.barrier()  # stands for the model load: a collective
        measured.append(list(todo))
        torch_dist.destroy_process_group()

    stage.measure_sessions = fake_measure_sessions  # this process only
    stage.finish = lambda out, run, args: None
    stage.finish_knockout = lambda *args, **kwargs: None  # no knockout in this run
    stage.check_model_splits = lambda model, world: None  # no model here (tests/test_attn_tensor_parallel.py has one)
    sessions = [SimpleNamespace(system_id=1), SimpleNamespace(system_id=2)]
    plan = LoadPlan("tensor-parallel", tensor_parallel_size=len(outs))
    stage._measure_and_finish(
        argparse.Namespace(model="fake", wait_timeout=1.0, bootstrap=0, no_figures=True),
        None,
        sessions,
        {},
        "reference",
        ("system",),
        Path(outs[rank]),
        Distributed.from_env(),
        plan,
        {},
        None,
    )
    results.put((rank, measured))


def _run_ranks(target: Any, per_rank: list[Any]) -> dict[int, Any]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = _free_port()
    processes = [context.Process(target=target, args=(rank, port, per_rank, results)) for rank in range(len(per_rank))]
    for process in processes:
        process.start()
    try:
        for process in processes:
            process.join(JOIN_TIMEOUT_S)
        hung = [rank for rank, process in enumerate(processes) if process.is_alive()]
        assert not hung, f"ranks {hung} still running after {JOIN_TIMEOUT_S} s: the ranks disagree on the work"
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(5)
    assert [process.exitcode for process in processes] == [0] * len(processes)
    return dict(results.get(timeout=5) for _ in processes)


def test_tensor_parallel_ranks_take_rank_zeros_todo() -> None:
    """Rank 1 sees everything done, rank 0 sees two sessions to do: both run rank 0's two."""
    assert _run_ranks(_agree_rank, [[0, 1], []]) == {0: [0, 1], 1: [0, 1]}


def test_the_stage_does_not_hang_when_ranks_see_different_folders(tmp_path) -> None:
    from sysbench_gpu.attention.files.store import session_path

    rank0, rank1 = tmp_path / "rank0-view", tmp_path / "rank1-view"
    rank0.mkdir()
    for system_id in (1, 2):  # rank 1's view: both sessions already written
        path = session_path(rank1, system_id, "system")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    assert _run_ranks(_stage_rank, [str(rank0), str(rank1)]) == {0: [[0, 1]], 1: [[0, 1]]}
