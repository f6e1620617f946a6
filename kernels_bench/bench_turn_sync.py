"""Turn-synchronous batching versus one session at a time, same engine, model and sessions.

(a) turn-synchronous: turn t of every session is one ``engine.chat`` call (what
    ``sysbench-gpu generate --history model`` does);
(b) sequential: one session at a time, one request per turn, as upstream's client
    does against a server.

Both modes use model history (each mode's own earlier replies) and force every reply
to exactly ``--max-tokens`` tokens (the hf engine's ``ignore_eos``), so they do the
same amount of decoding and the ratio is fair. Prints wall time, output tokens per
second and the ratio (b)/(a), all measured in one run.

    python kernels_bench/bench_turn_sync.py                      # hf + SmolLM2, demo set, 32 x 2 x 32
    python kernels_bench/bench_turn_sync.py --threads 1 --data ../shared/sysbench/sessions.json --sessions 8

The demo set (English, short system messages) is decode-bound; SysBench's own sessions
have ~1000-token Chinese prompts under SmolLM2's tokenizer, so on a CPU prefill takes a
larger share and the ratio is smaller.

Timings on a shared machine move with its load; compare ratios from one run only.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

from sysbench_gpu.batch_infer import conversation_for_turn
from sysbench_gpu.data import Session, load_dataset
from sysbench_gpu.engines.base import SamplingSpec

def pick_sessions(data: str | None, count: int, turns: int) -> tuple[str, list[Session]]:
    """``count`` sessions with at least ``turns`` turns from ``data`` (default: the demo set), cycled when short."""
    source = data or "demo"
    sessions = [s for s in load_dataset(source).sessions if len(s.turns) >= turns]
    if not sessions:
        sys.exit(f"{source}: no session has {turns} turns")
    return source, list(itertools.islice(itertools.cycle(sessions), count))


def turn_synchronous(engine, sessions: list[Session], turns: int, sampling: SamplingSpec) -> dict:
    replies: list[dict[int, str]] = [{} for _ in sessions]
    per_turn, output, prompt = [], 0, 0
    start = time.perf_counter()
    for turn in range(1, turns + 1):
        conversations = [conversation_for_turn(s, turn, replies[i]) for i, s in enumerate(sessions)]
        clock = time.perf_counter()
        completions = engine.chat(conversations, sampling)
        wall = time.perf_counter() - clock
        tokens = sum(c.output_tokens for c in completions)
        per_turn.append((turn, wall, tokens, sum(c.prompt_tokens for c in completions)))
        output += tokens
        prompt += sum(c.prompt_tokens for c in completions)
        for i, completion in enumerate(completions):
            replies[i][turn] = completion.text
    return {"wall": time.perf_counter() - start, "output": output, "prompt": prompt, "per_turn": per_turn,
            "requests": len(sessions) * turns}


def one_session_at_a_time(engine, sessions: list[Session], turns: int, sampling: SamplingSpec) -> dict:
    output, prompt = 0, 0
    start = time.perf_counter()
    for session in sessions:
        replies: dict[int, str] = {}
        for turn in range(1, turns + 1):
            (completion,) = engine.chat([conversation_for_turn(session, turn, replies)], sampling)
            replies[turn] = completion.text
            output += completion.output_tokens
            prompt += completion.prompt_tokens
    return {"wall": time.perf_counter() - start, "output": output, "prompt": prompt, "requests": len(sessions) * turns}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--data", help="data file (default: the packaged demo set)")
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32, help="hf generate() batch size for mode (a)")
    parser.add_argument("--device", help="default: cuda when available")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()

    import torch

    from sysbench_gpu.engines.hf import HFEngine

    if args.threads:
        torch.set_num_threads(args.threads)
    source, sessions = pick_sessions(args.data, args.sessions, args.turns)
    engine = HFEngine(args.model, device=args.device, batch_size=args.batch_size, ignore_eos=True)
    sampling = SamplingSpec(max_tokens=args.max_tokens)
    print(f"data {source}: {len(sessions)} sessions x {args.turns} turns x {args.max_tokens} tokens (eos ignored)")
    print(f"engine hf, model {args.model}, device {engine.input_device}, dtype {engine.dtype_name}, "
          f"batch size {args.batch_size}, torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.1f}")
    engine.chat([conversation_for_turn(sessions[0], 1, {})], SamplingSpec(max_tokens=4))  # warm-up

    batched = turn_synchronous(engine, sessions, args.turns, sampling)
    for turn, wall, tokens, prompt in batched["per_turn"]:
        print(f"  (a) turn {turn}: {len(sessions)} requests, {prompt} prompt tokens, {tokens} output tokens, "
              f"{wall:.2f} s, {tokens / wall:.1f} output tok/s")
    sequential = one_session_at_a_time(engine, sessions, args.turns, sampling)
    assert batched["output"] == sequential["output"], "both modes must decode the same number of tokens"
    for label, result in (("(a) turn-synchronous", batched), ("(b) one session at a time", sequential)):
        print(f"{label:27s} wall {result['wall']:8.2f} s  requests {result['requests']:4d}  prompt tokens "
              f"{result['prompt']:6d}  output tokens {result['output']:6d}  {result['output'] / result['wall']:7.1f} tok/s")
    print(f"ratio (b)/(a) wall time: {sequential['wall'] / batched['wall']:.2f}x  (load at end {os.getloadavg()[0]:.1f})")
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
