"""A scriptable OpenAI-compatible server on loopback for tests (chat completions only).

``responder(request_json, n)`` decides the answer to the n-th request (1-based):
return ``Reply(...)``. It can inject HTTP errors (status 429/500), delay past a
client's timeout, or answer with any text. The server counts requests and keeps
their bodies, so a test can prove that a resumed run sent nothing twice;
``answered`` counts the 200 replies it finished sending. An error's ``message``
may echo the request's ``{authorization}`` header and ``{path}`` (with its query),
and a reply's text its ``{authorization}`` header, as careless servers do.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    text: str = ""
    status: int = 200
    delay_s: float = 0.0  # sleep before answering (a client timeout test)
    prompt_tokens: int = 10
    completion_tokens: int = 5
    finish_reason: str = "stop"
    headers: dict[str, str] = field(default_factory=dict)
    message: str | None = None  # error text; "{authorization}" and "{path}" are filled from the request
    cached_tokens: int | None = None  # reported as usage.prompt_tokens_details.cached_tokens when set


Responder = Callable[[dict[str, Any], int], Reply]


class OpenAIStub:
    """Context manager: ``with OpenAIStub(responder) as stub: stub.base_url``."""

    def __init__(self, responder: Responder, port: int = 0) -> None:
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.answered = 0
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                # What a server's readiness probe asks: the model list, or /health.
                known = self.path in ("/v1/models", "/health")
                data = json.dumps({"object": "list", "data": [{"id": "stub", "object": "model"}]}).encode()
                self.send_response(200 if known else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data) if known else 0))
                self.end_headers()
                if known:
                    self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with stub._lock:
                    stub.requests.append(body)
                    stub.paths.append(self.path)
                    number = len(stub.requests)
                reply = stub.responder(body, number)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                if reply.status != 200:
                    message = reply.message or f"injected {reply.status}"
                    message = message.replace("{authorization}", self.headers.get("Authorization", "")).replace(
                        "{path}", self.path
                    )
                    payload = {"error": {"message": message, "type": "test"}}
                else:
                    text = reply.text.replace("{authorization}", self.headers.get("Authorization", ""))
                    payload = {
                        "id": f"cmpl-{number}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body.get("model", "stub"),
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": text},
                                "finish_reason": reply.finish_reason,
                            }
                        ],
                        "usage": {
                            "prompt_tokens": reply.prompt_tokens,
                            "completion_tokens": reply.completion_tokens,
                            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
                        },
                    }
                    if reply.cached_tokens is not None:
                        payload["usage"]["prompt_tokens_details"] = {"cached_tokens": reply.cached_tokens}
                data = json.dumps(payload).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for key, value in reply.headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(data)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    return  # the client gave up (timeout test)
                if reply.status == 200:
                    with stub._lock:
                        stub.answered += 1

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    @property
    def request_count(self) -> int:
        with self._lock:
            return len(self.requests)

    def __enter__(self) -> OpenAIStub:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
