"""An OpenAI-compatible stub server as its own process, for ``engines.server.ManagedServer`` tests.

    python tests/stub_server_process.py --port N [--behaviour ...]

Replies are deterministic: the text names the last user message's length, and the
completion decodes ``max_tokens`` tokens when the request forces the length (vLLM's
``ignore_eos``, or transformers serve's ``generation_config``), else 3. Prompt tokens are
the characters of all messages divided by 4; cached tokens, with ``--cached``, the
prompt tokens of the previous turn of the same conversation (what a prefix cache holds).

Behaviours for the start and stop paths: ``--exit-at-start CODE`` (dies before it listens),
``--port-taken-times N --counter FILE`` (the first N starts say the address is in use),
``--never-ready`` (never listens), ``--ignore-sigint`` (only SIGTERM or SIGKILL end it),
``--child-pid-file FILE`` (spawns a worker in its process group and writes its pid).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from openai_stub import OpenAIStub, Reply  # noqa: E402


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    return max(1, sum(len(m.get("content") or "") for m in messages) // 4)


def responder(cached: bool):
    def answer(body: dict[str, Any], number: int) -> Reply:
        messages = body.get("messages", [])
        forced = bool(body.get("ignore_eos")) or "generation_config" in body
        tokens = int(body.get("max_tokens") or 16) if forced else 3
        last_user = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        previous = messages[:-2] if len(messages) > 2 else []
        return Reply(
            text=f"reply to {len(last_user)} characters",
            prompt_tokens=prompt_tokens(messages),
            completion_tokens=tokens,
            finish_reason="length" if forced else "stop",
            cached_tokens=(prompt_tokens(previous) if previous else 0) if cached else None,
        )

    return answer


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cached", action="store_true")
    parser.add_argument("--exit-at-start", type=int)
    parser.add_argument("--port-taken-times", type=int, default=0)
    parser.add_argument("--counter")
    parser.add_argument("--never-ready", action="store_true")
    parser.add_argument("--ignore-sigint", action="store_true")
    parser.add_argument("--child-pid-file")
    args = parser.parse_args()
    print(f"stub starting on port {args.port}", flush=True)
    if args.exit_at_start is not None:
        print("fatal: the stub was told to fail", flush=True)
        return args.exit_at_start
    if args.port_taken_times:
        counter = Path(args.counter)
        starts = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(starts))
        if starts <= args.port_taken_times:
            print(f"ERROR: [Errno 98] error while attempting to bind on address: address already in use ({starts})")
            return 1
    if args.ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if args.child_pid_file:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path(args.child_pid_file).write_text(str(child.pid))
    if args.never_ready:
        time.sleep(600)
        return 0
    with OpenAIStub(responder(args.cached), port=args.port):
        print("stub ready", flush=True)
        while True:
            time.sleep(0.2)


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        raise SystemExit(0) from None
