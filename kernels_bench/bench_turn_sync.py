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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere without installing

from sysbench_gpu.benchmarks.registry import load_dataset
from sysbench_gpu.core.messages import conversation_for_turn
from sysbench_gpu.core.sessions import Session  # noqa: E402
from sysbench_gpu.engines.base import SamplingSpec  # noqa: E402


def pick_sessions(data: str | None, count: int, turns: int) -> tuple[str, list[Session]]:
    """``count`` sessions with at least ``turns`` turns from ``data`` (default: the demo set), cycled when short."""
    source = data or "demo"
    sessions = [s for s in load_dataset(source).sessions if len(s.turns) >= turns]
    if not sessions:
        raise SystemExit(f"{source}: no session has {turns} turns")
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
    return {
        "wall": time.perf_counter() - start,
        "output": output,
        "prompt": prompt,
        "per_turn": per_turn,
        "requests": len(sessions) * turns,
    }


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


def compare(engine, sessions: list[Session], turns: int, max_tokens: int) -> dict:
    """Both modes on one engine (replies forced to ``max_tokens``), with a warm-up; one row of numbers.

    Shared by this script and ``gpu_check.py``; the engine must have ``ignore_eos`` set.
    """
    sampling = SamplingSpec(max_tokens=max_tokens)
    # Warm both shapes of call (a batch and a single conversation) before timing either.
    engine.chat([conversation_for_turn(s, 1, {}) for s in sessions], SamplingSpec(max_tokens=2))
    engine.chat([conversation_for_turn(sessions[0], 1, {})], SamplingSpec(max_tokens=2))
    batched = turn_synchronous(engine, sessions, turns, sampling)
    sequential = one_session_at_a_time(engine, sessions, turns, sampling)
    if batched["output"] != sequential["output"]:
        raise RuntimeError("both modes must decode the same number of tokens (is ignore_eos set?)")
    return {
        "sessions": len(sessions),
        "turns": turns,
        "max_tokens": max_tokens,
        "requests": batched["requests"],
        "prompt_tokens": batched["prompt"],
        "output_tokens": batched["output"],
        "turn_sync_s": round(batched["wall"], 3),
        "sequential_s": round(sequential["wall"], 3),
        "turn_sync_tok_s": round(batched["output"] / batched["wall"], 1),
        "sequential_tok_s": round(sequential["output"] / sequential["wall"], 1),
        "sequential_over_turn_sync_time": round(sequential["wall"] / batched["wall"], 2),
        "per_turn": [
            {"turn": t, "wall_s": round(w, 3), "output_tokens": o, "prompt_tokens": p}
            for t, w, o, p in batched["per_turn"]
        ],
    }


def print_comparison(row: dict) -> None:
    for turn in row["per_turn"]:
        print(
            f"  (a) turn {turn['turn']}: {row['sessions']} requests, {turn['prompt_tokens']} prompt tokens, "
            f"{turn['output_tokens']} output tokens, {turn['wall_s']:.2f} s, "
            f"{turn['output_tokens'] / turn['wall_s']:.1f} output tok/s"
        )
    for label, wall, rate in (
        ("(a) turn-synchronous", row["turn_sync_s"], row["turn_sync_tok_s"]),
        ("(b) one session at a time", row["sequential_s"], row["sequential_tok_s"]),
    ):
        print(
            f"{label:27s} wall {wall:8.2f} s  requests {row['requests']:4d}  output tokens "
            f"{row['output_tokens']:6d}  {rate:7.1f} tok/s"
        )
    print(
        f"ratio (b)/(a) wall time: {row['sequential_over_turn_sync_time']:.2f}x  (load at end {os.getloadavg()[0]:.1f})"
    )


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
    print(f"data {source}: {len(sessions)} sessions x {args.turns} turns x {args.max_tokens} tokens (eos ignored)")
    print(
        f"engine hf, model {args.model}, device {engine.input_device}, dtype {engine.dtype_name}, "
        f"batch size {args.batch_size}, torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.1f}"
    )
    print_comparison(compare(engine, sessions, args.turns, args.max_tokens))
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
