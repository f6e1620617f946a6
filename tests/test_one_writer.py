"""One writer per run directory, and kill-and-rerun probes: real CLI processes against the loopback stub.

Every test here starts `python -m sysbench_gpu` subprocesses (the stub answers
instantly), so the locks, the torn-tail handling and the ledger are exercised as a
user meets them: two processes at once, or SIGKILL at a seeded random moment.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from openai_stub import OpenAIStub, Reply
from test_judge_support import good_reply, make_run, marker

from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.judging.ledger import LEDGER

pytest.importorskip("openai")

REPO_ROOT = Path(__file__).resolve().parent.parent
KEY_ENV = "SYSBENCH_TEST_KEY"
KEY = "sk-test-one-writer-0123456789abcdef"
SEED = 20240817
SLOW_S = 0.08  # per stub reply in the kill probes, so a seeded kill lands while work is in flight


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "sysbench_gpu", *args]


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env[KEY_ENV] = KEY
    env.pop("OPENAI_BASE_URL", None)
    return env


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        cli_command(*args), env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def in_process(args: list[str]) -> int:
    """A reference run through the same CLI, inside the test process (no start-up cost)."""
    from sysbench_gpu import cli

    previous = os.environ.get(KEY_ENV)
    os.environ[KEY_ENV] = KEY
    try:
        return cli.main(args)
    finally:
        if previous is None:
            os.environ.pop(KEY_ENV, None)
        else:
            os.environ[KEY_ENV] = previous


def finish(process: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def generate_args(data: Path, out: Path, url: str, *extra: str) -> list[str]:
    return [
        "generate",
        "--data",
        str(data),
        "--engine",
        "openai",
        "--model",
        "stub-model",
        "--out",
        str(out),
        "--limit",
        "3",
        "--max-tokens",
        "16",
        "--no-progress",
        "--api-key-env",
        KEY_ENV,
        "--base-url",
        url,
        "--concurrency",
        "2",
        "--max-retries",
        "2",
        "--timeout",
        "10",
        *extra,
    ]


def judge_args(run: Path, url: str, *extra: str) -> list[str]:
    return [
        "judge",
        str(run),
        "--judge",
        "openai",
        "--judge-model",
        "gpt-4o-mini",
        "--base-url",
        url,
        "--api-key-env",
        KEY_ENV,
        "--max-retries",
        "2",
        "--api-retries",
        "2",
        "--timeout",
        "10",
        *extra,
    ]


def generation_reply(body: dict[str, Any]) -> Reply:
    """The same reply for the same conversation, whichever process or attempt asks."""
    messages = body["messages"]
    turn = sum(m["role"] == "user" for m in messages)
    digest = hashlib.sha1(json.dumps(messages, ensure_ascii=False).encode()).hexdigest()[:10]
    return Reply(text=f"turn {turn} reply {digest}", prompt_tokens=20 * turn, completion_tokens=4)


class JudgeReplies:
    """Good verdicts for every turn (否 on turn 5), by the marker of the turn judged."""

    def __init__(self, dataset) -> None:
        self.sessions = dataset.by_id()

    def __call__(self, body: dict[str, Any], n: int) -> Reply:
        _, sid, turn = marker(body["messages"][-1]["content"])
        text = good_reply(self.sessions[sid], turn, "否" if turn == 5 else "是")
        return Reply(text=text, prompt_tokens=1000, completion_tokens=50)


def line_keys(path: Path) -> list[tuple[int, int]]:
    """Every key in the file, one per complete line (duplicates kept)."""
    keys = []
    for line in path.read_bytes().split(b"\n")[:-1]:
        if line.strip():
            obj = json.loads(line)
            keys.append((obj["system_id"], obj["turn"]))
    return keys


def one_line_error(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, err
    assert "Traceback" not in err, err
    return lines[0]


class Gate:
    """Holds every stub reply until one of the processes has exited, so both really overlap."""

    def __init__(self) -> None:
        self.open = threading.Event()

    def watch(self, *processes: subprocess.Popen) -> threading.Thread:
        def wait_any() -> None:
            while not any(p.poll() is not None for p in processes):
                time.sleep(0.02)
            self.open.set()

        thread = threading.Thread(target=wait_any, daemon=True)
        thread.start()
        return thread

    def hold(self, responder):
        def held(body: dict[str, Any], n: int) -> Reply:
            self.open.wait(timeout=60)
            return responder(body, n)

        return held


# ---------------------------------------------------------------- two writers at once


def test_two_generates_on_one_out_leave_one_writer(tmp_path: Path, sessions_file: Path) -> None:
    out = tmp_path / "run"
    gate = Gate()
    with OpenAIStub(gate.hold(lambda body, n: generation_reply(body))) as stub:
        first = start(*generate_args(sessions_file, out, stub.base_url))
        second = start(*generate_args(sessions_file, out, stub.base_url))
        gate.watch(first, second)
        results = [finish(first), finish(second)]
        codes = sorted(code for code, _, _ in results)
        assert codes == [0, 2], results
        holder = first if results[0][0] == 0 else second
        line = one_line_error(next(err for code, _, err in results if code == 2))
        assert "another `generate`" in line and f"pid {holder.pid} on host" in line
        keys = line_keys(out / "generations.jsonl")
        assert len(keys) == len(set(keys)) == 15
        sent = stub.request_count
        assert sent == 15  # the refused process sent nothing
        # A rerun completes and adds nothing.
        code, out_text, err = finish(start(*generate_args(sessions_file, out, stub.base_url)))
        assert code == 0, err
        assert "15 records (0 new" in out_text and stub.request_count == sent
    assert not (out / ".generate.lock").exists()


def test_two_judges_on_one_run_leave_one_writer_and_an_exact_ledger(tmp_path: Path, dataset) -> None:
    run = make_run(tmp_path / "run", dataset, [1, 2, 3])
    gate = Gate()
    with OpenAIStub(gate.hold(JudgeReplies(dataset))) as stub:
        first = start(*judge_args(run.path, stub.base_url))
        second = start(*judge_args(run.path, stub.base_url))
        gate.watch(first, second)
        results = [finish(first), finish(second)]
        assert sorted(code for code, _, _ in results) == [0, 2], results
        line = one_line_error(next(err for code, _, err in results if code == 2))
        assert "another `judge`" in line and "pid " in line
        keys = line_keys(run.judgments.path)
        assert len(keys) == len(set(keys)) == 15
        ledger = json.loads((run.path / LEDGER).read_text())["models"]["gpt-4o-mini"]
        assert ledger["requests"] == stub.answered == stub.request_count == 15
        code, out_text, err = finish(start(*judge_args(run.path, stub.base_url)))
        assert code == 0 and "already judged 15" in out_text and "requests 0" in out_text, err
        assert stub.request_count == 15


# ---------------------------------------------------------------- kill and rerun


def _kill_after(process: subprocess.Popen, stub: OpenAIStub, requests: int, delay_s: float) -> None:
    """SIGKILL ``process`` ``delay_s`` after the stub has seen ``requests`` more requests (or when it ends)."""
    target = stub.request_count + requests
    deadline = time.monotonic() + 60
    while stub.request_count < target and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(delay_s)
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)


def test_generate_killed_at_seeded_moments_then_rerun_matches_an_uninterrupted_run(
    tmp_path: Path, sessions_file: Path
) -> None:
    rng = random.Random(SEED)
    reference, probed = tmp_path / "reference", tmp_path / "probed"

    def slow_reply(body: dict[str, Any], n: int) -> Reply:
        time.sleep(SLOW_S)
        return generation_reply(body)

    with OpenAIStub(slow_reply) as stub:
        assert in_process(generate_args(sessions_file, reference, stub.base_url)) == 0
        kills = 0
        for _ in range(3):
            process = start(*generate_args(sessions_file, probed, stub.base_url))
            _kill_after(process, stub, rng.randint(1, 8), rng.uniform(0.0, SLOW_S))
            kills += process.returncode == -signal.SIGKILL
            keys = line_keys(probed / "generations.jsonl") if (probed / "generations.jsonl").exists() else []
            assert len(keys) == len(set(keys))  # no duplicates, whatever the moment
        assert kills >= 2  # the probes really interrupted the work
        code, _, err = finish(start(*generate_args(sessions_file, probed, stub.base_url)))
        assert code == 0, err
    want = {k: r.response for k, r in RunDir(reference).generations.read().items()}
    got = {k: r.response for k, r in RunDir(probed).generations.read().items()}
    assert got == want and len(got) == 15
    keys = line_keys(probed / "generations.jsonl")
    assert len(keys) == len(set(keys)) == 15
    assert RunDir(probed).stage_section("generate")["status"] == "complete"


def _judged(run: RunDir) -> dict:
    return {k: (r.parse_status, {n: v.value for n, v in r.verdicts.items()}) for k, r in run.judgments.read().items()}


def test_judge_killed_at_seeded_moments_then_rerun_is_identical_and_counted_once(tmp_path: Path, dataset) -> None:
    rng = random.Random(SEED + 1)
    reference = make_run(tmp_path / "reference", dataset, [1, 2, 3])
    probed = make_run(tmp_path / "probed", dataset, [1, 2, 3])
    good = JudgeReplies(dataset)

    def responder(body: dict[str, Any], n: int) -> Reply:
        time.sleep(SLOW_S)
        return good(body, n)

    with OpenAIStub(responder) as stub:
        assert in_process(judge_args(reference.path, stub.base_url)) == 0
        answered_before = stub.answered
        kills = 0
        for _ in range(3):
            process = start(*judge_args(probed.path, stub.base_url, "--concurrency", "2"))
            _kill_after(process, stub, rng.randint(1, 8), rng.uniform(0.0, SLOW_S))
            kills += process.returncode == -signal.SIGKILL
            keys = line_keys(probed.judgments.path) if probed.judgments.path.exists() else []
            assert len(keys) == len(set(keys))
        assert kills >= 2
        code, _, err = finish(start(*judge_args(probed.path, stub.base_url, "--concurrency", "2")))
        assert code == 0, err
        answered = stub.answered - answered_before
    assert _judged(probed) == _judged(reference)
    keys = line_keys(probed.judgments.path)
    assert len(keys) == len(set(keys)) == 15
    ledger = json.loads((probed.path / LEDGER).read_text())["models"]["gpt-4o-mini"]
    # Never counted twice; at most the replies in flight at each kill (2 workers) went uncounted.
    assert answered - 2 * kills <= ledger["requests"] <= answered


def test_ledger_is_exact_when_killed_with_a_request_in_flight(tmp_path: Path, dataset) -> None:
    """The stub kills the judge while holding a request, at seeded request numbers: every reply the
    server finished sending is counted exactly once, however many kills and reruns."""
    rng = random.Random(SEED + 2)
    run = make_run(tmp_path / "run", dataset, [1, 2, 3])
    good = JudgeReplies(dataset)
    victim: dict[str, Any] = {"process": None, "kill_at": set()}

    def responder(body: dict[str, Any], n: int) -> Reply:
        if n in victim["kill_at"] and victim["process"] is not None:
            victim["process"].send_signal(signal.SIGKILL)
            return Reply(status=500)  # never received: the client is gone
        return good(body, n)

    with OpenAIStub(responder) as stub:
        victim["kill_at"] = set(rng.sample(range(2, 15), 4))
        rounds = 0
        while True:
            rounds += 1
            process = start(*judge_args(run.path, stub.base_url, "--concurrency", "1"))
            victim["process"] = process
            code, _, err = finish(process)
            if code == 0:
                break
            assert code == -signal.SIGKILL, err
            assert rounds < 10
        assert rounds == 5  # four kills, then a run to the end
        ledger = json.loads((run.path / LEDGER).read_text())["models"]["gpt-4o-mini"]
        assert ledger["requests"] == stub.answered == 15
        assert ledger["prompt_tokens"] == 1000 * 15
    keys = line_keys(run.judgments.path)
    assert len(keys) == len(set(keys)) == 15
