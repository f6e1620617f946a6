"""The head-to-head benchmark's server start and stop, and its bookkeeping, against a stub server.

No model runs here: a stub OpenAI-compatible server (tests/stub_server_process.py) stands in
for ``vllm serve`` and ``transformers serve``. No timing is asserted.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from sysbench_gpu.benchmarks.registry import load_dataset
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.engines.server import PORT_PLACEHOLDER, ManagedServer, ServerSpec, transformers_server_spec

TESTS = Path(__file__).resolve().parent
BENCH_DIR = TESTS.parent / "kernels_bench"
STUB = TESTS / "stub_server_process.py"


@pytest.fixture()
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    import bench_vs_upstream

    return bench_vs_upstream


def stub_spec(*flags: str) -> ServerSpec:
    argv = (sys.executable, str(STUB), "--port", PORT_PLACEHOLDER, *flags)
    return ServerSpec("stub server", argv, "stub-model")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (ended, not yet reaped by its parent) counts as gone.
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "\nState:\tZ" in status.read_text())


def wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False


# ------------------------------------------------------------------ start and stop


def test_server_starts_on_a_free_port_answers_and_stops_with_its_workers(tmp_path):
    pid_file = tmp_path / "child.pid"
    server = ManagedServer(stub_spec("--child-pid-file", str(pid_file)), tmp_path / "server.log")
    with server:
        assert server.ready_s is not None and server.port is not None
        with urllib.request.urlopen(server.base_url + "/models") as response:
            assert json.load(response)["data"][0]["id"] == "stub"
        described = server.describe()
        assert str(server.port) in described["command"] and described["served_model"] == "stub-model"
        pid, child = server.pid, int(pid_file.read_text())
        assert alive(pid) and alive(child)
    assert wait_gone(pid) and wait_gone(child)
    assert server.stop_signal == "SIGINT"
    assert server.stop() == server.returncode  # idempotent


def test_server_that_dies_before_it_is_ready_is_one_line_naming_its_log(tmp_path):
    log = tmp_path / "server.log"
    with pytest.raises(SysbenchError) as error:
        ManagedServer(stub_spec("--exit-at-start", "3"), log).start()
    message = str(error.value)
    assert "\n" not in message
    assert "exited with code 3 before it was ready" in message
    assert str(log) in message and "fatal: the stub was told to fail" in message


def test_server_not_ready_in_time_is_stopped(tmp_path):
    pid_file = tmp_path / "child.pid"
    server = ManagedServer(
        stub_spec("--never-ready", "--child-pid-file", str(pid_file)),
        tmp_path / "server.log",
        ready_timeout_s=1.0,
        stop_timeout_s=2.0,
        poll_s=0.1,
    )
    with pytest.raises(SysbenchError, match="not ready after 1 s"):
        server.start()
    assert server.process is None
    assert wait_gone(server.pid) and wait_gone(int(pid_file.read_text()))


def test_server_that_ignores_sigint_gets_sigterm(tmp_path):
    server = ManagedServer(stub_spec("--ignore-sigint"), tmp_path / "server.log", stop_timeout_s=2.0)
    with server:
        pid = server.pid
    assert server.stop_signal == "SIGTERM"
    assert server.returncode is not None and server.returncode < 0
    assert wait_gone(pid)


def test_port_taken_between_probe_and_bind_tries_another_port(tmp_path):
    counter = tmp_path / "starts"
    server = ManagedServer(stub_spec("--port-taken-times", "2", "--counter", str(counter)), tmp_path / "server.log")
    with server:
        assert counter.read_text() == "3"
    fixed = ManagedServer(
        stub_spec("--port-taken-times", "9", "--counter", str(tmp_path / "other")),
        tmp_path / "fixed.log",
        port=server.port,
    )
    with pytest.raises(SysbenchError, match="was taken before the server could bind it"):
        fixed.start()


def test_ctrl_c_inside_the_block_still_stops_the_server(tmp_path):
    pid_file = tmp_path / "child.pid"
    with (
        pytest.raises(KeyboardInterrupt),
        ManagedServer(stub_spec("--child-pid-file", str(pid_file)), tmp_path / "s.log") as s,
    ):
        pid = s.pid
        raise KeyboardInterrupt
    assert wait_gone(pid) and wait_gone(int(pid_file.read_text()))


def test_transformers_serve_preloads_the_model_with_continuous_batching():
    spec = transformers_server_spec("/models/m", device="cpu", dtype="float32")
    command = spec.command(1234)
    assert command[1:3] == ["serve", "/models/m"]
    assert "--continuous-batching" in command and command[command.index("--port") + 1] == "1234"
    assert spec.served_model == "/models/m" and spec.ready_path == "/health"


# ------------------------------------------------------------------ bookkeeping


def test_sessions_are_cycled_renumbered_and_cut_to_the_turns(bench, tmp_path):
    path = tmp_path / "sessions.json"
    sessions = bench.write_sessions("demo", 7, 2, path)
    assert [s.system_id for s in sessions] == list(range(1, 8))
    assert all(len(s.turns) == 2 for s in sessions)
    assert sessions[5].system_prompt == sessions[0].system_prompt  # the 5 demo sessions, cycled
    assert [s.system_id for s in load_dataset(str(path)).sessions] == list(range(1, 8))


def test_forced_length_fields_per_server(bench):
    assert bench.forced_length_body("vllm", 16) == {"ignore_eos": True}
    config = json.loads(bench.forced_length_body("hf", 16)["generation_config"])
    assert config == {"max_new_tokens": 16, "min_new_tokens": 16, "do_sample": False}


def setup_for(bench, tmp_path, engine="vllm", sessions=3, turns=2, max_tokens=4, methods=("upstream", "server")):
    data = tmp_path / "sessions.json"
    return bench.Setup(
        engine=engine,
        model="stub-model",
        model_path="stub-model",
        sessions=bench.write_sessions("demo", sessions, turns, data),
        data_file=data,
        turns=turns,
        max_tokens=max_tokens,
        threads=2,
        server_concurrency=sessions,
        work_dir=tmp_path,
        methods=methods,
    )


@pytest.mark.parametrize("engine", ["vllm", "hf"])
def test_upstream_and_server_ways_against_a_stub_count_the_same_turns_and_tokens(bench, tmp_path, monkeypatch, engine):
    monkeypatch.setattr(bench, "server_spec", lambda setup: stub_spec("--cached"))
    setup = setup_for(bench, tmp_path, engine=engine)
    results = bench.three_ways(setup)
    assert [r.name for r in results] == ["upstream", "server"]
    report = bench.summarize(setup, results, None)
    assert report["checks"] == {"same_turns_and_tokens": True, "problems": []}
    rows = {row["name"]: row for row in report["methods"]}
    for row in rows.values():
        assert row["turns"] == 6 and row["output_tokens"] == 6 * 4
        assert set(row) >= {"name", "wall_s", "output_tokens", "turns", "ratio_to_upstream"}
    assert rows["upstream"]["ratio_to_upstream"] == 1.0
    # Both sent the same conversations (each way on its own history), so the stub's cache
    # accounting (turn 2 reuses turn 1's prompt) gives both the same hit rate.
    assert rows["upstream"]["prefix_cache_hit_rate"] == rows["server"]["prefix_cache_hit_rate"] > 0
    assert report["replies_differing_from_upstream"] == {"server": 0.0}
    assert report["measured_ratio"] is None and report["profile_predicted_ratio"] is None
    assert (tmp_path / "server-upstream.log").exists() and (tmp_path / "server-server.log").exists()


def test_ctrl_c_during_a_way_stops_its_server(bench, tmp_path, monkeypatch):
    pid_file = tmp_path / "child.pid"
    monkeypatch.setattr(bench, "server_spec", lambda setup: stub_spec("--child-pid-file", str(pid_file)))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run_upstream", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bench.three_ways(setup_for(bench, tmp_path, methods=("upstream",)))
    assert wait_gone(int(pid_file.read_text()))


def test_summary_names_a_way_with_missing_tokens_and_the_profile_error(bench, tmp_path):
    setup = setup_for(bench, tmp_path, methods=())
    upstream = bench.MethodResult("upstream", 10.0, 6, 24, 100, None, replies={(1, 1): "a", (1, 2): "b"})
    in_process = bench.MethodResult("in_process", 4.0, 6, 24, 100, 40, replies={(1, 1): "a", (1, 2): "c"})
    short = bench.MethodResult("server", 5.0, 5, 20, 90, None)
    report = bench.summarize(setup, [upstream, in_process, short], {"predicted_ratio": 2.0})
    assert report["checks"]["same_turns_and_tokens"] is False
    assert report["checks"]["problems"] == ["server: 5 turns and 20 output tokens, expected 6 and 24"]
    assert report["measured_ratio"] == 2.5 and report["profile_predicted_ratio"] == 2.0
    assert report["profile_relative_error"] == -0.2
    assert report["replies_differing_from_upstream"]["in_process"] == 0.5
    rows = {row["name"]: row for row in report["methods"]}
    assert rows["in_process"]["ratio_to_upstream"] == 2.5 and rows["in_process"]["prefix_cache_hit_rate"] == 0.4


def test_predicted_ratio_reads_the_threads_and_turn_synchronous_bounds(bench):
    profile = {
        "what_if": [
            {"name": "turn-synchronous", "bound_s": 2.0},
            {"name": "one session at a time", "bound_s": 9.0},
            {"name": "20 client threads", "bound_s": 3.0},
        ]
    }
    assert bench.predicted_ratio(profile, 20)["predicted_ratio"] == 1.5
    assert bench.predicted_ratio(profile, 8)["predicted_ratio"] is None  # no such what-if


def test_time_demo_splits_make_output_into_steps(monkeypatch):
    """kernels_bench/time_demo.py: each step runs from its marker line to the next step's (stamps made up)."""
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    import time_demo

    lines = [
        (0.0, "python3 -m venv .venv"),
        (1.0, ".venv/bin/python -m pip install -q torch==2.13.0"),
        (60.0, ".venv/bin/sysbench-gpu generate --data demo --model smollm2 --engine hf --out demo-run"),
        (62.0, "INFO converting SmolLM2.gguf to safetensors in /c/models (once; about 20 s)"),
        (80.0, "INFO generating 25 replies for 5 sessions (history=model)"),
        (130.0, ".venv/bin/sysbench-gpu judge demo-run --judge hf --judge-model smollm2"),
        (135.0, "INFO judge round 1: 22 prompt(s) at temperature 0.0"),
        (140.0, "INFO judge round 1: 3 prompt(s) at temperature 0.0"),
        (200.0, ".venv/bin/sysbench-gpu metrics demo-run"),
        (203.0, ".venv/bin/sysbench-gpu report demo-run --out demo-run/report"),
        (215.0, "<end>"),
    ]
    assert time_demo.split_steps(lines) == [
        ("install", 60.0),
        ("generate: start", 2.0),
        ("model conversion", 18.0),
        ("generate: replies", 50.0),
        ("judge start", 5.0),
        ("judging", 65.0),
        ("metrics", 3.0),
        ("report", 12.0),
    ]
