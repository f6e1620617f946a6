"""Data-parallel replicas without vLLM: placement by session id through the scheduler, ports, manifest records.

The replicas are real Ray actors (the session's local Ray, ``ray_local``) with a stand-in backend (``FoldingBackend``):
a chat template without a system role (so the scheduler folds the system message into
turn 1) and a small context (so ``--on-overflow truncate-history`` drops old turns).
Both change a conversation's first messages from turn to turn, which is what used to
move a session to another replica.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from sysbench_gpu.benchmarks.registry import load_dataset
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.messages import conversation_for_turn, fold_system_message
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.engines.base import Completion, SamplingSpec, chat_sessions
from sysbench_gpu.engines.replicas import (
    DEFAULT_REPLICA_PORT_BASE,
    REPLICA_PORT_STRIDE,
    replica_port_bases,
    session_key,
)
from sysbench_gpu.engines.vllm_engine import VLLMEngine, batch_invariance
from sysbench_gpu.generation.run import run_generation
from sysbench_gpu.generation.settings import GenerateSettings

# A token is a word. With this context the demo sessions outgrow it at different turns
# (sessions 1, 4, 5 at turn 4; 2 at turn 5; 3 never), so placement by the first two
# messages moved sessions 1, 2 and 4 to the other replica.
CONTEXT = 100


class FoldingBackend:
    """A replica that says which port range it got; no system role; a token is a word."""

    def __init__(self, model: str, **options: Any) -> None:
        self.port = os.environ.get("VLLM_PORT", "")
        self.devices = os.environ.get("CUDA_VISIBLE_DEVICES")
        self.replicas_sharing_memory = options.get("replicas_sharing_memory")

    def chat(self, conversations: Sequence[Sequence[dict[str, str]]], sampling: SamplingSpec) -> list[Completion]:
        return [
            Completion(
                text=f"port {self.port}",
                prompt_tokens=self.count_prompt_tokens(c),
                output_tokens=1,
                finish_reason="stop",
            )
            for c in conversations
        ]

    def count_prompt_tokens(self, conversation: Sequence[dict[str, str]]) -> int:
        return sum(len(m["content"].split()) for m in conversation)

    def supports_system_role(self) -> bool:
        return False

    def runtime_info(self) -> dict[str, Any]:
        return {
            "max_model_len": CONTEXT,
            "replicas_sharing_memory": self.replicas_sharing_memory,
            "devices": self.devices,
        }

    def close(self) -> None:
        pass


FOLDING = "test_engine_replicas:FoldingBackend"


@pytest.fixture
def importable_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # the replicas import this module by the driver's path


def test_a_session_stays_on_its_replica_through_folding_and_truncation(
    tmp_path: Path, importable_backend: None, monkeypatch: pytest.MonkeyPatch, ray_local: object
) -> None:
    monkeypatch.delenv("VLLM_PORT", raising=False)
    demo = load_dataset("demo")
    session = demo.sessions[0]
    # What broke it: the first two messages differ between turns once the system message is folded.
    turn1 = fold_system_message(conversation_for_turn(session, 1, {}))
    turn2 = fold_system_message(conversation_for_turn(session, 2, {1: "a reply"}))
    assert session_key(turn1) != session_key(turn2)

    engine = VLLMEngine("stand-in", data_parallel_size=2, replica_factory=FOLDING)
    try:
        settings = GenerateSettings(
            model="stand-in", engine="vllm", sampling=SamplingSpec(max_tokens=4), on_overflow="truncate-history"
        )
        run = RunDir(tmp_path / "run")
        run_generation(engine, demo, demo.sessions, run, settings, progress=False)
    finally:
        engine.close()

    records = run.generations.read()
    assert len(records) == 25
    truncated = [key for key, record in records.items() if record.overflow]
    assert {system_id for system_id, _ in truncated} == {1, 2, 4, 5}  # truncation really happened
    assert all(record.status == "ok" for record in records.values())
    replicas: dict[int, set[int]] = {}
    ports: dict[int, set[str]] = {}
    for (system_id, _), record in records.items():
        replicas.setdefault(system_id, set()).add(record.extra["replica"])
        ports.setdefault(system_id, set()).add(record.response or "")
    assert all(len(placed) == 1 for placed in replicas.values()), replicas
    assert all(len(seen) == 1 for seen in ports.values())
    assert {next(iter(p)) for p in replicas.values()} == {0, 1}  # both replicas served sessions

    manifest = json.loads(run.manifest_path.read_text(encoding="utf-8"))
    described = manifest["stages"]["generate"]["engine_describe"]
    assert manifest["stages"]["generate"]["system_folded"] is True
    ports = [r["placement"]["vllm_port"] for r in described["replicas"]["per_replica"]]
    assert ports == [str(DEFAULT_REPLICA_PORT_BASE), str(DEFAULT_REPLICA_PORT_BASE + REPLICA_PORT_STRIDE)]
    assert {f"port {p}" for p in ports} == {r.response for r in records.values()}
    assert sum(r["requests"] for r in described["replicas"]["per_replica"]) == 25
    assert described["replicas_sharing_memory"] == 2  # CPU replicas split the free memory
    assert described["batch_invariant"] is False and described["VLLM_BATCH_INVARIANT"] is None


def test_each_replica_gets_its_own_port_range() -> None:
    assert replica_port_bases(2, {}) == [20000, 20100]
    # An exported VLLM_PORT is the base; before, every replica scanned up from that one port.
    bases = replica_port_bases(4, {"VLLM_PORT": "31000"})
    assert bases == [31000, 31100, 31200, 31300]
    assert all(b - a >= REPLICA_PORT_STRIDE for a, b in zip(bases, bases[1:], strict=False))
    with pytest.raises(SysbenchError, match="VLLM_PORT='http://x:1': must be a port number"):
        replica_port_bases(2, {"VLLM_PORT": "http://x:1"})
    with pytest.raises(SysbenchError, match="need ports 65500-65699"):
        replica_port_bases(2, {"VLLM_PORT": "65500"})


def test_batch_invariance_is_recorded_as_set(importable_backend: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    engine = VLLMEngine("stand-in", replica_factory=FOLDING)
    assert engine.describe()["batch_invariant"] is True and engine.describe()["VLLM_BATCH_INVARIANT"] == "1"
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")
    assert engine.describe()["batch_invariant"] is False
    assert batch_invariance({}) == {"VLLM_BATCH_INVARIANT": None, "batch_invariant": False}


def test_chat_sessions_passes_keys_only_to_engines_that_take_them() -> None:
    calls: list[Any] = []

    class Plain:
        def chat(self, conversations, sampling):
            calls.append(("plain", len(conversations)))
            return [Completion(text="x") for _ in conversations]

    class Placing:
        def chat(self, conversations, sampling, session_keys=None):
            calls.append(("placing", list(session_keys)))
            return [Completion(text="y") for _ in conversations]

    conversations = [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]
    assert [c.text for c in chat_sessions(Plain(), conversations, SamplingSpec(), ["1", "2"])] == ["x", "x"]
    assert [c.text for c in chat_sessions(Placing(), conversations, SamplingSpec(), ["1", "2"])] == ["y", "y"]
    assert calls == [("plain", 2), ("placing", ["1", "2"])]
    with pytest.raises(ValueError, match="1 session keys for 2 conversations"):
        chat_sessions(Placing(), conversations, SamplingSpec(), ["1"])
