"""The head-to-head benchmark's server start and stop, and its bookkeeping, against a stub server.

No model runs here: a stub OpenAI-compatible server (tests/stub_server_process.py) stands in
for ``vllm serve`` and ``transformers serve``. No timing is asserted.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from sysbench_gpu.benchmarks.registry import load_dataset
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.engines import server as server_module
from sysbench_gpu.engines.server import (
    PORT_PLACEHOLDER,
    ManagedServer,
    ServerSpec,
    group_members,
    transformers_launcher,
    transformers_server_spec,
    vllm_launcher,
    vllm_server_spec,
)

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
        assert group_members(pid) == sorted([pid, child])
    # The stop returned only once its whole group was gone: nothing to wait for here.
    assert group_members(pid) == [] and not alive(pid) and not alive(child)
    assert server.stop_signal == "SIGINT" and server.release_problem is None
    assert server.stop() == server.returncode  # idempotent


def test_stop_returns_only_once_the_group_is_gone(tmp_path, monkeypatch):
    """Workers that outlive the server's main process (vLLM's engine core) are waited for, up to a limit."""
    server = ManagedServer(stub_spec(), tmp_path / "server.log", release_timeout_s=5.0)
    server.start()
    lingering = iter([[4242, 4243], [4243], []])
    looks = []

    def members(group):
        looks.append(group)
        return next(lingering)

    monkeypatch.setattr(server_module, "group_members", members)
    monkeypatch.setattr(server_module.time, "sleep", lambda s: None)
    server.stop()
    assert looks == [server.pid] * 3 and server.release_problem is None
    # Still there when the time is up: one line naming them, and the stop returns.
    server.start()
    monkeypatch.setattr(server_module, "group_members", lambda group: [4242])
    server._clock = FakeClock()
    server.stop()
    assert server.release_problem == (
        "1 process(es) of its group (pid 4242) still running 5 s after the stop; the next server may find them "
        "holding memory"
    )


def test_group_members_reads_proc_and_leaves_out_zombies(tmp_path):
    proc = tmp_path / "proc"
    for pid, line in {
        "10": "10 (python3) S 1 10 10 0",
        "11": "11 (vllm (engine) core) R 10 10 10 0",  # spaces and parentheses in the name
        "12": "12 (worker) Z 10 10 10 0",  # ended, not yet reaped: holds no memory
        "13": "13 (other) S 1 13 13 0",
    }.items():
        (proc / pid).mkdir(parents=True)
        (proc / pid / "stat").write_text(line)
    (proc / "self").mkdir()
    assert group_members(10, proc) == [10, 11]
    assert group_members(99, proc) == []


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_stop_waits_until_the_gpus_free_memory_is_back(tmp_path, monkeypatch):
    readings = iter([{"0": 40 << 30}, {"0": 10 << 30}, {"0": 12 << 30}, {"0": 40 << 30}])
    seen = []

    def probe():
        seen.append(next(readings))
        return seen[-1]

    server = ManagedServer(stub_spec(), tmp_path / "server.log", device_memory=probe)
    with server:
        monkeypatch.setattr(server_module.time, "sleep", lambda s: None)
    assert len(seen) == 4 and server.release_problem is None  # read before the start, then until it was back


def test_stop_gives_up_on_gpu_memory_with_one_line(tmp_path, monkeypatch, caplog):
    readings = iter([{"0": 40 << 30}])
    server = ManagedServer(
        stub_spec(),
        tmp_path / "server.log",
        device_memory=lambda: next(readings, {"0": 30 << 30}),
        release_timeout_s=5.0,
    )
    server.start()
    monkeypatch.setattr(server_module.time, "sleep", lambda s: None)
    server._clock = FakeClock()  # the wait gives up after 5 ticks instead of 5 s
    server.stop()
    problem = server.release_problem
    assert problem and "\n" not in problem
    assert "GPU memory not back 5 s after the stop (GPU 0: 10.0 GiB less free than before the start)" in problem
    assert problem in caplog.text


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


def test_dtype_and_budget_reach_the_vllm_server_command(monkeypatch):
    monkeypatch.setattr(server_module, "vllm_launcher", lambda model: ["vllm", "serve", model])
    command = vllm_server_spec(
        "/models/m",
        "bench-model",
        dtype="bfloat16",
        max_num_batched_tokens=2048,
        max_num_seqs=128,
        kv_cache_memory_bytes=1 << 30,
    ).command(1234)
    flags = {command[i]: command[i + 1] for i in range(len(command) - 1) if command[i].startswith("--")}
    assert flags["--dtype"] == "bfloat16" and flags["--max-num-batched-tokens"] == "2048"
    assert flags["--max-num-seqs"] == "128" and flags["--kv-cache-memory-bytes"] == str(1 << 30)
    assert "--dtype" not in vllm_server_spec("/models/m", "bench-model").command(1234)


def _script(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_vllm_is_found_beside_the_interpreter_else_on_path_inside_this_environment_else_as_a_module(tmp_path):
    env = tmp_path / "env"
    python = str(env / "bin" / "python")
    module = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", "M"]

    def launcher(which, installed=True):
        return vllm_launcher("M", executable=python, prefix=str(env), which=which, distribution_installed=installed)

    # No script anywhere: this interpreter runs the server module.
    assert launcher(lambda name: None) == module
    # On PATH but in another environment: not ours, so the module of this one.
    elsewhere = _script(tmp_path / "other-env" / "bin" / "vllm")
    assert launcher(lambda name: str(elsewhere)) == module
    # On PATH inside this environment (e.g. a Scripts folder apart from the interpreter's).
    inside = _script(env / "Scripts" / "vllm")
    assert launcher(lambda name: str(inside)) == [str(inside), "serve", "M"]
    # Beside the interpreter: that one, whatever PATH says.
    beside = _script(env / "bin" / "vllm")
    assert launcher(lambda name: str(elsewhere)) == [str(beside), "serve", "M"]
    # The CPU build (no `vllm` distribution): its script cannot run, the module can.
    assert launcher(lambda name: str(beside), installed=False) == module


def test_transformers_is_found_in_this_environment_else_run_as_its_module(tmp_path):
    """The same rule as vllm's: a `transformers` on PATH from another environment is not used."""
    env = tmp_path / "env"
    python = str(env / "bin" / "python")
    module = [python, "-m", "transformers.cli.transformers"]

    def launcher(which):
        return transformers_launcher(executable=python, prefix=str(env), which=which)

    assert launcher(lambda name: None) == module
    elsewhere = _script(tmp_path / "other-env" / "bin" / "transformers")
    assert launcher(lambda name: str(elsewhere)) == module
    beside = _script(env / "bin" / "transformers")
    assert launcher(lambda name: str(elsewhere)) == [str(beside)]


def test_transformers_serve_preloads_the_model_with_continuous_batching():
    spec = transformers_server_spec("/models/m", device="cpu", dtype="float32")
    command = spec.command(1234)
    assert command[1:3] == ["serve", "/models/m"]
    assert "--continuous-batching" in command and command[command.index("--port") + 1] == "1234"
    assert spec.served_model == "/models/m" and spec.ready_path == "/health"


# ------------------------------------------------------------------ bookkeeping


def test_default_data_gives_distinct_sessions_offline(bench, tmp_path):
    """No SysBench file where auto looks: the demo set, made distinct, still gives N distinct sessions."""
    written = bench.write_sessions("auto", 12, 2, tmp_path / "sessions.json", candidates=[tmp_path / "absent.json"])
    assert written.data["source"] == "demo" and written.data["tagged"] is True
    assert written.distinct == len(written.sessions) == 12
    assert [s.system_id for s in written.sessions] == list(range(1, 13))
    assert all(len(s.turns) == 2 for s in written.sessions)
    assert [s.system_id for s in load_dataset(str(tmp_path / "sessions.json")).sessions] == list(range(1, 13))


def test_sysbench_sessions_are_used_where_found(bench, tmp_path):
    demo = json.loads((bench.REPO_ROOT / "sysbench_gpu" / "demo" / "demo_sessions.json").read_text(encoding="utf-8"))
    found = tmp_path / "shared" / "sessions.json"
    found.parent.mkdir()
    found.write_text(json.dumps([dict(e, system_id=100 + i) for i, e in enumerate(demo)]), encoding="utf-8")
    written = bench.write_sessions("auto", 4, 2, tmp_path / "sessions.json", candidates=[tmp_path / "x", found])
    assert written.data["source"] == "sysbench" and written.data["file"] == str(found)
    assert written.data["tagged"] is False and written.distinct == 4  # distinct as they are: nothing added
    assert sorted(written.data["source_system_ids"]) == sorted(set(written.data["source_system_ids"]))
    originals = {e["system_prompt"] for e in demo}
    assert {s.system_prompt for s in written.sessions} <= originals


def test_demo_copies_differ_from_their_first_token(bench, tmp_path):
    written = bench.write_sessions("demo", 23, 2, tmp_path / "sessions.json")
    prompts = [s.system_prompt for s in written.sessions]
    originals = {s.system_prompt for s in load_dataset("demo").sessions}
    assert len(set(prompts)) == 23
    for session in written.sessions:
        tag = f"{session.system_id}: "
        # The session's own number comes first, so two copies of one demo session part at once.
        assert session.system_prompt.startswith(tag) and session.system_prompt[len(tag) :] in originals
    for a in prompts:
        for b in prompts:
            if a != b:
                assert len(os.path.commonprefix([a, b])) < len("23: ")
    raw = json.loads((tmp_path / "sessions.json").read_text(encoding="utf-8"))
    assert all(entry["messages"][0]["content"] == entry["system_prompt"] for entry in raw)


def test_the_shuffle_is_fixed_by_the_seed(bench, tmp_path):
    def order(seed):
        return bench.write_sessions("demo", 5, 2, tmp_path / f"s{seed}.json", seed=seed).data["source_system_ids"]

    assert order(3) == order(3)
    assert sorted(order(3)) == sorted(order(4))  # the same sessions ...
    assert any(order(seed) != order(3) for seed in range(4, 10))  # ... in another order


def test_forced_length_fields_per_server(bench):
    assert bench.forced_length_body("vllm", 16) == {"ignore_eos": True}
    config = json.loads(bench.forced_length_body("hf", 16)["generation_config"])
    assert config == {"max_new_tokens": 16, "min_new_tokens": 16, "do_sample": False}


BUDGET_FLAGS = ("--max-num-batched-tokens", "--max-num-seqs", "--kv-cache-memory-bytes", "--dtype")


def setup_for(bench, tmp_path, engine="vllm", sessions=3, turns=2, max_tokens=4, methods=("upstream", "server")):
    data = tmp_path / "sessions.json"
    written = bench.write_sessions("demo", sessions, turns, data)
    return bench.Setup(
        engine=engine,
        model="stub-model",
        model_path="stub-model",
        sessions=written.sessions,
        data=written.data,
        data_file=data,
        turns=turns,
        max_tokens=max_tokens,
        threads=2,
        server_concurrency=sessions,
        work_dir=tmp_path,
        methods=methods,
        # hf: no KV size, which transformers serve would get in blocks of the (here missing) model's layers.
        budget=bench.Budget(2048, 128, 1 << 30, "bfloat16", {})
        if engine == "vllm"
        else bench.Budget(2048, 128, None, "float32", {}),
    )


def stub_for_vllm(bench, *flags):
    """The stub in place of vllm serve, given the budget flags of the real server command (it logs them as vLLM)."""
    real = bench.server_spec

    def spec(setup):
        command = real(setup).command(0)
        budget = [part for i, part in enumerate(command) if part in BUDGET_FLAGS or command[i - 1] in BUDGET_FLAGS]
        return stub_spec("--vllm-log", *flags, *budget)

    return spec


@pytest.mark.parametrize("engine", ["vllm", "hf"])
def test_upstream_and_server_ways_against_a_stub_count_the_same_turns_and_tokens(bench, tmp_path, monkeypatch, engine):
    monkeypatch.setattr(bench, "server_spec", lambda setup: stub_spec("--cached"))
    setup = setup_for(bench, tmp_path, engine=engine)
    results = bench.three_ways(setup)
    assert [r.name for r in results] == ["upstream", "server"]
    report = bench.summarize(setup, results, None)
    assert report["checks"]["same_turns_and_tokens"] is True and report["checks"]["problems"] == []
    assert report["sessions"] == report["distinct_sessions"] == 3 and report["threads"] == 2
    assert report["timed"] == "first request to last reply" and report["data"]["source"] == "demo"
    rows = {row["name"]: row for row in report["methods"]}
    for row in rows.values():
        assert row["turns"] == 6 and row["output_tokens"] == 6 * 4
        assert set(row) >= {"name", "wall_s", "output_tokens", "turns", "ratio_to_upstream", "engine_settings"}
        assert row["timed"] == "first request to last reply"
    # (c)'s wall clock is generate's whole loop: its engine calls are a part of it.
    assert rows["server"]["engine_calls_s"] <= rows["server"]["wall_s"]
    stats = json.loads((tmp_path / "run-server" / "stats.json").read_text(encoding="utf-8"))
    assert stats["generation_loop"]["calls"] == 2 and stats["generation_loop"]["wall_s"] == rows["server"]["wall_s"]
    assert rows["upstream"]["ratio_to_upstream"] == 1.0
    # Both sent the same conversations (each way on its own history), so the stub's cache
    # accounting (turn 2 reuses turn 1's prompt) gives both the same hit rate.
    assert rows["upstream"]["prefix_cache_hit_rate"] == rows["server"]["prefix_cache_hit_rate"] > 0
    assert report["replies_differing_from_upstream"] == {"server": 0.0}
    assert report["measured_ratio"] is None and report["profile_predicted_ratio"] is None
    assert (tmp_path / "server-upstream.log").exists() and (tmp_path / "server-server.log").exists()


def test_engine_settings_are_read_back_and_equal_across_the_three_ways(bench, tmp_path, monkeypatch):
    """(a) and (c) read their server's log, (b) the engine's resolved config in generate's manifest."""
    monkeypatch.setattr(bench, "server_spec", stub_for_vllm(bench, "--cached"))
    setup = setup_for(bench, tmp_path)
    results = bench.three_ways(setup)
    # (b) as generate records it: vLLM's resolved vllm_config, read from the engine.
    manifest = {"stages": {"generate": {"engine_describe": {"engine_config": {
        "max_num_batched_tokens": 2048, "max_num_seqs": 128, "dtype": "torch.bfloat16",
        "enable_prefix_caching": True, "kv_cache_memory_bytes": 1 << 30, "kv_cache_size_tokens": (1 << 30) // 23040,
        "num_gpu_blocks": 364, "block_size": 128,
    }}}}}  # fmt: skip
    in_process = bench.MethodResult("in_process", 1.0, 6, 24, 100, None)
    in_process.engine_settings, in_process.engine_settings_source = bench.h2h_settings.vllm_engine_settings(manifest)
    report = bench.summarize(setup, [results[0], in_process, results[1]], None)
    assert report["checks"]["same_engine_settings"] is True and report["checks"]["engine_settings_differ"] == {}
    expected = {
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 128,
        "dtype": "bfloat16",
        "enable_prefix_caching": True,
        "kv_cache_memory_bytes": 1 << 30,
        "kv_cache_size_tokens": (1 << 30) // 23040,
    }
    for row in report["methods"]:
        assert row["engine_settings"] == expected
        assert set(row["engine_settings_source"]) == set(expected)
    sources = {row["name"]: row["engine_settings_source"] for row in report["methods"]}
    assert sources["upstream"]["max_num_seqs"].startswith("server log")
    assert sources["in_process"]["max_num_seqs"].startswith("engine")
    assert report["settings"]["max_num_batched_tokens"] == 2048 and report["settings"]["max_num_seqs"] == 128
    # (b) is given the same budget on its command line.
    arguments = bench.in_process_arguments(setup)
    given = {arguments[i]: arguments[i + 1] for i in range(len(arguments) - 1) if arguments[i] in BUDGET_FLAGS}
    assert given == {
        "--max-num-batched-tokens": "2048",
        "--max-num-seqs": "128",
        "--kv-cache-memory-bytes": str(1 << 30),
        "--dtype": "bfloat16",
    }


def test_a_setting_that_differs_between_ways_is_named(bench, tmp_path):
    setup = setup_for(bench, tmp_path, methods=())
    ways = [bench.MethodResult(name, 1.0, 6, 24, 100, None) for name in ("upstream", "in_process")]
    ways[0].engine_settings = {"max_num_batched_tokens": 2048, "max_num_seqs": 128}
    ways[1].engine_settings = {"max_num_batched_tokens": 4096, "max_num_seqs": 128}
    checks = bench.summarize(setup, ways, None)["checks"]
    assert checks["same_engine_settings"] is False
    assert checks["engine_settings_differ"] == {"max_num_batched_tokens": {"upstream": 2048, "in_process": 4096}}


def test_vllm_servers_log_and_metrics_are_read(bench):
    """Lines as vLLM 0.32's CPU build printed them here, and its /metrics cache-config sample."""
    log = (
        "(APIServer pid=11689) INFO 11-26 13:26:39 [api_utils.py:286] non-default args: {'enable_prompt_tokens_details'"
        ": True, 'served_model_name': ['bench-model'], 'kv_cache_memory_bytes': 1073741824, 'enable_prefix_caching': "
        "True, 'max_num_batched_tokens': 2048, 'max_num_seqs': 128}\n"
        "(EngineCore pid=12149) INFO 11-26 13:26:56 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: "
        "model='/m', dtype=torch.bfloat16, max_seq_len=8192, enable_prefix_caching=True, enable_chunked_prefill=True\n"
        "(EngineCore pid=14481) INFO 11-26 13:31:35 [kv_cache_utils.py:2327] CPU KV cache size: 46,592 tokens, "
        "Maximum concurrency for 8,192 tokens per request: 5.69x\n"
    )
    metrics = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="128",enable_prefix_caching="True",engine="0",'
        'kv_cache_memory_bytes="1073741824",kv_cache_size_tokens="46592",num_gpu_blocks="364"} 1.0\n'
    )
    from h2h_settings import CACHE_INFO, vllm_server_settings

    values, sources = vllm_server_settings(log, metrics)
    assert values == {
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 128,
        "dtype": "bfloat16",
        "enable_prefix_caching": True,
        "kv_cache_memory_bytes": 1073741824,
        "kv_cache_size_tokens": 46592,
    }
    assert sources["kv_cache_memory_bytes"] == CACHE_INFO and sources["dtype"].startswith("server log")
    unreported, why = vllm_server_settings("", None)
    assert set(unreported.values()) == {None} and set(why.values()) == {"not reported"}


def test_fewer_than_ten_sessions_per_thread_is_a_warning_not_a_refusal(bench, tmp_path, capsys):
    setup = setup_for(bench, tmp_path, methods=())
    report = bench.summarize(setup, [], None)
    assert report["publishable"] is False and report["sessions_per_thread"] == 1.5
    assert report["warnings"] == [bench.publish_warning(3, 2)] and "do not publish" in report["warnings"][0]
    assert bench.publish_warning(200, 20) is None
    bench.print_report(report)
    assert "do not publish" in capsys.readouterr().out


def test_ctrl_c_during_upstream_stops_the_server_without_waiting_for_the_sessions(bench, tmp_path, monkeypatch):
    """Replies that would take two minutes: Ctrl-C while they are in flight ends the way and its server at once."""
    requests_file = tmp_path / "requests"
    monkeypatch.setattr(
        bench, "server_spec", lambda setup: stub_spec("--delay", "120", "--requests-file", str(requests_file))
    )
    main = threading.get_ident()

    def interrupt_once_requests_are_in_flight():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (requests_file.exists() and requests_file.read_text().strip()):
            time.sleep(0.05)
        signal.pthread_kill(main, signal.SIGINT)

    interrupter = threading.Thread(target=interrupt_once_requests_are_in_flight, daemon=True)
    servers = []
    real = bench.ManagedServer

    def recording(*args, **kwargs):
        servers.append(real(*args, **kwargs))
        return servers[-1]

    monkeypatch.setattr(bench, "ManagedServer", recording)
    interrupter.start()
    with pytest.raises(KeyboardInterrupt):
        bench.three_ways(setup_for(bench, tmp_path, sessions=4, methods=("upstream",)))
    interrupter.join()
    (server,) = servers
    # The replies were never sent (each would take 120 s); the server and its group are gone.
    assert server.process is None and group_members(server.pid) == []
    assert requests_file.read_text().split()  # the requests had been in flight


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
    assert bench.token_problems(setup, [upstream, in_process, short]) == report["checks"]["problems"]
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
