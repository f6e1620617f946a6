"""The API key never reaches a run-directory file or the terminal: servers that echo it, keys in URLs."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from openai_stub import OpenAIStub, Reply
from test_judge_support import good_reply, make_run, marker

from sysbench_gpu.core import redact

pytest.importorskip("openai")

REPO_ROOT = Path(__file__).resolve().parent.parent
KEY_ENV = "MY_GATEWAY_CRED"  # a name redaction cannot guess: only --api-key-env tells it
KEY = "gw-Zq81vTT0pLm4XsN6ccKd"
ECHO = "Incorrect API key provided: {authorization} for {path}"


def run_cli(*args: str, env_key: str | None = KEY, env_name: str = KEY_ENV) -> tuple[int, str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("OPENAI_BASE_URL", None)
    env.pop(env_name, None)
    if env_key is not None:
        env[env_name] = env_key
    done = subprocess.run(
        [sys.executable, "-m", "sysbench_gpu", *args], env=env, capture_output=True, text=True, timeout=120
    )
    return done.returncode, done.stdout, done.stderr


def files_holding(root: Path, secret: str) -> list[str]:
    """Every file under ``root`` (hidden ones, the judge cache and the ledger included) that holds ``secret``."""
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and secret.encode() in path.read_bytes():
            found.append(str(path.relative_to(root)))
    return found


def test_free_text_loses_known_keys_and_credential_shapes() -> None:
    secrets = redact.Secrets.gather(
        "MY_KEY_VAR",
        None,
        environ={"MY_KEY_VAR": "registered-secret-value", "SOME_SERVICE_API_KEY": "zz-0123456789abcdefXYZ"},
    )
    text = (
        "401: Incorrect API key provided: Bearer sk-proj-ABCDEFGH12345678 | Authorization: Basic dXNlcjpwYXNz | "
        "url http://user:pa55word@host:8000/v1?api-key=QUERYKEY&x=1 | env zz-0123456789abcdefXYZ | "
        "again registered-secret-value | echoed sk-test-****************cdef"
    )
    cleaned, hits = secrets.scrub_counted(text)
    for secret in (
        "sk-proj-ABCDEFGH12345678",
        "dXNlcjpwYXNz",
        "pa55word",
        "QUERYKEY",
        "zz-0123456789abcdefXYZ",
        "registered-secret-value",
        "****cdef",
    ):
        assert secret not in cleaned, secret
    assert hits == 7
    assert "http://[REDACTED]@host:8000/v1?api-key=[REDACTED]&x=1" in cleaned
    assert "Bearer [REDACTED]" in cleaned and "Authorization: Basic [REDACTED]" in cleaned
    # Ordinary text is left alone, and scrubbing twice changes nothing more.
    plain = "The task-list has 3 items; see https://example.com/docs?page=2 and the risk-assessment."
    assert secrets.scrub(plain) == plain
    assert secrets.scrub_counted(cleaned) == (cleaned, 0)


def test_short_keys_are_not_hunted_and_replies_keep_their_urls() -> None:
    secrets = redact.Secrets().adding("stub", "EMPTY", "token-abc123")
    assert "EMPTY" not in secrets.values  # a placeholder, not a secret
    reply = "I am stub. See http://user:pw@example.com and token-abc123, twice: token-abc123"
    cleaned, hits = secrets.scrub_reply(reply)
    assert cleaned == "I am stub. See http://user:pw@example.com and [REDACTED], twice: [REDACTED]" and hits == 2


def test_structural_redaction_touches_only_secret_places() -> None:
    settings = {
        "model": "token-abc123",
        "api_key": "token-abc123",
        "api_key_env": "OPENAI_API_KEY",
        "max_tokens": 64,
        "hf_token": "hf_abcdefghijklmnop",
        "base_url": "http://u:token-abc123@host:1/v1?api-key=token-abc123&x=1",
        "out": "/runs/token-abc123",
        "label": ["stub", {"password": "stub"}],
    }
    treated = redact.redact_settings(settings)
    assert treated == {
        "model": "token-abc123",
        "api_key": "[REDACTED]",
        "api_key_env": "OPENAI_API_KEY",
        "max_tokens": 64,
        "hf_token": "[REDACTED]",
        "base_url": "http://[REDACTED]@host:1/v1?api-key=[REDACTED]&x=1",
        "out": "/runs/token-abc123",
        "label": ["stub", {"password": "[REDACTED]"}],
    }
    assert redact.redact_settings(treated) == treated
    assert redact.redact_headers({"Authorization": "Bearer x", "Content-Type": "json", "x-api-key": "k"}) == {
        "Authorization": "[REDACTED]",
        "Content-Type": "json",
        "x-api-key": "[REDACTED]",
    }
    env = redact.redact_environment({"HF_TOKEN": "hf_x", "PATH": "/bin", "PROXY": "http://a:b@p:3128"})
    assert env == {"HF_TOKEN": "[REDACTED]", "PATH": "/bin", "PROXY": "http://[REDACTED]@p:3128"}


def test_log_filter_rewrites_messages_and_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    secrets = redact.Secrets().adding("filter-secret-123456")
    redact.install_log_redaction(secrets, [caplog.handler])
    logger = logging.getLogger("httpx")
    with caplog.at_level(logging.INFO, logger="httpx"):
        logger.info("HTTP Request: POST %s", "http://u:filter-secret-123456@h/v1/chat")
        try:
            raise RuntimeError("boom filter-secret-123456")
        except RuntimeError:
            logger.exception("failed")
    assert "filter-secret-123456" not in caplog.text and "[REDACTED]" in caplog.text
    # A second command in the same process redacts with its own secrets, not the first one's.
    redact.install_log_redaction(redact.Secrets(), [caplog.handler])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="httpx"):
        logger.info("plain filter-secret-123456")
    assert "plain filter-secret-123456" in caplog.text


def _judge_args(run: Path, url: str, *extra: str) -> list[str]:
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
        "--api-retries",
        "2",
        "--timeout",
        "10",
        "--concurrency",
        "1",
        *extra,
    ]


def test_echoed_key_in_401_and_503_never_lands_in_files_or_terminal(tmp_path: Path, dataset, sessions_file) -> None:
    run = make_run(tmp_path / "judged", dataset, [1])
    out = tmp_path / "generated"
    with OpenAIStub(lambda body, n: Reply(status=401, message=ECHO)) as stub:
        code, stdout, stderr = run_cli(*_judge_args(run.path, stub.base_url))
        assert stub.request_count == 1  # a 401 is not retried
        generate = [
            "generate",
            "--data",
            str(sessions_file),
            "--engine",
            "openai",
            "--model",
            "m",
            "--out",
            str(out),
            "--limit",
            "1",
            "--no-progress",
            "--api-key-env",
            KEY_ENV,
            "--base-url",
            stub.base_url,
        ]
        g_code, g_out, g_err = run_cli(*generate)
    assert code == 2 and g_code == 2
    for text in (stdout, stderr, g_out, g_err):
        assert KEY not in text, text
    assert "401" in stderr and "[REDACTED]" in stderr and "Traceback" not in stderr
    with OpenAIStub(lambda body, n: Reply(status=503, message=ECHO)) as stub:
        code, stdout, stderr = run_cli(*_judge_args(run.path, stub.base_url))
        assert stub.request_count == 3  # one try and two retries, all answered with the key echoed
    assert code == 2 and "gave up after 3 attempts" in stderr
    assert KEY not in stdout + stderr
    manifest = (run.path / "manifest.json").read_text()
    assert "api_errors" in manifest and "[REDACTED]" in manifest
    # A server that echoes the key inside a successful reply: the stored reply is clean too.
    sessions = dataset.by_id()

    def echo_in_reply(body: dict[str, Any], n: int) -> Reply:
        _, sid, turn = marker(body["messages"][-1]["content"])
        return Reply(text=good_reply(sessions[sid], turn).replace("逐条核对", "逐条核对 {authorization}"))

    with OpenAIStub(echo_in_reply) as stub:
        code, stdout, stderr = run_cli(*_judge_args(run.path, stub.base_url))
    assert code == 0, stderr
    assert all("Bearer [REDACTED]" in record.reasoning for record in run.judgments.read().values())
    assert list((run.path / "judge_cache").rglob("*.json")) and (run.path / "judge_ledger.jsonl").is_file()
    assert KEY not in stdout + stderr
    assert files_holding(run.path, KEY) == [] and files_holding(out, KEY) == []


@pytest.mark.parametrize("form", ["userinfo", "query"])
def test_key_in_base_url_is_never_printed_or_stored(tmp_path: Path, dataset, form: str) -> None:
    run = make_run(tmp_path / "run", dataset, [2])
    sessions = dataset.by_id()
    echoed: dict[str, int] = {"n": 0}

    def responder(body: dict[str, Any], n: int) -> Reply:
        if n == 1:
            return Reply(status=500, message=ECHO)  # retried; its body names the URL with the key
        _, sid, turn = marker(body["messages"][-1]["content"])
        echoed["n"] += 1
        return Reply(text=good_reply(sessions[sid], turn), prompt_tokens=100, completion_tokens=10)

    with OpenAIStub(responder) as stub:
        host = stub.base_url.removeprefix("http://")
        url = f"http://user:{KEY}@{host}" if form == "userinfo" else f"{stub.base_url}?api-key={KEY}"
        code, stdout, stderr = run_cli("-v", *_judge_args(run.path, url), env_key=None)
        if form == "query":
            assert any(KEY in path for path in stub.paths)  # the key really travelled in the URL
    assert code == 0, stderr
    assert echoed["n"] == 5 and "HTTP Request" in stderr  # request log lines were printed, redacted
    assert KEY not in stdout and KEY not in stderr
    assert files_holding(run.path, KEY) == []


def _generate_args(sessions_file: Path, out: Path, url: str, model: str, key_env: str = KEY_ENV) -> list[str]:
    return [
        "generate",
        "--data",
        str(sessions_file),
        "--engine",
        "openai",
        "--model",
        model,
        "--out",
        str(out),
        "--limit",
        "2",
        "--no-progress",
        "--api-key-env",
        key_env,
        "--base-url",
        url,
        "--max-tokens",
        "16",
    ]


@pytest.mark.parametrize("key", ["stub", "qwen-local-7b"])
def test_key_equal_to_the_model_name_keeps_the_model_and_resumes(tmp_path: Path, sessions_file, key: str) -> None:
    out = tmp_path / "run"
    with OpenAIStub(lambda body, n: Reply(text="ok")) as stub:
        command = _generate_args(sessions_file, out, stub.base_url, key, key_env="OPENAI_API_KEY")
        first = run_cli(*command, env_key=key, env_name="OPENAI_API_KEY")
        again = run_cli(*command, env_key=key, env_name="OPENAI_API_KEY")
        sent = stub.request_count
    assert first[0] == 0, first[2]
    assert again[0] == 0, again[2]  # the rerun matches what the first run stored, and resumes
    manifest = json.loads((out / "manifest.json").read_text())
    section = manifest["stages"]["generate"]
    assert section["model"] == key and section["engine_describe"]["model"] == key
    assert "[REDACTED]" not in json.dumps(manifest)
    records = (out / "generations.jsonl").read_text().splitlines()
    assert sent == len(records) == 10  # 2 sessions x 5 turns, nothing sent twice


def test_key_printed_in_a_reply_is_redacted_and_counted(tmp_path: Path, sessions_file) -> None:
    out = tmp_path / "run"
    key = "token-abc123"
    with OpenAIStub(lambda body, n: Reply(text=f"my key is {key}" if n == 1 else "ok")) as stub:
        code, stdout, stderr = run_cli(*_generate_args(sessions_file, out, stub.base_url, "m"), env_key=key)
    assert code == 0, stderr
    assert files_holding(out, key) == [] and key not in stdout + stderr
    assert "my key is [REDACTED]" in (out / "generations.jsonl").read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stages"]["generate"]["engine_describe"]["redactions"] == {"replies": 1}
