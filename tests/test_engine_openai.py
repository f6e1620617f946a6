"""The openai engine against the loopback stub, and the retry policy with a fake clock."""

from __future__ import annotations

import logging
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from openai_stub import OpenAIStub, Reply

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.engines.base import SamplingSpec
from sysbench_gpu.engines.retry import (
    NotRetryable,
    RetriesExhausted,
    Retryable,
    RetryCounter,
    RetryPolicy,
    call_with_retries,
    parse_retry_after,
)

pytest.importorskip("openai")

SECRET = "sk-test-DO-NOT-LEAK-1234567890"


class FakeClock:
    """Records sleeps instead of sleeping."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


def last_user(body: dict[str, Any]) -> str:
    return [m for m in body["messages"] if m["role"] == "user"][-1]["content"]


def echo(body: dict[str, Any], n: int) -> Reply:
    return Reply(text=f"echo:{last_user(body)}")


def make_engine(stub: OpenAIStub, monkeypatch: pytest.MonkeyPatch, **options: Any):
    from sysbench_gpu.engines import get_engine

    monkeypatch.setenv("SYSBENCH_TEST_KEY", SECRET)
    defaults: dict[str, Any] = dict(
        model="stub-model",
        base_url=stub.base_url,
        api_key_env="SYSBENCH_TEST_KEY",
        concurrency=4,
        max_retries=3,
        timeout=5.0,
        backoff_base_s=0.01,
        backoff_max_s=0.05,
    )
    defaults.update(options)
    return get_engine("openai", **defaults)


def conversations(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "system", "content": "be brief"}, {"role": "user", "content": f"q{i}"}] for i in range(n)]


# --- retry policy (pure, fake clock) -----------------------------------------


def test_backoff_grows_exponentially_and_is_capped() -> None:
    policy = RetryPolicy(max_retries=10, base_delay_s=1.0, multiplier=2.0, max_delay_s=8.0, jitter=0.0)
    rng = random.Random(0)
    assert [policy.backoff_s(n, rng) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_jitter_stays_within_bounds() -> None:
    policy = RetryPolicy(base_delay_s=4.0, max_delay_s=100.0, jitter=0.5)
    rng = random.Random(1)
    delays = [policy.backoff_s(1, rng) for _ in range(200)]
    assert all(2.0 <= d <= 4.0 for d in delays)
    assert max(delays) - min(delays) > 1.0  # really random, not constant


def test_retry_after_is_honoured_up_to_its_cap() -> None:
    policy = RetryPolicy(base_delay_s=0.1, jitter=0.0, max_retry_after_s=10.0)
    rng = random.Random(0)
    assert policy.delay_s(1, 3.0, rng) == 3.0
    assert policy.delay_s(1, 3600.0, rng) == 10.0
    assert policy.delay_s(1, None, rng) == 0.1


def test_parse_retry_after_forms() -> None:
    assert parse_retry_after({"Retry-After": "7"}) == 7.0
    assert parse_retry_after({"retry-after-ms": "250"}) == 0.25
    date = "Wed, 21 Oct 2015 07:28:10 GMT"
    from email.utils import parsedate_to_datetime

    now = parsedate_to_datetime(date).timestamp() - 5
    assert parse_retry_after({"Retry-After": date}, now=lambda: now) == pytest.approx(5.0)
    assert parse_retry_after({"Retry-After": "soon"}) is None
    assert parse_retry_after({}) is None


def test_call_with_retries_sleeps_then_succeeds_with_fake_clock() -> None:
    clock, counter = FakeClock(), RetryCounter()
    failures = iter([Retryable("429", 2.0), Retryable("500")])

    class Transient(Exception):
        def __init__(self, verdict: Retryable) -> None:
            self.verdict = verdict

    def operation() -> str:
        verdict = next(failures, None)
        if verdict is not None:
            raise Transient(verdict)
        return "ok"

    policy = RetryPolicy(max_retries=5, base_delay_s=1.0, jitter=0.0)
    value, attempts, reasons = call_with_retries(
        operation,
        policy=policy,
        classify=lambda e: getattr(e, "verdict", None),
        label="session 3, turn 2",
        clock=clock,
        counter=counter,
    )
    assert (value, attempts, reasons) == ("ok", 3, ["429", "500"])
    assert clock.sleeps == [2.0, 2.0]  # Retry-After 2 s beats backoff 1 s; then backoff 2 s
    assert counter.snapshot() == {
        "requests": 1,
        "attempts": 3,
        "retries": 2,
        "retries_by_reason": {"429": 1, "500": 1},
        "failures": 0,
    }


def test_call_with_retries_gives_up_with_a_clear_error() -> None:
    clock = FakeClock()

    def operation() -> None:
        raise TimeoutError("read timed out")

    policy = RetryPolicy(max_retries=2, base_delay_s=1.0, jitter=0.0)
    with pytest.raises(RetriesExhausted) as caught:
        call_with_retries(
            operation, policy=policy, classify=lambda e: Retryable("timeout"), label="session 7, turn 4", clock=clock
        )
    message = str(caught.value)
    assert "session 7, turn 4" in message and "3 attempts" in message and "read timed out" in message
    assert isinstance(caught.value, SysbenchError)
    assert clock.sleeps == [1.0, 2.0]


def test_call_with_retries_does_not_retry_a_permanent_error() -> None:
    clock, calls = FakeClock(), []

    def operation() -> None:
        calls.append(1)
        raise ValueError("bad request")

    with pytest.raises(NotRetryable, match="bad request"):
        call_with_retries(operation, policy=RetryPolicy(), classify=lambda e: None, label="x", clock=clock)
    assert calls == [1] and clock.sleeps == []


# --- the engine against the stub ----------------------------------------------


def test_batch_comes_back_in_input_order_with_usage(monkeypatch: pytest.MonkeyPatch) -> None:
    def responder(body: dict[str, Any], n: int) -> Reply:
        index = int(last_user(body)[1:])
        time.sleep(0.02 * (5 - index % 5))  # later requests finish first
        return Reply(text=f"echo:q{index}", prompt_tokens=100 + index, completion_tokens=index + 1)

    with OpenAIStub(responder) as stub:
        engine = make_engine(stub, monkeypatch)
        completions = engine.chat(conversations(10), SamplingSpec())
        engine.close()
    assert [c.text for c in completions] == [f"echo:q{i}" for i in range(10)]
    assert [c.prompt_tokens for c in completions] == [100 + i for i in range(10)]
    assert [c.output_tokens for c in completions] == [i + 1 for i in range(10)]
    assert all(c.finish_reason == "stop" for c in completions)
    assert stub.requests[0]["messages"][0] == {"role": "system", "content": "be brief"}
    assert stub.requests[0]["model"] == "stub-model"


def test_429_then_success_honours_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    def responder(body: dict[str, Any], n: int) -> Reply:
        if n == 1:
            return Reply(status=429, headers={"Retry-After": "0.2"})
        return echo(body, n)

    with OpenAIStub(responder) as stub:
        engine = make_engine(stub, monkeypatch)
        started = time.monotonic()
        completion = engine.chat_one(
            [{"role": "user", "content": "hi"}], SamplingSpec(), request_id="session 1, turn 1"
        )
        elapsed = time.monotonic() - started
    assert completion.text == "echo:hi"
    assert completion.extra["attempts"] == 2 and completion.extra["retry_reasons"] == ["429"]
    assert elapsed >= 0.2  # waited as the server asked, not the 0.01 s backoff
    assert stub.request_count == 2
    assert engine.describe()["retries"]["retries_by_reason"] == {"429": 1}


def test_500s_are_retried_within_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    failed_once: set[str] = set()
    lock = threading.Lock()

    def responder(body: dict[str, Any], n: int) -> Reply:
        question = last_user(body)
        with lock:
            first = question not in failed_once
            failed_once.add(question)
        return Reply(status=500 if first else 200, text=f"echo:{question}")

    with OpenAIStub(responder) as stub:
        engine = make_engine(stub, monkeypatch)
        completions = engine.chat(conversations(6), SamplingSpec())
    assert [c.text for c in completions] == [f"echo:q{i}" for i in range(6)]
    assert stub.request_count == 12
    stats = engine.describe()["retries"]
    assert stats["retries_by_reason"] == {"500": 6} and stats["failures"] == 0


def test_client_timeout_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    def responder(body: dict[str, Any], n: int) -> Reply:
        return Reply(text="late", delay_s=1.0) if n == 1 else Reply(text="on time")

    with OpenAIStub(responder) as stub:
        engine = make_engine(stub, monkeypatch, timeout=0.3)
        completion = engine.chat_one([{"role": "user", "content": "hi"}], SamplingSpec())
    assert completion.text == "on time"
    assert completion.extra["retry_reasons"] == ["timeout"]


def test_retries_exhausted_names_the_request_and_last_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with OpenAIStub(lambda body, n: Reply(status=503)) as stub:
        engine = make_engine(stub, monkeypatch, max_retries=2)
        with pytest.raises(SysbenchError) as caught:
            engine.chat(conversations(1), SamplingSpec(), request_ids=["session 42, turn 5"])
    message = str(caught.value)
    assert "session 42, turn 5" in message and "3 attempts" in message and "503" in message
    assert stub.request_count == 3  # 1 + max_retries: the client library adds none of its own


def test_permanent_error_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    with OpenAIStub(lambda body, n: Reply(status=401)) as stub:
        engine = make_engine(stub, monkeypatch)
        with pytest.raises(SysbenchError, match="without retry"):
            engine.chat_one([{"role": "user", "content": "hi"}], SamplingSpec(), request_id="session 1, turn 1")
    assert stub.request_count == 1


def test_concurrency_bound_is_respected(monkeypatch: pytest.MonkeyPatch) -> None:
    lock = threading.Lock()
    state = {"now": 0, "peak": 0}

    def responder(body: dict[str, Any], n: int) -> Reply:
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        time.sleep(0.05)
        with lock:
            state["now"] -= 1
        return echo(body, n)

    with OpenAIStub(responder) as stub:
        engine = make_engine(stub, monkeypatch, concurrency=3)
        engine.chat(conversations(12), SamplingSpec())
    assert state["peak"] == 3  # reached, never exceeded


def test_sampling_params_sent_only_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    with OpenAIStub(echo) as stub:
        engine = make_engine(stub, monkeypatch)
        engine.chat_one([{"role": "user", "content": "a"}], SamplingSpec())
        engine.chat_one(
            [{"role": "user", "content": "b"}],
            SamplingSpec(
                max_tokens=32,
                temperature=0.0,
                top_p=0.9,
                top_k=5,
                repetition_penalty=1.1,
                seed=7,
                json_schema={"type": "object"},
            ),
        )
    plain, full = stub.requests
    for key in ("max_tokens", "temperature", "top_p", "seed", "top_k", "repetition_penalty", "response_format"):
        assert key not in plain
    assert (full["max_tokens"], full["temperature"], full["top_p"], full["seed"]) == (32, 0.0, 0.9, 7)
    assert (full["top_k"], full["repetition_penalty"]) == (5, 1.1)
    assert full["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert engine.describe()["seed_accepted"] is True


def test_ignore_eos_and_extra_body_reach_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """--ignore-eos sends vLLM's field; --extra-body adds a server's own fields to every request."""
    config = '{"max_new_tokens": 8, "min_new_tokens": 8}'
    with OpenAIStub(echo) as stub:
        engine = make_engine(stub, monkeypatch, extra_body={"generation_config": config})
        engine.chat_one([{"role": "user", "content": "a"}], SamplingSpec(max_tokens=8, ignore_eos=True))
        engine.chat_one([{"role": "user", "content": "b"}], SamplingSpec(max_tokens=8, top_k=3))
    forced, plain = stub.requests
    assert forced["ignore_eos"] is True and forced["generation_config"] == config
    assert "ignore_eos" not in plain and (plain["generation_config"], plain["top_k"]) == (config, 3)
    assert engine.describe()["extra_body"] == {"generation_config": config}


def test_extra_body_flag_must_be_a_json_object() -> None:
    import argparse

    from sysbench_gpu.generation.cli import json_object, sampling_from_args

    assert json_object('{"min_tokens": 4}') == {"min_tokens": 4}
    for text, message in (
        ("[1]", "--extra-body: expected a JSON object, found an array"),
        ("null", "--extra-body: expected a JSON object, found null"),
        ("{min", "--extra-body: not JSON"),
        ('{"messages": []}', "--extra-body: field 'messages' is one the tool sets itself"),
    ):
        with pytest.raises(SysbenchError, match=message):
            json_object(text)
    flags = dict(max_tokens=4, temperature=None, top_p=None, top_k=None, repetition_penalty=None, seed=None)
    assert sampling_from_args(argparse.Namespace(**flags, ignore_eos=True)).ignore_eos is True
    assert "ignore_eos" not in sampling_from_args(argparse.Namespace(**flags, ignore_eos=False)).explicit()


def test_server_rejecting_seed_falls_back_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with OpenAIStub(echo) as stub:
        engine = make_engine(stub, monkeypatch)
        send = engine._client.chat.completions.create

        def create(**kwargs: Any) -> Any:
            # A server that refuses the parameter answers 400 and names it.
            if "seed" in kwargs:
                raise engine._openai.BadRequestError(
                    "Unrecognized request argument supplied: seed", response=_response(400), body=None
                )
            return send(**kwargs)

        monkeypatch.setattr(engine._client.chat.completions, "create", create)
        first = engine.chat_one([{"role": "user", "content": "a"}], SamplingSpec(seed=3))
        second = engine.chat_one([{"role": "user", "content": "b"}], SamplingSpec(seed=3))
    assert (first.text, second.text) == ("echo:a", "echo:b")
    assert stub.request_count == 2 and all("seed" not in body for body in stub.requests)
    assert engine.describe()["seed_accepted"] is False


def _response(status: int) -> Any:
    # The HTTP library under the installed openai client (httpx, or httpx2 in newer releases).
    try:
        import httpx2 as http
    except ImportError:
        import httpx as http

    return http.Response(status, request=http.Request("POST", "http://127.0.0.1/v1/chat/completions"))


def test_api_key_never_in_describe_logs_or_errors(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)

    def responder(body: dict[str, Any], n: int) -> Reply:
        return Reply(status=429) if n == 1 or last_user(body) == "fail" else echo(body, n)

    with OpenAIStub(responder) as stub:
        engine = make_engine(stub, monkeypatch, max_retries=1)
        engine.chat_one([{"role": "user", "content": "hi"}], SamplingSpec())
        with pytest.raises(SysbenchError) as caught:
            engine.chat_one([{"role": "user", "content": "fail"}], SamplingSpec())
        described = engine.describe()
    assert described["api_key_env"] == "SYSBENCH_TEST_KEY"
    assert SECRET not in repr(described)
    assert "retrying" in caplog.text and SECRET not in caplog.text
    assert SECRET not in str(caught.value)


def test_missing_key_without_base_url_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from sysbench_gpu.engines.openai_engine import OpenAIEngine

    monkeypatch.delenv("SYSBENCH_ABSENT_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(SysbenchError, match="SYSBENCH_ABSENT_KEY"):
        OpenAIEngine("gpt-4o", api_key_env="SYSBENCH_ABSENT_KEY")


def test_local_server_needs_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from sysbench_gpu.engines.openai_engine import OpenAIEngine

    monkeypatch.delenv("SYSBENCH_ABSENT_KEY", raising=False)
    with OpenAIStub(echo) as stub:
        engine = OpenAIEngine("local", base_url=stub.base_url, api_key_env="SYSBENCH_ABSENT_KEY")
        assert engine.chat_one([{"role": "user", "content": "hi"}], SamplingSpec()).text == "echo:hi"
        assert engine.context_length() is None and engine.count_prompt_tokens([]) is None
        assert engine.supports_system_role() and engine.is_primary


def test_base_url_credentials_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    from sysbench_gpu.engines.openai_engine import OpenAIEngine

    engine = OpenAIEngine("m", base_url="http://user:pw@127.0.0.1:9/v1?key=abc", api_key_env="SYSBENCH_ABSENT_KEY")
    assert engine.describe()["base_url"] == "http://127.0.0.1:9/v1"


# --- end to end: `sysbench-gpu generate --engine openai` against the stub -----------------


def request_key(body: dict[str, Any]) -> tuple[str, int]:
    """(system message, turn number) of a chat request: the turn is the number of user messages."""
    messages = body["messages"]
    return messages[0]["content"][:40], sum(m["role"] == "user" for m in messages)


def test_generate_with_faults_then_resume_sends_nothing_twice(
    tmp_path: Path, sessions_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sysbench_gpu import cli
    from sysbench_gpu.core.rundir import RunDir

    monkeypatch.setenv("SYSBENCH_TEST_KEY", SECRET)
    answered: list[tuple[str, int]] = []  # every request answered with 200, over both runs
    lock = threading.Lock()
    phase = {"name": "first"}

    def responder(body: dict[str, Any], n: int) -> Reply:
        key = request_key(body)
        if phase["name"] == "first":
            if key[1] == 3:
                return Reply(status=400)  # a permanent error stops the first run at turn 3
            if n == 1:
                return Reply(status=429, headers={"Retry-After": "0"})
            if n == 2:
                return Reply(status=500)
            if n == 3:
                return Reply(text="too late", delay_s=1.2)  # past the 0.5 s client timeout
        elif n == phase["first_of_second"]:
            return Reply(status=502)
        with lock:
            answered.append(key)
        return Reply(text=f"reply to turn {key[1]}", prompt_tokens=50 * key[1], completion_tokens=3)

    out = tmp_path / "run"
    command = [
        "generate",
        "--data",
        str(sessions_file),
        "--engine",
        "openai",
        "--model",
        "stub-model",
        "--out",
        str(out),
        "--limit",
        "2",
        "--max-tokens",
        "16",
        "--no-progress",
        "--api-key-env",
        "SYSBENCH_TEST_KEY",
        "--timeout",
        "0.5",
        "--concurrency",
        "2",
        "--max-retries",
        "4",
    ]
    with OpenAIStub(responder) as stub:
        command += ["--base-url", stub.base_url]
        assert cli.main(command) == 2  # turn 3 failed for good
        run = RunDir(out)
        stored = run.generations.read()
        assert len(stored) == 4 and {turn for _, turn in stored} == {1, 2}
        first_run_requests = stub.request_count
        phase.update(name="second", first_of_second=first_run_requests + 1)
        assert cli.main(command) == 0
        second_bodies = stub.requests[first_run_requests:]

    records = RunDir(out).generations.read()
    assert len(records) == 10 and all(r.status == "ok" for r in records.values())
    assert all(r.response == f"reply to turn {t}" for (s, t), r in records.items())
    assert all(r.prompt_tokens == 50 * t and r.output_tokens == 3 for (s, t), r in records.items())
    # Nothing answered twice; the second run asked only for turns 3-5 (one 502 retried).
    assert len(answered) == len(set(answered)) == 10
    assert sorted(request_key(b)[1] for b in second_bodies) == [3, 3, 3, 4, 4, 5, 5]
    # The resumed turn 3 carries the model's own stored replies of turns 1 and 2.
    turn3 = next(b for b in second_bodies if request_key(b)[1] == 3)
    assert [m["content"] for m in turn3["messages"] if m["role"] == "assistant"] == [
        "reply to turn 1",
        "reply to turn 2",
    ]
    assert SECRET not in (out / "manifest.json").read_text(encoding="utf-8")
