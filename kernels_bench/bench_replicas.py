"""The same turn-synchronous generation with 1 and with N data-parallel replicas (Ray actors).

Each configuration generates the same sessions, turn by turn (one ``engine.chat`` call per
turn, every session's key passed so a session stays on one replica), with greedy decoding and
every reply forced to exactly ``--max-tokens`` tokens, so each does the same decoding work.
One replica runs in this process without Ray (what ``--data-parallel-size 1`` does); N replicas
are N actors on a local Ray started here (or ``--ray-address``). Printed per configuration:
start-up (Ray and the model loads), generation wall time, output tokens per second, the
speed-up over one replica, and the balance: requests and output tokens each replica served.

On a CPU the machine's cores are split evenly (``--cores``, default all this process may use):
one replica gets every core, N replicas get cores/N threads each, so the comparison is the
same hardware used two ways. ``--threads-per-replica`` fixes the threads instead (scaling out).
On a GPU machine (``--engine vllm`` or hf on CUDA) each replica takes its own GPUs, so N
replicas use N times the hardware: the speed-up is scaling, not efficiency. On a CPU that
other work also uses, a replica with several threads waits for the slowest core at every
parallel step (engines/cpu_threads.py), so the figures follow the machine's load: the
1-minute load average before and after is printed with them.

The engines are built once; the timed runs alternate their order on every repeat
(``--repeats``) and the medians are printed, since load on a shared machine drifts.

    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python kernels_bench/bench_replicas.py           # hf + SmolLM2, 8 x 2 x 16
    python kernels_bench/bench_replicas.py --engine vllm --model M --replicas 1,2,4,8 --sessions 500 --turns 5 \\
        --max-tokens 256 --data ../shared/sysbench/sessions.json                          # a GPU node

The demo set has 5 sessions; more are taken again from the start (the same prompts, keyed as
other sessions), which costs the hf engine the same as new ones; vLLM's prefix cache would
serve the repeats, so give ``--data`` with enough sessions there.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere without installing
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # a local Ray stays on 127.0.0.1

from sysbench_gpu.benchmarks.registry import load_dataset  # noqa: E402
from sysbench_gpu.core.messages import conversation_for_turn  # noqa: E402
from sysbench_gpu.core.sessions import Session  # noqa: E402
from sysbench_gpu.engines import get_engine  # noqa: E402
from sysbench_gpu.engines.base import SamplingSpec, chat_sessions  # noqa: E402


def pick_sessions(data: str, count: int, turns: int) -> list[Session]:
    sessions = [s for s in load_dataset(data).sessions if len(s.turns) >= turns]
    if not sessions:
        raise SystemExit(f"{data}: no session has {turns} turns")
    return list(itertools.islice(itertools.cycle(sessions), count))


def engine_options(args: argparse.Namespace, replicas: int) -> dict[str, Any]:
    options: dict[str, Any] = {"model": args.model}
    if replicas > 1:
        options["data_parallel_size"] = replicas
        if args.ray_address:
            options["ray_address"] = args.ray_address
    if args.engine == "hf":
        threads = args.threads_per_replica or max(1, args.cores // replicas)
        options.update(batch_size=args.batch_size, cpu_threads=threads, ignore_eos=True)
        if args.device:
            options["device"] = args.device
    return options


def generate(engine: Any, sessions: list[Session], turns: int, sampling: SamplingSpec) -> dict[str, Any]:
    """Every session, turn by turn, each turn one call; the keys are positions (repeated sessions are others)."""
    replies: list[dict[int, str]] = [{} for _ in sessions]
    keys = [str(i) for i in range(len(sessions))]
    served: Counter[str] = Counter()
    tokens_by_replica: Counter[str] = Counter()
    output = 0
    start = time.perf_counter()
    for turn in range(1, turns + 1):
        conversations = [conversation_for_turn(s, turn, replies[i]) for i, s in enumerate(sessions)]
        completions = chat_sessions(engine, conversations, sampling, keys)
        for i, completion in enumerate(completions):
            replies[i][turn] = completion.text
            replica = str(completion.extra.get("replica", 0))
            served[replica] += 1
            tokens_by_replica[replica] += completion.output_tokens or 0
            output += completion.output_tokens or 0
    return {
        "wall_s": time.perf_counter() - start,
        "output_tokens": output,
        "requests": dict(sorted(served.items())),
        "output_tokens_by_replica": dict(sorted(tokens_by_replica.items())),
        "replies": replies,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--data", default="demo")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--replicas", default="1,2", help="replica counts to compare, comma-separated (first: baseline)"
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)), help="hf on CPU: cores to split")
    parser.add_argument("--threads-per-replica", type=int, help="hf on CPU: fixed threads per replica instead")
    parser.add_argument("--batch-size", type=int, default=8, help="hf: sequences per generate() batch")
    parser.add_argument("--device", help="hf: cpu or cuda (default: cuda when available)")
    parser.add_argument("--ray-address", help="join this Ray cluster (default: a local Ray started here)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    counts = [int(n) for n in args.replicas.split(",")]
    sessions = pick_sessions(args.data, args.sessions, args.turns)
    sampling = SamplingSpec(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)

    load_before = os.getloadavg()[0]
    engines: dict[int, Any] = {}
    startup: dict[int, float] = {}
    try:
        for count in counts:
            clock = time.perf_counter()
            engines[count] = get_engine(args.engine, **engine_options(args, count))
            startup[count] = time.perf_counter() - clock
        runs: dict[int, list[dict[str, Any]]] = {count: [] for count in counts}
        for repeat in range(args.repeats):
            for count in counts if repeat % 2 == 0 else list(reversed(counts)):
                runs[count].append(generate(engines[count], sessions, args.turns, sampling))
        described = {count: engines[count].describe() for count in counts}
    finally:
        for engine in engines.values():
            engine.close()

    load_after = os.getloadavg()[0]
    baseline = statistics.median(r["wall_s"] for r in runs[counts[0]])
    same = all(r["replies"] == runs[counts[0]][0]["replies"] for c in counts for r in runs[c])
    print(
        f"{args.engine} {args.model}: {len(sessions)} sessions x {args.turns} turns x {args.max_tokens} tokens "
        f"(greedy, every reply to max tokens), {args.repeats} timed run(s) each, medians; "
        f"1-min load average {load_before:.2f} before, {load_after:.2f} after, on {len(os.sched_getaffinity(0))} cores"
    )
    rows = []
    for count in counts:
        wall = statistics.median(r["wall_s"] for r in runs[count])
        last = runs[count][-1]
        threads = engine_options(args, count).get("cpu_threads") if args.engine == "hf" else None
        tokens = list(last["output_tokens_by_replica"].values())
        balance = max(tokens) / statistics.mean(tokens) if tokens and statistics.mean(tokens) else None
        row = {
            "replicas": count,
            "threads_per_replica": threads,
            "startup_s": round(startup[count], 2),
            "generation_s": round(wall, 3),
            "output_tokens_per_s": round(last["output_tokens"] / wall, 2) if wall > 0 else None,
            "speedup_vs_first": round(baseline / wall, 3) if wall > 0 else None,
            "requests_by_replica": last["requests"],
            "output_tokens_by_replica": last["output_tokens_by_replica"],
            "busiest_over_mean_tokens": round(balance, 3) if balance else None,
            "restarts": (described[count].get("replicas") or {}).get("restarts", 0),
        }
        rows.append(row)
        print(
            f"  {count} replica(s){f', {threads} thread(s) each' if threads else ''}: start {row['startup_s']:.1f} s, "
            f"generation {row['generation_s']:.2f} s, {row['output_tokens_per_s']} output tok/s, "
            f"speed-up x{row['speedup_vs_first']} | requests per replica {row['requests_by_replica']}, "
            f"output tokens per replica {row['output_tokens_by_replica']} "
            f"(busiest / mean {row['busiest_over_mean_tokens']})"
        )
    print(f"  replies identical across configurations: {same} (thread counts and batch shapes may change numerics)")
    if args.json:
        settings = vars(args) | {"json": str(args.json), "load_average_before": load_before, "load_after": load_after}
        args.json.write_text(json.dumps({"settings": settings, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
