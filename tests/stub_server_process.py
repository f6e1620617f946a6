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
``--child-pid-file FILE`` (spawns a worker in its process group and writes its pid), ``--delay S``
(every reply waits S seconds, as a long generation would) with ``--requests-file FILE`` (a line
appended as each request arrives, so a test knows requests are in flight). ``--vllm-log`` prints
the startup lines vLLM 0.32 prints about its settings, filled from the vLLM flags it was given
(``--max-num-batched-tokens``, ``--max-num-seqs``, ``--kv-cache-memory-bytes``, ``--dtype``).
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


def responder(cached: bool, delay_s: float = 0.0, requests_file: str | None = None):
    def answer(body: dict[str, Any], number: int) -> Reply:
        if requests_file:
            with open(requests_file, "a", encoding="utf-8") as handle:
                handle.write(f"{number}\n")
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
            delay_s=delay_s,
        )

    return answer


def print_vllm_startup(settings: argparse.Namespace) -> None:
    """vLLM's own lines about its settings (api_utils' non-default args, the engine core's config, the KV size)."""
    given = {
        name: getattr(settings, name)
        for name in ("kv_cache_memory_bytes", "max_num_batched_tokens", "max_num_seqs")
        if getattr(settings, name) is not None
    }
    dtype = settings.dtype if settings.dtype not in (None, "auto") else "bfloat16"
    print(f"(APIServer pid=1) INFO 01-01 00:00:00 [api_utils.py:286] non-default args: {given!r}")
    print(
        "(EngineCore pid=2) INFO 01-01 00:00:01 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: "
        f"model='stub', dtype=torch.{dtype}, max_seq_len=8192, enable_prefix_caching=True, "
        "enable_chunked_prefill=True, pooler_config=None"
    )
    tokens = (settings.kv_cache_memory_bytes or 1 << 30) // 23040
    print(
        f"(EngineCore pid=2) INFO 01-01 00:00:02 [kv_cache_utils.py:2327] CPU KV cache size: {tokens:,} tokens, "
        "Maximum concurrency for 8,192 tokens per request: 5.69x"
    )
    sys.stdout.flush()


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
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--requests-file")
    parser.add_argument("--vllm-log", action="store_true")
    for flag in ("--max-num-batched-tokens", "--max-num-seqs", "--kv-cache-memory-bytes"):
        parser.add_argument(flag, type=int)
    parser.add_argument("--dtype")
    args, _ = parser.parse_known_args()  # vLLM's other flags, passed on by a test, mean nothing here
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
    if args.vllm_log:
        print_vllm_startup(args)
    with OpenAIStub(responder(args.cached, args.delay, args.requests_file), port=args.port):
        print("stub ready", flush=True)
        while True:
            time.sleep(0.2)


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        raise SystemExit(0) from None
