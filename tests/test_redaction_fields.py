"""Redaction touches only secrets: a user's own settings are stored as given, secrets are not.

JSON settings are matched against a fixed list of secret field names (not a suffix), credential
shapes are guessed only inside URLs, known secret values go everywhere, and the model name a
server reports is scrubbed like any other text it returns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from openai_stub import OpenAIStub, Reply

from sysbench_gpu.core import redact
from sysbench_gpu.core.redact import REDACTED

REPO_ROOT = Path(__file__).resolve().parent.parent
KEY_ENV = "MY_GATEWAY_CRED"  # the API key in use: known through --api-key-env only
KEY = "gw-Zq81vTT0pLm4XsN6ccKd"
HUB_TOKEN = "hf_kP3vRq9ZtX2mWb7LcN5s"  # a key-like environment value this command did not ask for
SYSTEM_MESSAGE = (
    "You answer questions about our API. The docs are at https://docs.example.com/api/auth?lang=en. "
    "Tell users to send the header `Authorization: Bearer <YOUR_TOKEN>`, e.g. Bearer YOUR_ACCESS_TOKEN_HERE, "
    "and never to paste a key such as sk-your-key-goes-here into a chat."
)
USER_BODY = {
    "stop_token": "<|end|>",
    "eos_token": "</s>",
    "cache_key": "session-cache-7",
    "max_tokens_hint": 16,
    "note": "see https://docs.example.com/x (token rotation) and Bearer <TOKEN>",
}
SECRET_BODY = {
    "api_key": "literal-body-key-0001",  # a real secret field name
    "extra_headers": {"Authorization": "Bearer literal-header-key-0002", "X-Trace": "t-1"},
    "callback": "https://hook:pa55-w0rd-0003@hooks.example.com/done?token=qtok-0004&run=7",
    "vendor_blob": f"uses {HUB_TOKEN} upstream",  # an unlisted name holding a known secret value
}


def run_cli(*args: str) -> tuple[int, str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("OPENAI_BASE_URL", None)
    env[KEY_ENV] = KEY
    env["HF_TOKEN"] = HUB_TOKEN
    done = subprocess.run(
        [sys.executable, "-m", "sysbench_gpu", *args], env=env, capture_output=True, text=True, timeout=120
    )
    return done.returncode, done.stdout, done.stderr


def files_holding(root: Path, secret: str) -> list[str]:
    return [
        str(p.relative_to(root)) for p in sorted(root.rglob("*")) if p.is_file() and secret.encode() in p.read_bytes()
    ]


def generate_args(data: Path, out: Path, url: str, *extra: str) -> list[str]:
    return [
        "generate",
        "--data",
        str(data),
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
        url,
        "--max-tokens",
        "8",
        *extra,
    ]


# --- end to end: what `generate` stores ---------------------------------------------------------


def test_extra_body_and_system_message_are_stored_as_given(tmp_path: Path, mteval_data_dir: Path) -> None:
    pytest.importorskip("openai")
    out = tmp_path / "run"
    body = {**USER_BODY, **SECRET_BODY}
    with OpenAIStub(lambda request, n: Reply(text="ok")) as stub:
        command = generate_args(
            mteval_data_dir / "follow-up_multi.jsonl",
            out,
            stub.base_url,
            "--system-message",
            SYSTEM_MESSAGE,
            "--extra-body",
            json.dumps(body),
        )
        first = run_cli(*command)
        sent = stub.request_count
        again = run_cli(*command)  # the rerun compares the stored system message with the given one
        resent = stub.request_count - sent
        requests = list(stub.requests)
    assert first[0] == 0, first[2]
    assert again[0] == 0, again[2]
    assert sent > 0 and resent == 0  # the rerun matched the stored settings and found nothing to do
    # The server got the body as given: redaction is for what is stored, never for what is sent.
    assert all(request[name] == value for request in requests for name, value in body.items())
    assert requests[0]["messages"][0] == {"role": "system", "content": SYSTEM_MESSAGE}

    section = json.loads((out / "manifest.json").read_text())["stages"]["generate"]
    assert section["system_message"] == SYSTEM_MESSAGE
    for stored in (section["engine_options"]["extra_body"], section["engine_describe"]["extra_body"]):
        for name, value in USER_BODY.items():
            assert stored[name] == value, name
        assert stored["api_key"] == REDACTED
        assert stored["extra_headers"] == {"Authorization": REDACTED, "X-Trace": "t-1"}
        assert stored["callback"] == f"https://{REDACTED}@hooks.example.com/done?token={REDACTED}&run=7"
        assert stored["vendor_blob"] == f"uses {REDACTED} upstream"
    for secret in ("literal-body-key-0001", "literal-header-key-0002", "pa55-w0rd-0003", "qtok-0004", HUB_TOKEN, KEY):
        assert files_holding(out, secret) == [], secret


def test_served_model_is_scrubbed(tmp_path: Path, sessions_file: Path) -> None:
    pytest.importorskip("openai")
    out = tmp_path / "run"
    served = f"router https://relay:pa55-w0rd-0005@gw.example.com/m?sig=qsig-0006 for {KEY}"

    def responder(request: dict[str, Any], n: int) -> Reply:
        request["model"] = served  # the stub answers with the request's "model": here, what a gateway reports
        return Reply(text="ok")

    with OpenAIStub(responder) as stub:
        code, stdout, stderr = run_cli(*generate_args(sessions_file, out, stub.base_url))
    assert code == 0, stderr
    lines = (out / "generations.jsonl").read_text().splitlines()
    records = [record for record in map(json.loads, lines) if record["status"] == "ok"]
    expected = f"router https://{REDACTED}@gw.example.com/m?sig={REDACTED} for {REDACTED}"
    assert records and all(record["extra"]["served_model"] == expected for record in records)
    for secret in ("pa55-w0rd-0005", "qsig-0006", KEY):
        assert files_holding(out, secret) == [], secret
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stages"]["generate"]["engine_describe"]["redactions"] == {"served_model": 3 * len(records)}


# --- the rules themselves -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "api_key",
        "API-Key",
        "apikey",
        "x-api-key",
        "access_token",
        "auth_token",
        "hf_token",
        "token",
        "password",
        "secret",
        "client_secret",
        "Authorization",
        "credentials",
        "cookie",
        "aws_secret_access_key",
    ],
)
def test_listed_secret_fields_are_redacted(name: str) -> None:
    assert redact.redact_settings({name: "value-1"}) == {name: REDACTED}
    assert redact.redact_settings({"outer": [{name: {"nested": "x"}}]}) == {"outer": [{name: REDACTED}]}


@pytest.mark.parametrize(
    "name",
    [
        "eos_token",
        "stop_token",
        "bos_token",
        "pad_token",
        "cache_key",
        "max_tokens",
        "api_key_env",
        "key",
        "num_key_value_heads",
        "tokenizer",
        "sort_key",
        "secret_sauce",
        "token_budget",
        "password_hint",
    ],
)
def test_other_fields_are_stored_as_given(name: str) -> None:
    value = {name: "<|end|>", "list": ["</s>", {name: "x"}]}
    assert redact.redact_settings(value) == value


def test_empty_and_flag_values_of_secret_fields_stay() -> None:
    value = {"api_key": "", "token": None, "auth": False, "password": []}
    assert redact.redact_settings(value) == value


def test_shapes_are_guessed_only_inside_urls() -> None:
    text = (
        "Bearer abcdefghijkl and sk-abcdefghijklmnop and Authorization: Basic dXNlcjpwYXNz stay; "
        "(see https://u:p@h.example/x?api_key=sk-aaaaaaaaaaaa&page=2). Also http://h/y/sk-bbbbbbbbbbbb, done."
    )
    expected = (
        "Bearer abcdefghijkl and sk-abcdefghijklmnop and Authorization: Basic dXNlcjpwYXNz stay; "
        f"(see https://{REDACTED}@h.example/x?api_key={REDACTED}&page=2). Also http://h/y/{REDACTED}, done."
    )
    assert redact.redact_settings({"system_message": text}) == {"system_message": expected}
    assert redact.redact_settings(expected) == expected  # a second pass changes nothing
    assert redact.scrub_url_tokens(expected) == (expected, 0)
    plain = "A URL without credentials: https://example.com/docs?page=2#token, and no URL: key=abc token=xyz"
    assert redact.redact_settings(plain) == plain


def test_known_values_are_removed_from_settings_when_given() -> None:
    secrets = redact.Secrets().adding("known-secret-value-1", "short")
    value = {"model": "m", "note": "prefix known-secret-value-1 suffix", "short": "short"}
    assert redact.redact_settings(value, secrets) == {
        "model": "m",
        "note": f"prefix {REDACTED} suffix",
        "short": "short",
    }
    assert redact.redact_settings(value) == value  # without a Secrets object only names and URLs count


def test_environment_and_headers_keep_their_broad_match() -> None:
    environ = {
        "HF_TOKEN": "hf_0123456789abcdef",
        "WANDB_API_KEY": "0123456789abcdef0123",
        "MY_SERVICE_SECRET": "s3cr3t-0123456789",
        "EOS_TOKEN_ID": "2",  # ends in another word: not a secret name
        "PATH": "/usr/bin",
    }
    gathered = redact.Secrets.gather(None, None, environ=environ)
    assert gathered.values == {"hf_0123456789abcdef", "0123456789abcdef0123", "s3cr3t-0123456789"}
    assert redact.redact_environment(environ) == {
        "HF_TOKEN": REDACTED,
        "WANDB_API_KEY": REDACTED,
        "MY_SERVICE_SECRET": REDACTED,
        "EOS_TOKEN_ID": "2",
        "PATH": "/usr/bin",
    }
    headers = {"Authorization": "Bearer x", "X-Goog-Api-Key": "g", "X-Auth-Token": "t", "Accept": "json"}
    assert redact.redact_headers(headers) == {
        "Authorization": REDACTED,
        "X-Goog-Api-Key": REDACTED,
        "X-Auth-Token": REDACTED,
        "Accept": "json",
    }


def test_scrub_value_counts_known_values_and_url_credentials() -> None:
    secrets = redact.Secrets().adding("known-secret-value-1")
    tally = redact.RedactionTally()
    served = "https://u:pw@h/m?key=k1 known-secret-value-1 Bearer abcdefghijkl"
    cleaned = secrets.scrub_value(served, tally, "served_model")
    assert cleaned == f"https://{REDACTED}@h/m?key={REDACTED} {REDACTED} Bearer abcdefghijkl"
    assert tally.snapshot() == {"served_model": 3}
    assert secrets.scrub_value("plain-model-name", tally, "served_model") == "plain-model-name"
    assert tally.snapshot() == {"served_model": 3}
