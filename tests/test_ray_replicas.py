"""Data-parallel replicas as Ray actors (``engines.ray_pool``), all on this machine's CPU and 127.0.0.1.

Stand-in backends (this module's classes, through ``replica_factory``) test the pool: placement,
order, failures, a replica killed mid-turn, the restart limit. The embedded model (``smollm2``)
tests ``generate`` itself: two replicas give the records of one, under a local Ray started for
the run and under ``--ray-address``; Ctrl-C leaves no process behind. In-process tests share one
local Ray (``ray_local``); tests that must start or join their own run ``generate`` as a child.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")

from sysbench_gpu.benchmarks.registry import load_dataset  # noqa: E402
from sysbench_gpu.cli import main  # noqa: E402
from sysbench_gpu.core.errors import SysbenchError  # noqa: E402
from sysbench_gpu.core.rundir import RunDir  # noqa: E402
from sysbench_gpu.engines import get_engine  # noqa: E402
from sysbench_gpu.engines.base import Completion, SamplingSpec  # noqa: E402
from sysbench_gpu.engines.process_tree import (  # noqa: E402
    command_line,
    descendants,
    kill_replica_processes,
    process_table,
)
from sysbench_gpu.engines.ray_pool import RayReplicaPool, ReplicaSpec  # noqa: E402
from sysbench_gpu.engines.vllm_engine import VLLMEngine  # noqa: E402
from sysbench_gpu.generation.run import run_generation  # noqa: E402
from sysbench_gpu.generation.settings import CallStats, GenerateSettings  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
RAY_CLI = Path(sys.executable).parent / "ray"
SESSION_DIR = re.compile(r"session_\d{4}-\d\d-\d\d_[\d_-]+")
STAND_IN = "test_ray_replicas:StandIn"


class StandIn:
    """A replica without a model: answers from the conversation, so any replica gives the same reply.

    ``victim_call``: on that call, the first replica to claim ``marker_dir/victim`` writes its pid
    there and waits to be killed (the test's SIGKILL); a restarted replica counts its calls anew.
    """

    def __init__(self, model: str, **options: Any) -> None:
        if model == "fail-to-load":
            raise RuntimeError("weights not found")
        self.port = os.environ.get("VLLM_PORT", "")
        self.executor = options.get("distributed_executor_backend")
        self.marker_dir = options.get("marker_dir")
        self.victim_call = options.get("victim_call")
        self.calls = 0

    def chat(self, conversations: Sequence[Sequence[dict[str, str]]], sampling: SamplingSpec) -> list[Completion]:
        self.calls += 1
        if any(c[-1]["content"] == "boom" for c in conversations):
            raise SysbenchError("session 9, turn 2: exploded")
        if self.marker_dir and self.calls == self.victim_call:
            try:
                descriptor = os.open(Path(self.marker_dir) / "victim", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(descriptor, str(os.getpid()).encode())
                os.close(descriptor)
                time.sleep(300)  # killed long before this ends
        return [
            Completion(
                text=f"reply to: {c[-1]['content'][:24]}|port {self.port}",
                prompt_tokens=self.count_prompt_tokens(c),
                output_tokens=1,
                finish_reason="stop",
            )
            for c in conversations
        ]

    def count_prompt_tokens(self, conversation: Sequence[dict[str, str]]) -> int:
        return sum(len(m["content"].split()) for m in conversation)

    def supports_system_role(self) -> bool:
        return True

    def context_length(self) -> int:
        return 100_000

    def runtime_info(self) -> dict[str, Any]:
        return {"max_model_len": 100_000, "port": self.port, "executor": self.executor}

    def describe(self) -> dict[str, Any]:
        return {"engine": "hf", "model": "stand-in", "pid": os.getpid()}

    def close(self) -> None:
        pass


def chat_of(system: str, *turns: str) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}]
    for index, user in enumerate(turns):
        if index:
            messages.append({"role": "assistant", "content": f"reply {index}"})
        messages.append({"role": "user", "content": user})
    return messages


def alive(pid: int) -> bool:
    """Running (a zombie has finished; its parent has not yet reaped it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def survivors(snapshot: dict[int, str | None], wait_s: float = 30.0) -> dict[int, str | None]:
    """The processes of ``snapshot`` (pid -> command line) still running, after waiting up to ``wait_s`` for them."""
    deadline = time.monotonic() + wait_s
    while True:
        left = {pid: cmd for pid, cmd in snapshot.items() if alive(pid) and command_line(pid) == cmd}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


# --- the pool, with stand-ins --------------------------------------------------------


def test_vllm_replicas_split_by_session_gather_in_order_and_never_read_a_failed_batch(ray_local: Any) -> None:
    engine = VLLMEngine("stand-in", data_parallel_size=2, tensor_parallel_size=2, replica_factory=STAND_IN)
    try:
        described = engine.describe()
        replicas = described["replicas"]
        assert replicas["backend"] == "ray" and replicas["count"] == 2 and described["data_parallel_size"] == 2
        # TP 2 in a placement group: vLLM's own worker processes, not its Ray executor (which would wait for bundles).
        assert described["executor"] == "mp" and described["distributed_executor_backend"] is None
        ports = [r["placement"]["vllm_port"] for r in replicas["per_replica"]]
        assert ports == ["20000", "20100"]  # each replica its own VLLM_PORT range
        assert all(r["node"]["ip"] == "127.0.0.1" for r in replicas["per_replica"])
        # No GPU in this cluster: the tp x pp GPUs become CPU replicas, one placement group each.
        assert [r["placement"]["bundles"] for r in replicas["per_replica"]] == [[{"CPU": 1.0}]] * 2
        assert engine.context_length() == 100_000 and engine.count_prompt_tokens(chat_of("one two", "three")) == 3

        turn1 = [chat_of(f"system {i}", f"q{i}.1") for i in range(5)]
        first = engine.chat(turn1, SamplingSpec(max_tokens=4), session_keys=[str(i) for i in range(5)])
        assert [c.text.split("|")[0] for c in first] == [f"reply to: q{i}.1" for i in range(5)]
        port_of = {i: c.text.split("port ")[1] for i, c in enumerate(first)}
        assert sorted(set(port_of.values())) == ports  # both replicas served
        # Turn 2 in another order: each session goes back to its replica (its prefix cache).
        order = [3, 0, 4, 1, 2]
        turn2 = [chat_of(f"system {i}", f"q{i}.1", f"q{i}.2") for i in order]
        second = engine.chat(turn2, SamplingSpec(max_tokens=4), session_keys=[str(i) for i in order])
        assert [c.text.split("|")[0] for c in second] == [f"reply to: q{i}.2" for i in order]
        assert [c.text.split("port ")[1] for c in second] == [port_of[i] for i in order]
        assert [r["requests"] for r in engine.describe()["replicas"]["per_replica"]] == [6, 4]

        # One replica raises while the other answers: one line naming it, and the next batch gets its own replies.
        with pytest.raises(SysbenchError, match=r"vllm engine: replica 0 on .* failed while chat: session 9, turn 2"):
            engine.chat([chat_of("system 0", "boom"), chat_of("system 1", "fine")], SamplingSpec(), ["0", "1"])
        third = engine.chat([chat_of("system 1", "later"), chat_of("system 0", "after")], SamplingSpec(), ["1", "0"])
        assert [c.text.split("|")[0] for c in third] == ["reply to: later", "reply to: after"]
    finally:
        engine.close()


def test_a_replica_that_fails_to_load_is_one_line(ray_local: Any) -> None:
    spec = ReplicaSpec(label="hf engine", factory=STAND_IN, options={"model": "fail-to-load"}, count=2, cpus=1)
    with pytest.raises(SysbenchError, match=r"hf engine: replica 0 on .* failed while starting: RuntimeError: weights"):
        RayReplicaPool(spec)


def test_a_replica_killed_mid_turn_loses_nothing_and_writes_nothing_twice(ray_local: Any, tmp_path: Path) -> None:
    """SIGKILL one actor inside turn 2: its requests go to it restarted; every record once; the restart recorded."""
    demo = load_dataset("demo")
    sessions = demo.sessions[:4]
    markers = tmp_path / "markers"
    markers.mkdir()
    engine = get_engine(
        "hf", model="stand-in", data_parallel_size=2, replica_factory=STAND_IN, marker_dir=str(markers), victim_call=2
    )
    killed: dict[str, int] = {}
    killer = threading.Thread(target=kill_when_named, args=(markers / "victim", killed), daemon=True)
    killer.start()
    run = RunDir(tmp_path / "run")
    try:
        before = {r["pid"] for r in engine.describe()["replicas"]["per_replica"]}
        settings = GenerateSettings(model="stand-in", engine="hf", sampling=SamplingSpec(max_tokens=4))
        run_generation(engine, demo, sessions, run, settings, progress=False)
    finally:
        engine.close()
    killer.join(timeout=5)
    assert killed["pid"] in before and not alive(killed["pid"])

    lines = [json.loads(line) for line in run.generations.path.read_text(encoding="utf-8").splitlines() if line]
    keys = Counter((line["system_id"], line["turn"]) for line in lines)
    assert set(keys) == {(s.system_id, t.index) for s in sessions for t in s.turns}
    assert set(keys.values()) == {1}  # every record exactly once
    for (system_id, turn), record in run.generations.read().items():
        user = next(s for s in sessions if s.system_id == system_id).turn(turn).user
        assert record.status == "ok" and record.response.startswith(f"reply to: {user[:24]}|port")

    described = json.loads(run.manifest_path.read_text(encoding="utf-8"))["stages"]["generate"]["engine_describe"]
    replicas = described["replicas"]
    assert replicas["restarts"] == 1 and len(replicas["deaths"]) == 1
    victim = replicas["deaths"][0]["replica"]
    assert replicas["deaths"][0]["pid"] == killed["pid"]
    assert replicas["per_replica"][victim]["restarts"] == 1 and replicas["per_replica"][victim]["pid"] != killed["pid"]
    assert sum(r["requests"] for r in replicas["per_replica"]) == 20
    stats = json.loads(run.stats_path.read_text(encoding="utf-8"))
    assert [sum(call["replica_requests"].values()) for call in stats["calls"]] == [4] * 5
    assert {"requests", "wall_s", "prompt_tokens", "output_tokens", "finish_reasons"} <= set(stats["calls"][1])


def test_past_the_restart_limit_is_one_line_naming_the_replica_and_node(ray_local: Any, tmp_path: Path) -> None:
    engine = get_engine(
        "hf",
        model="stand-in",
        data_parallel_size=2,
        replica_factory=STAND_IN,
        marker_dir=str(tmp_path),
        victim_call=1,
        max_replica_restarts=0,
    )

    killer = threading.Thread(target=kill_when_named, args=(tmp_path / "victim",), daemon=True)
    killer.start()
    try:
        with pytest.raises(
            SysbenchError, match=r"hf engine: replica [01] on node .*127\.0\.0\.1.* died 1 time, past the"
        ):
            engine.chat([chat_of("a", "x"), chat_of("b", "y")], SamplingSpec(), ["a", "b"])
    finally:
        engine.close()
        killer.join(timeout=5)


def test_a_replica_that_cannot_be_placed_again_is_retired_and_its_sessions_move(
    ray_local: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its node gone for good (here: its placement never ready again): the others take its sessions."""
    placed = RayReplicaPool._await_placement

    def never_again(self: RayReplicaPool, replicas: Any, timeout_s: float, required: bool = True) -> list[int]:
        return placed(self, replicas, timeout_s, required) if required else []

    monkeypatch.setattr(RayReplicaPool, "_await_placement", never_again)
    engine = get_engine(
        "hf", model="stand-in", data_parallel_size=2, replica_factory=STAND_IN, marker_dir=str(tmp_path), victim_call=1
    )
    killer = threading.Thread(target=kill_when_named, args=(tmp_path / "victim",), daemon=True)
    killer.start()
    try:
        first = engine.chat([chat_of("a", "x"), chat_of("b", "y")], SamplingSpec(), ["a", "b"])
        replicas = engine.describe()["replicas"]
        retired = [r["replica"] for r in replicas["per_replica"] if r["retired"]]
        assert len(retired) == 1 and replicas["restarts"] == 1
        assert [c.text.split("|")[0] for c in first] == ["reply to: x", "reply to: y"]
        assert {c.extra["replica"] for c in first} == {1 - retired[0]}  # the survivor answered both
        later = engine.chat([chat_of("b", "y", "z"), chat_of("a", "x", "w")], SamplingSpec(), ["b", "a"])
        assert {c.extra["replica"] for c in later} == {1 - retired[0]}
    finally:
        engine.close()
        killer.join(timeout=5)


def kill_when_named(path: Path, killed: dict[str, int] | None = None) -> None:
    """SIGKILL the pid a stand-in writes to ``path`` (its "victim" marker), once it is there; ``killed["pid"]``."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text:
            os.kill(int(text), signal.SIGKILL)
            if killed is not None:
                killed["pid"] = int(text)
            return
        time.sleep(0.05)


def test_the_local_judge_checks_its_replica_options_before_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse
    import importlib.util
    from types import SimpleNamespace

    from sysbench_gpu.judging.cli import make_engine_factory

    args = argparse.Namespace(seed=None)
    settings: Any = SimpleNamespace(backend="hf", model="m")
    with pytest.raises(SysbenchError, match="--engine-option ray_address places data-parallel replicas; it needs"):
        make_engine_factory(args, settings, {"ray_address": "auto"})
    assert callable(make_engine_factory(args, settings, {"data_parallel_size": 2}))  # built only when called
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real_find_spec(name, *a)
    )
    with pytest.raises(SysbenchError, match=r"--engine-option data_parallel_size 2 runs its replicas on Ray, which is"):
        make_engine_factory(args, settings, {"data_parallel_size": 2})


def test_process_tree_kill_takes_the_group_and_leaves_other_processes(tmp_path: Path) -> None:
    # A stand-in for a replica: titled like a Ray worker, leader of its own group, with a child of its own.
    tree = subprocess.Popen(
        ["bash", "-c", 'exec -a "ray::ReplicaActor" bash -c "sleep 300 & sleep 300 & wait"'], start_new_session=True
    )
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(descendants(tree.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        children = descendants(tree.pid)
        assert len(children) == 2
        assert kill_replica_processes(other.pid, other.pid) == []  # not a Ray worker's title: never touched
        killed = kill_replica_processes(tree.pid, tree.pid)
        assert set(killed) == {tree.pid, *children}
        tree.wait(timeout=30)
        assert not survivors({pid: command_line(pid) for pid in children}) and other.poll() is None
    finally:
        for process in (tree, other):
            if process.poll() is None:
                process.kill()
                process.wait()


# --- flags and their checks, without a model ------------------------------------------------


def test_the_cluster_script_checks_tp_and_sets_interfaces_only_when_given(tmp_path: Path) -> None:
    """launch/ray_cluster_dp.sh's worker role with a stand-in ``ray`` that prints what it inherited."""
    names = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "HF_HUB_OFFLINE", "VLLM_HOST_IP")
    fake = tmp_path / "bin" / "ray"
    fake.parent.mkdir()
    fake.write_text("#!/usr/bin/env bash\n" + "".join(f'echo "{n}=${{{n}-unset}}"\n' for n in names) + 'echo "$@"\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in (*names, "IFNAME", "TP")}
    env.update(PATH=f"{fake.parent}:{env['PATH']}", HEAD_IP="127.0.0.1", NODE_IP="127.0.0.1")
    script = str(REPO_ROOT / "launch" / "ray_cluster_dp.sh")
    done = subprocess.run(["bash", script, "worker"], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "NCCL_SOCKET_IFNAME=unset" in done.stdout and "GLOO_SOCKET_IFNAME=unset" in done.stdout
    assert "HF_HUB_OFFLINE=1" in done.stdout and "VLLM_HOST_IP=127.0.0.1" in done.stdout
    assert "start --address 127.0.0.1:6379 --node-ip-address 127.0.0.1" in done.stdout
    refused = subprocess.run(
        ["bash", script, "worker"], env={**env, "TP": "3"}, capture_output=True, text=True, timeout=30
    )
    assert refused.returncode == 2 and refused.stdout == "" and "TP=3" in refused.stderr


def test_one_replica_never_imports_ray_and_a_missing_ray_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Size 1: the backend is built in this process (here `dict`, the lightest factory there is); Ray is not imported.
    code = (
        "import sys; from sysbench_gpu.engines import get_engine; "
        "engine = get_engine('hf', model='m', data_parallel_size=1, replica_factory='builtins:dict'); "
        "print(engine, 'ray' in sys.modules)"
    )
    shown = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=300)
    assert shown.stdout.split() == ["{'model':", "'m'}", "False"], shown.stderr[-2000:]

    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real_find_spec(name, *a)
    )
    out = tmp_path / "run"
    common = ["generate", "--data", "demo", "--engine", "hf", "--model", "smollm2", "--out", str(out)]
    assert main([*common, "--data-parallel-size", "2"]) == 2
    assert (
        "--data-parallel-size 2 runs its replicas on Ray, which is not installed: pip install 'sysbench-gpu[ray]'"
        in (capsys.readouterr().err)
    )
    assert main([*common, "--ray-address", "127.0.0.1:6379"]) == 2
    assert "it needs --data-parallel-size 2 or more" in capsys.readouterr().err
    assert main([*common, "--data-parallel-size", "2", "--ray-address", "ray://x"]) == 2
    assert "expected auto or HOST:PORT" in capsys.readouterr().err
    assert not out.exists()  # refused before anything was made
    with pytest.raises(SysbenchError, match=r"sysbench-gpu\[ray\]"):
        get_engine("hf", model="stand-in", data_parallel_size=2, replica_factory=STAND_IN)


def test_stats_keep_their_fields_without_replicas() -> None:
    call = CallStats(
        turn=1,
        history="model",
        requests=2,
        wall_s=1.0,
        prompt_tokens=3,
        cached_prompt_tokens=None,
        output_tokens=4,
        finish_reasons={"stop": 2},
        skipped=0,
        truncated=0,
        started="t",
    )
    assert "replica_requests" not in call.to_json()


# --- generate with the embedded model --------------------------------------------------------

SESSIONS = "2,3"  # the two shortest demo sessions
GENERATE = ["--data", "demo", "--sessions", SESSIONS, "--engine", "hf", "--model", "smollm2"]
# Batch shapes and thread counts change the numerics: one sequence, one thread, greedy.
SAME_NUMERICS = ["--batch-size", "1", "--cpu-threads", "1", "--max-tokens", "8", "--no-progress"]


def comparable(run: Path) -> dict[tuple[int, int], tuple[Any, ...]]:
    return {
        key: (r.response, r.prompt_tokens, r.output_tokens, r.finish_reason, r.status)
        for key, r in RunDir(run).generations.read().items()
    }


@pytest.fixture(scope="module")
def one_replica(tmp_path_factory: pytest.TempPathFactory, smollm2_path: str) -> Path:
    """The records of one replica, in this process (no Ray)."""
    import torch

    threads = torch.get_num_threads()
    out = tmp_path_factory.mktemp("one") / "run"
    try:
        assert main(["generate", *GENERATE, *SAME_NUMERICS, "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)  # --cpu-threads set this process's torch
    return out


def run_generate_child(
    out: Path, *extra: str, log: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sysbench_gpu", "generate", *GENERATE, *SAME_NUMERICS, "--out", str(out), *extra]
    with open(log, "w", encoding="utf-8") as handle:
        return subprocess.run(
            command,
            cwd=REPO_ROOT,
            env=env or child_env(),
            stdout=handle,
            stderr=subprocess.STDOUT,
            timeout=900,
            text=True,
        )


def test_two_replicas_on_a_local_ray_give_the_records_of_one(one_replica: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    log = tmp_path / "generate.log"
    finished = run_generate_child(out, "--data-parallel-size", "2", log=log)
    assert finished.returncode == 0, log.read_text(encoding="utf-8")[-4000:]
    assert comparable(out) == comparable(one_replica) and len(comparable(out)) == 10
    replicas = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["stages"]["generate"]["engine_describe"]
    replicas = replicas["replicas"]
    assert replicas["backend"] == "ray" and replicas["count"] == 2 and replicas["ray_address"] == "local"
    assert [r["requests"] for r in replicas["per_replica"]] == [5, 5] and replicas["restarts"] == 0
    assert {r["node"]["ip"] for r in replicas["per_replica"]} == {"127.0.0.1"}
    records = RunDir(out).generations.read()
    assert {records[(2, t)].extra["replica"] for t in range(1, 6)} != {
        records[(3, t)].extra["replica"] for t in range(1, 6)
    }
    stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    assert [call["replica_requests"] for call in stats["calls"]] == [{"0": 1, "1": 1}] * 5


# A cluster joined by address checks a token when it was started with one (Ray's default where
# ~/.ray/auth_token exists); both sides get this one, so the test does not depend on that file.
HEAD_AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


@pytest.fixture
def ray_head(tmp_path: Path) -> Iterator[str]:
    """``ray start --head`` on 127.0.0.1 (its own temp folder); stopped, with everything it started, at the end.

    Not ``ray stop``: that stops every Ray on the machine, other tests' included.
    """
    temp = tempfile.mkdtemp(prefix="rayhead-", dir="/tmp")  # short: Ray's socket paths have a length limit
    port = free_port()
    log = tmp_path / "ray-head.log"
    command = [
        str(RAY_CLI),
        "start",
        "--head",
        "--port",
        str(port),
        "--node-ip-address",
        "127.0.0.1",
        "--num-cpus",
        "2",
        "--num-gpus",
        "0",
        "--include-dashboard",
        "false",
        "--disable-usage-stats",
        "--temp-dir",
        temp,
        "--block",
    ]
    with open(log, "w", encoding="utf-8") as handle:
        head = subprocess.Popen(command, env=child_env(**HEAD_AUTH), stdout=handle, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while not (Path(temp) / "ray_current_cluster").exists():
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start --head did not come up:\n{log.read_text(encoding='utf-8')[-3000:]}")
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        started = {pid: command_line(pid) for pid in descendants(head.pid)}
        head.send_signal(signal.SIGTERM)  # `ray start --block` ends the processes it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        for pid in survivors(started, wait_s=10):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)


def test_ray_address_joins_a_running_cluster_with_the_same_records(
    one_replica: Path, ray_head: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    log = tmp_path / "generate.log"
    joining = ["--data-parallel-size", "2", "--ray-address", ray_head]
    finished = run_generate_child(out, *joining, log=log, env=child_env(**HEAD_AUTH))
    assert finished.returncode == 0, log.read_text(encoding="utf-8")[-4000:]
    assert comparable(out) == comparable(one_replica)
    replicas = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["stages"]["generate"]["engine_describe"]
    assert replicas["replicas"]["ray_address"] == ray_head and replicas["replicas"]["count"] == 2
    assert replicas["data_parallel_size"] == 2


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_during_a_two_replica_run_leaves_no_ray_process(
    smollm2_path: str, tmp_path: Path, stop: signal.Signals
) -> None:
    """Ctrl-C (SIGINT: the CLI's "interrupted", exit 130) or SIGTERM (Ray's driver handler: an exit) mid-turn."""
    out = tmp_path / "run"
    log = tmp_path / "generate.log"
    command = [
        sys.executable,
        "-m",
        "sysbench_gpu",
        "generate",
        "--data",
        "demo",
        "--engine",
        "hf",
        "--model",
        "smollm2",
        "--out",
        str(out),
        "--data-parallel-size",
        "2",
        "--cpu-threads",
        "1",
        "--max-tokens",
        "256",
        "--no-progress",
    ]
    with open(log, "w", encoding="utf-8") as handle:
        child = subprocess.Popen(
            command, cwd=REPO_ROOT, env=child_env(), stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 600
        busy: list[int] = []
        while len(busy) < 2:
            if child.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the replicas never got to work:\n{log.read_text(encoding='utf-8')[-3000:]}")
            busy = [p for p in descendants(child.pid) if (command_line(p) or "").startswith("ray::ReplicaActor.chat")]
            time.sleep(0.2)
        # Everything the run started: Ray's own processes, its workers, the two actors.
        started = {pid: command_line(pid) for pid in descendants(child.pid)}
        assert any("raylet" in (cmd or "") for cmd in started.values())
        sessions = {m.group(0) for cmd in started.values() for m in [SESSION_DIR.search(cmd or "")] if m}
        assert len(sessions) == 1  # the local Ray started for this run
        child.send_signal(stop)
        code = child.wait(timeout=180)
        assert code == 130 if stop == signal.SIGINT else code != 0, log.read_text(encoding="utf-8")[-3000:]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if stop == signal.SIGINT:
        assert "interrupted" in log.read_text(encoding="utf-8")
    assert survivors(started) == {}
    # Nor anything of its Ray started after the snapshot: no process names the run's Ray session.
    session = sessions.pop()
    assert not [pid for pid in process_table() if session in (command_line(pid) or "")]
