"""The attention stage launched the multi-node way (launch/attention_multinode.sh), two "nodes" on this machine.

Two torchrun agents, one rank each, meet through a c10d rendezvous on 127.0.0.1 as two nodes
would; each rank measures every second session into the shared output folder and rank 0
merges. The merged result must be exactly one process's. A random-weight 4-layer Llama with
the embedded model's tokenizer keeps each rank's load and forwards small.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from sysbench_gpu.benchmarks.registry import load_dataset, save_run_sessions  # noqa: E402
from sysbench_gpu.cli import main  # noqa: E402
from sysbench_gpu.core.records import GenerationRecord  # noqa: E402
from sysbench_gpu.core.rundir import RunDir  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "launch" / "attention_multinode.sh"
# float32 on the CPU, two layers measured, small chunks; the script adds --control and takes
# --layers and --dtype from LAYERS and DTYPE.
OPTIONS = ["--layers", "1,3", "--chunk-tokens", "48", "--bootstrap", "20", "--no-figures"]
ENV = {"LAYERS": "1,3", "DTYPE": "float32"}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, smollm2_path: str) -> Path:
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_path)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    path = tmp_path_factory.mktemp("tiny-llama")
    transformers.LlamaForCausalLM(config).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three demo sessions, shortened, with a reply for every turn."""
    demo = load_dataset("demo")
    sessions = []
    for session in demo.sessions[:3]:
        turns = tuple(dataclasses.replace(t, user=t.user[:40]) for t in session.turns)
        sessions.append(dataclasses.replace(session, system_prompt=session.system_prompt[:90], turns=turns))
    run = RunDir(tmp_path_factory.mktemp("run") / "run")
    run.update_manifest(stage="generate", model="tiny")
    save_run_sessions(run, sessions, demo)
    run.generations.append(
        [
            GenerationRecord(
                system_id=s.system_id, turn=t.index, user=t.user, response=f"ok {t.index}: {t.user[:10]}", model="tiny"
            )
            for s in sessions
            for t in s.turns
        ]
    )
    return run.path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def merged(out: Path) -> tuple[list[str], dict[str, dict[str, np.ndarray]]]:
    rows = sorted((out / "turn_shares.jsonl").read_text(encoding="utf-8").splitlines())
    arrays = {}
    for path in sorted((out / "sessions").glob("*.npz")):
        with np.load(path) as stored:
            arrays[path.name] = {name: stored[name] for name in stored.files if name != "meta"}
    return rows, arrays


def test_two_nodes_by_c10d_rendezvous_split_the_sessions_and_merge_as_one_process(
    tiny_model: Path, run_dir: Path, tmp_path: Path
) -> None:
    one = tmp_path / "one"
    alone = [
        "attention",
        str(run_dir),
        "--model",
        str(tiny_model),
        "--out",
        str(one),
        "--dtype",
        "float32",
        "--control",
    ]
    assert main([*alone, *OPTIONS]) == 0

    two = tmp_path / "two"  # the "shared file system": both nodes write here, rank 0 merges
    env = dict(os.environ)
    env.update(ENV)
    env.update(
        NNODES="2",
        NPROC="1",
        RDZV_HOST="127.0.0.1",
        RDZV_PORT=str(free_port()),
        RDZV_ID=uuid.uuid4().hex,
        LOCAL_ADDR="127.0.0.1",  # MASTER_ADDR; nothing leaves this machine
        TORCHRUN=str(Path(sys.executable).parent / "torchrun"),
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1",
    )
    command = ["bash", str(SCRIPT), str(run_dir), str(tiny_model), str(two), *OPTIONS[2:]]  # --layers via LAYERS
    logs = [tmp_path / f"node{n}.log" for n in range(2)]
    nodes = []
    for log in logs:
        with open(log, "w", encoding="utf-8") as handle:
            nodes.append(subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT))
    try:
        codes = [node.wait(timeout=900) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait()
    tails = "\n".join(log.read_text(encoding="utf-8", errors="replace")[-3000:] for log in logs)
    assert codes == [0, 0], tails
    both = "\n".join(log.read_text(encoding="utf-8", errors="replace") for log in logs)
    assert "sysbench-gpu" in both and "the same on every node?" in both  # the script's version check ran

    rows_one, arrays_one = merged(one)
    rows_two, arrays_two = merged(two)
    assert rows_two == rows_one and len(rows_one) == 2 * 2 * 15  # conditions x layers x turns
    assert sorted(arrays_two) == sorted(arrays_one) and len(arrays_one) == 6
    for name, stored in arrays_one.items():
        assert sorted(arrays_two[name]) == sorted(stored)
        for key, value in stored.items():
            assert np.array_equal(arrays_two[name][key], value), (name, key)
    # One launch of two ranks, one per node: each marked its share done under the rendezvous id.
    markers = sorted(p.name for p in (two / "shards").glob("*.done"))
    assert markers == ["rank0-of-2.done", "rank1-of-2.done"]
    assert {(two / "shards" / m).read_text(encoding="utf-8").strip() for m in markers} == {env["RDZV_ID"]}
    assert json.loads((two / "manifest.json").read_text(encoding="utf-8"))["layers"] == [1, 3]
