"""Head to head on one engine: upstream's client threads against turn-synchronous generation.

The same N sessions (T turns each), the same model, greedy decoding and every reply forced
to M tokens (``ignore_eos``), run three ways back to back:

(a) upstream: the benchmark starts a server (``vllm serve``; ``transformers serve`` with
    continuous batching under ``--engine hf``) and K client threads (default 20, as
    upstream); each thread runs one session's turns in order with the openai client, on
    its own history, then takes the next session;
(b) in_process: ``sysbench-gpu generate --engine vllm`` (or ``hf``), turn-synchronous;
(c) server: ``sysbench-gpu generate --engine openai`` against the same server,
    turn-synchronous, ``--concurrency`` requests in flight (default: all of a turn's).

Times are generation only: (a) from the first request to the last reply, (b) and (c) the
sum of their engine calls in ``stats.json``; server and engine starts are reported apart.
Each way must produce the same turns and output tokens; replies may still differ, because
batched kernels are not bit-invariant, and the share that differs is reported. Then
``sysbench-gpu profile --threads K`` on run (b) predicts the ratio (a)/(b) from its
what-ifs, printed beside the measured one.

    python kernels_bench/bench_vs_upstream.py                       # vLLM (CPU build here), SmolLM2, 32 x 3 x 32
    python kernels_bench/bench_vs_upstream.py --engine hf --json hf.json
    python kernels_bench/bench_vs_upstream.py --model Qwen/Qwen2-72B-Instruct --tensor-parallel-size 4 \\
        --sessions 500 --turns 5 --max-tokens 512 --data ../shared/sysbench/sessions.json

Timings on a shared machine move with its load: compare ratios from one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run from anywhere without installing

from sysbench_gpu.benchmarks.registry import load_dataset  # noqa: E402
from sysbench_gpu.core.messages import conversation_for_turn  # noqa: E402
from sysbench_gpu.core.run_stats import read_stats  # noqa: E402
from sysbench_gpu.core.rundir import RunDir  # noqa: E402
from sysbench_gpu.core.sessions import Session  # noqa: E402
from sysbench_gpu.engines.models import resolve_model  # noqa: E402
from sysbench_gpu.engines.server import (  # noqa: E402
    ManagedServer,
    ServerSpec,
    transformers_server_spec,
    vllm_server_spec,
)

METHODS = ("upstream", "in_process", "server")
DEFAULT_THREADS = 20  # upstream's client pool


@dataclass
class MethodResult:
    name: str  # upstream | in_process | server
    wall_s: float
    turns: int
    output_tokens: int
    prompt_tokens: int
    cached_prompt_tokens: int | None  # None: the engine did not report prefix-cache hits
    startup_s: float | None = None  # server ready / engine load, not part of wall_s
    concurrency: int | None = None
    replies: dict[tuple[int, int], str] = field(default_factory=dict, repr=False)

    def row(self, upstream_wall_s: float | None) -> dict[str, Any]:
        return {
            "name": self.name,
            "wall_s": round(self.wall_s, 3),
            "output_tokens": self.output_tokens,
            "turns": self.turns,
            "output_tok_s": round(self.output_tokens / self.wall_s, 1) if self.wall_s > 0 else None,
            "ratio_to_upstream": round(upstream_wall_s / self.wall_s, 3) if upstream_wall_s and self.wall_s else None,
            "prompt_tokens": self.prompt_tokens,
            "prefix_cache_hit_rate": (
                round(self.cached_prompt_tokens / self.prompt_tokens, 3)
                if self.cached_prompt_tokens is not None and self.prompt_tokens
                else None
            ),
            "startup_s": None if self.startup_s is None else round(self.startup_s, 1),
            "concurrency": self.concurrency,
        }


# ------------------------------------------------------------------ the sessions


def write_sessions(source: str, count: int, turns: int, path: Path) -> list[Session]:
    """``count`` sessions of ``source`` cut to ``turns`` turns (cycled, renumbered), in upstream's schema.

    Every way reads this one file, so the prompts are the same byte for byte.
    """
    raw = _raw_sessions(source)
    usable = [entry for entry in raw if sum(m["role"] == "user" for m in entry["messages"]) >= turns]
    if not usable:
        raise SystemExit(f"bench_vs_upstream: no session of {source} has {turns} turns")
    sessions = []
    for index in range(count):
        entry = json.loads(json.dumps(usable[index % len(usable)]))
        kept, users = [], []
        for message in entry["messages"]:
            if message["role"] == "user":
                if len(users) == turns:
                    break
                users.append(message["content"])
            kept.append(message)
        entry["messages"] = kept
        if isinstance(entry.get("prompt_infos"), dict):
            entry["prompt_infos"] = {
                user: entry["prompt_infos"][user] for user in users if user in entry["prompt_infos"]
            }
        entry["system_id"] = index + 1
        sessions.append(entry)
    path.write_text(json.dumps(sessions, ensure_ascii=False, indent=1), encoding="utf-8")
    return load_dataset(str(path)).sessions


def _raw_sessions(source: str) -> list[dict[str, Any]]:
    if source == "demo":
        source = str(REPO_ROOT / "sysbench_gpu" / "demo" / "demo_sessions.json")
    data = json.loads(Path(source).read_text(encoding="utf-8"))
    if not isinstance(data, list):
        raise SystemExit(f"bench_vs_upstream: {source}: expected upstream's list of sessions")
    return data


# ------------------------------------------------------------------ (a) upstream's method


def run_upstream(
    base_url: str,
    served_model: str,
    sessions: Sequence[Session],
    turns: int,
    max_tokens: int,
    threads: int,
    extra_body: dict[str, Any],
) -> MethodResult:
    """K threads; each runs one session's turns in order on its own history, then the next session."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="EMPTY", max_retries=2, timeout=3600)

    def one_session(session: Session) -> list[tuple[int, str, Any]]:
        replies: dict[int, str] = {}
        out = []
        for turn in range(1, turns + 1):
            response = client.chat.completions.create(
                model=served_model,
                messages=[dict(m) for m in conversation_for_turn(session, turn, replies)],
                max_tokens=max_tokens,
                temperature=0.0,
                extra_body=extra_body or None,
            )
            replies[turn] = response.choices[0].message.content or ""
            out.append((turn, replies[turn], response.usage))
        return out

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="upstream") as pool:
        results = list(pool.map(one_session, sessions))
    wall = time.perf_counter() - started
    result = MethodResult("upstream", wall, 0, 0, 0, None, concurrency=threads)
    for session, session_turns in zip(sessions, results, strict=True):
        for turn, text, usage in session_turns:
            result.turns += 1
            result.replies[(session.system_id, turn)] = text
            result.output_tokens += getattr(usage, "completion_tokens", 0) or 0
            result.prompt_tokens += getattr(usage, "prompt_tokens", 0) or 0
            details = getattr(usage, "prompt_tokens_details", None)
            cached = getattr(details, "cached_tokens", None) if details is not None else None
            if cached is not None:
                result.cached_prompt_tokens = (result.cached_prompt_tokens or 0) + cached
    client.close()
    return result


# ------------------------------------------------------------------ (b) and (c): sysbench-gpu generate


def run_generate(name: str, arguments: Sequence[str], run_dir: Path, log_path: Path) -> MethodResult:
    """``sysbench-gpu generate`` in a child process; its own records and stats give the numbers."""
    command = [sys.executable, "-m", "sysbench_gpu", "generate", "--out", str(run_dir), "--no-progress", *arguments]
    started = time.perf_counter()
    with open(log_path, "ab") as log:
        log.write(f"\n$ {' '.join(command)}\n".encode())
        log.flush()
        completed = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, check=False)
    total = time.perf_counter() - started
    if completed.returncode != 0:
        raise SystemExit(
            f"bench_vs_upstream: ({name}) generate failed with code {completed.returncode}; see {log_path}"
        )
    return read_generated(name, run_dir, total)


def read_generated(name: str, run_dir: Path, total_s: float | None = None) -> MethodResult:
    """A generated run's totals: wall = the sum of its engine calls (stats.json)."""
    calls = read_stats(run_dir / "stats.json")["calls"]
    wall = sum(call.get("wall_s") or 0.0 for call in calls)
    result = MethodResult(name, wall, 0, 0, 0, None, startup_s=None if total_s is None else total_s - wall)
    for key, record in sorted(RunDir(run_dir).generations.read().items()):
        if record.status != "ok":
            continue
        result.turns += 1
        result.replies[key] = record.response or ""
        result.output_tokens += record.output_tokens or 0
        result.prompt_tokens += record.prompt_tokens or 0
        if record.cached_prompt_tokens is not None:
            result.cached_prompt_tokens = (result.cached_prompt_tokens or 0) + record.cached_prompt_tokens
    return result


# ------------------------------------------------------------------ the profile's prediction


def profile_prediction(run_dir: Path, threads: int, device_spec: str | None, log_path: Path) -> dict[str, Any]:
    """``profile --threads K --json`` on run (b): its bound for K threads over its turn-synchronous bound."""
    command = [sys.executable, "-m", "sysbench_gpu", "profile", str(run_dir), "--threads", str(threads), "--json"]
    if device_spec:
        command += ["--device-spec", device_spec]
    completed = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, check=False)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n$ {' '.join(command)}\n{completed.stderr}")
    if completed.returncode != 0:
        tail = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": tail}
    return predicted_ratio(json.loads(completed.stdout), threads, device_spec)


def predicted_ratio(profile: dict[str, Any], threads: int, device_spec: str | None = None) -> dict[str, Any]:
    """From ``profile.json``: the bound of K client threads over the turn-synchronous bound."""
    by_name = {what_if["name"]: what_if for what_if in profile.get("what_if", [])}
    turn_sync = by_name.get("turn-synchronous", {}).get("bound_s")
    threaded = by_name.get(f"{threads} client threads", {}).get("bound_s")
    return {
        "device_spec": device_spec or "profile's default",
        "turn_synchronous_bound_s": turn_sync,
        "client_threads_bound_s": threaded,
        "predicted_ratio": round(threaded / turn_sync, 3) if turn_sync and threaded else None,
    }


def measured_cpu_spec(setup: Setup, work_dir: Path) -> str | None:
    """On a CPU, this machine's measured FLOP/s and bandwidth (measure_cpu_spec.py) for the profile.

    The packaged ``cpu`` spec is a ceiling far above any CPU, at 80 FLOP per byte: under it every
    schedule looks memory-bound and is priced by its forwards. A CPU is compute-bound once a batch
    holds a few sequences (here 163 GFLOP/s against 32 GB/s, 5 FLOP per byte), so the threads'
    extra forwards cost little, and the measured spec says so. None on a GPU (profile's choice).
    """
    if not runs_on_cpu(setup):
        return None
    out = work_dir / "cpu-spec.json"
    command = [sys.executable, str(Path(__file__).with_name("measure_cpu_spec.py")), "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"could not measure this CPU ({done.stderr.strip()[-200:]}); profile uses its default spec")
        return None
    print(f"profile's device spec: this CPU, measured ({out})", flush=True)
    return str(out)


# ------------------------------------------------------------------ the three ways


@dataclass
class Setup:
    engine: str  # vllm | hf
    model: str  # as given (name or path): what (b) loads
    model_path: str  # the folder the server loads
    sessions: list[Session]
    data_file: Path
    turns: int
    max_tokens: int
    threads: int
    server_concurrency: int
    work_dir: Path
    tensor_parallel_size: int = 1
    device: str | None = None  # hf
    dtype: str | None = None
    ready_timeout_s: float = 900.0
    methods: tuple[str, ...] = METHODS


def server_spec(setup: Setup) -> ServerSpec:
    if setup.engine == "vllm":
        env = {}
        if runs_on_cpu(setup) and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, cpu_kv_bytes(setup.model_path) // GIB))
        return vllm_server_spec(
            setup.model_path, "bench-model", tensor_parallel_size=setup.tensor_parallel_size, env=env
        )
    extra: list[str] = []
    if runs_on_cpu(setup):
        # Its paged cache takes 0.9 of the machine's free RAM by default on a CPU (sized as if it were
        # a GPU's memory): give it the KV cache the in-process engines would take instead.
        import psutil

        share = cpu_kv_bytes(setup.model_path) / psutil.virtual_memory().total
        extra = ["--cb-max-memory-percent", f"{min(0.9, max(0.01, share)):.3f}"]
    return transformers_server_spec(
        setup.model_path, device=setup.device or "auto", dtype=setup.dtype or "auto", extra_args=extra
    )


GIB = 1 << 30


def runs_on_cpu(setup: Setup) -> bool:
    """Whether the engine runs on the CPU: vLLM's CPU build, or hf on ``--device cpu`` (or no GPU)."""
    if setup.engine == "vllm":
        from sysbench_gpu.engines.vllm_memory import on_cpu_platform

        return on_cpu_platform()
    if setup.device is not None:
        return setup.device.startswith("cpu")
    import torch

    return not torch.cuda.is_available()


def cpu_kv_bytes(model_path: str) -> int:
    """The KV cache the vllm engine would size on this CPU (engines.vllm_memory): a fixed share of RAM fails."""
    from sysbench_gpu.engines.vllm_memory import plan_memory, read_node_memory, weights_bytes

    plan = plan_memory(
        on_cpu=True,
        gpu_memory_utilization=None,
        kv_cache_memory_bytes=None,
        environ={},
        node=read_node_memory(),
        weights_bytes=weights_bytes(model_path),
    )
    return int(plan.engine_args["kv_cache_memory_bytes"])


def forced_length_body(engine: str, max_tokens: int) -> dict[str, Any]:
    """The request fields that make a server decode every reply to ``max_tokens``, greedily."""
    if engine == "vllm":
        return {"ignore_eos": True}
    # transformers serve has no ignore_eos; a generation config with min = max does the same.
    config = {"max_new_tokens": max_tokens, "min_new_tokens": max_tokens, "do_sample": False}
    return {"generation_config": json.dumps(config)}


def generate_arguments(setup: Setup) -> list[str]:
    return [
        "--data",
        str(setup.data_file),
        "--max-tokens",
        str(setup.max_tokens),
        "--temperature",
        "0",
    ]


def three_ways(setup: Setup) -> list[MethodResult]:
    """The selected ways, back to back, each on a freshly started server or engine.

    (a) and (c) each get a server of their own, started the same way, so neither finds the
    other's prompts in its prefix cache; no way is warmed up, so each pays its engine's
    first batch as a user would.
    """
    log_path = setup.work_dir / "bench.log"
    body = forced_length_body(setup.engine, setup.max_tokens)
    results: list[MethodResult] = []
    for name in setup.methods:
        if name == "in_process":
            results.append(_announce(run_in_process(setup, log_path)))
            continue
        spec = server_spec(setup)
        with ManagedServer(
            spec, setup.work_dir / f"server-{name}.log", ready_timeout_s=setup.ready_timeout_s
        ) as server:
            print(f"{spec.name} for {name} ready in {server.ready_s:.1f} s at {server.base_url}", flush=True)
            if name == "upstream":
                result = run_upstream(
                    server.base_url,
                    spec.served_model,
                    setup.sessions,
                    setup.turns,
                    setup.max_tokens,
                    setup.threads,
                    body,
                )
            else:
                result = run_through_server(setup, server.base_url, spec.served_model, body, log_path)
            result.startup_s = server.ready_s
        results.append(_announce(result))
    return results


def run_through_server(
    setup: Setup, base_url: str, served_model: str, body: dict[str, Any], log_path: Path
) -> MethodResult:
    """(c): ``generate --engine openai`` against the server, a whole turn in flight."""
    arguments = [
        *generate_arguments(setup),
        "--engine",
        "openai",
        "--model",
        served_model,
        "--base-url",
        base_url,
        "--concurrency",
        str(setup.server_concurrency),
        "--max-retries",
        "2",
        "--timeout",
        "3600",
    ]
    arguments += ["--ignore-eos"] if setup.engine == "vllm" else ["--extra-body", json.dumps(body)]
    result = run_generate("server", arguments, setup.work_dir / "run-server", log_path)
    result.concurrency = setup.server_concurrency
    return result


def run_in_process(setup: Setup, log_path: Path) -> MethodResult:
    """(b): ``generate --engine vllm|hf``, every session's turn in one engine call."""
    arguments = [*generate_arguments(setup), "--engine", setup.engine, "--model", setup.model, "--ignore-eos"]
    if setup.engine == "vllm" and setup.tensor_parallel_size > 1:
        arguments += ["--tensor-parallel-size", str(setup.tensor_parallel_size)]
    if setup.engine == "hf":
        arguments += ["--batch-size", str(len(setup.sessions))]
        if setup.device:
            arguments += ["--device", setup.device]
    if setup.dtype:
        arguments += ["--dtype", setup.dtype]
    result = run_generate("in_process", arguments, setup.work_dir / "run-in-process", log_path)
    result.concurrency = len(setup.sessions)
    return result


def _announce(result: MethodResult) -> MethodResult:
    print(
        f"  {result.name}: {result.wall_s:.2f} s, {result.turns} turns, {result.output_tokens} output tokens",
        flush=True,
    )
    return result


def summarize(setup: Setup, results: Sequence[MethodResult], prediction: dict[str, Any] | None) -> dict[str, Any]:
    """The JSON report; ``checks`` says whether every way decoded the same turns and tokens."""
    by_name = {r.name: r for r in results}
    upstream = by_name.get("upstream")
    rows = [r.row(upstream.wall_s if upstream else None) for r in results]
    expected_turns = len(setup.sessions) * setup.turns
    expected_tokens = expected_turns * setup.max_tokens
    problems = [
        f"{r.name}: {r.turns} turns and {r.output_tokens} output tokens, expected {expected_turns} and "
        f"{expected_tokens}"
        for r in results
        if r.turns != expected_turns or r.output_tokens != expected_tokens
    ]
    differing: dict[str, float | None] = {}
    if upstream is not None:
        for r in results:
            if r is upstream:
                continue
            keys = set(upstream.replies) & set(r.replies)
            same = sum(upstream.replies[k] == r.replies[k] for k in keys)
            differing[r.name] = round(1 - same / len(keys), 3) if keys else None
    in_process = by_name.get("in_process")
    measured = round(upstream.wall_s / in_process.wall_s, 3) if upstream and in_process and in_process.wall_s else None
    predicted = (prediction or {}).get("predicted_ratio")
    return {
        "engine": setup.engine,
        "model": setup.model,
        "sessions": len(setup.sessions),
        "turns": setup.turns,
        "max_tokens": setup.max_tokens,
        "threads": setup.threads,
        "server_concurrency": setup.server_concurrency,
        "tensor_parallel_size": setup.tensor_parallel_size,
        "methods": rows,
        "checks": {"same_turns_and_tokens": not problems, "problems": problems},
        "replies_differing_from_upstream": differing,
        "measured_ratio": measured,
        "profile_predicted_ratio": predicted,
        "profile_relative_error": round((predicted - measured) / measured, 3) if predicted and measured else None,
        "profile": prediction,
        "load_average": round(os.getloadavg()[0], 2),
    }


def print_report(report: dict[str, Any]) -> None:
    print(
        f"\nengine {report['engine']}, model {report['model']}: {report['sessions']} sessions x {report['turns']} "
        f"turns x {report['max_tokens']} tokens, {report['threads']} upstream threads"
    )
    print(f"{'method':<12}{'wall s':>9}{'turns':>7}{'out tokens':>11}{'tok/s':>9}{'x upstream':>11}{'cache hit':>10}")
    for row in report["methods"]:
        ratio = "-" if row["ratio_to_upstream"] is None else f"{row['ratio_to_upstream']:.2f}"
        hits = "-" if row["prefix_cache_hit_rate"] is None else f"{row['prefix_cache_hit_rate']:.0%}"
        print(
            f"{row['name']:<12}{row['wall_s']:>9.2f}{row['turns']:>7}{row['output_tokens']:>11}"
            f"{row['output_tok_s'] or 0:>9.1f}{ratio:>11}{hits:>10}"
        )
    checks = report["checks"]
    print(
        "same turns and output tokens: " + ("yes" if checks["same_turns_and_tokens"] else "; ".join(checks["problems"]))
    )
    for name, share in report["replies_differing_from_upstream"].items():
        if share is not None:
            print(f"replies of {name} differing from upstream's: {share:.0%}")
    if report["measured_ratio"] is not None:
        predicted = report["profile_predicted_ratio"]
        error = report["profile_relative_error"]
        print(
            f"upstream / in_process: measured {report['measured_ratio']:.2f}x, profile predicted "
            + ("-" if predicted is None else f"{predicted:.2f}x")
            + ("" if error is None else f" (error {error:+.0%})")
        )


# ------------------------------------------------------------------ command line


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--engine", choices=("vllm", "hf"), default="vllm")
    parser.add_argument("--model", default="smollm2", help="model name or folder (default: the embedded SmolLM2)")
    parser.add_argument("--data", default="demo", help="sessions file in upstream's schema (default: the demo set)")
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="upstream's client threads")
    parser.add_argument("--server-concurrency", type=int, help="(c)'s requests in flight (default: all of a turn's)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--device", help="hf: cpu, cuda (default: cuda when available)")
    parser.add_argument("--dtype", help="float32, bfloat16, ... (default: the engine's)")
    parser.add_argument("--methods", default=",".join(METHODS), help="which ways to run, comma-separated")
    parser.add_argument(
        "--device-spec",
        help="profile's --device-spec (default: on a CPU, this CPU measured by measure_cpu_spec.py; else profile's)",
    )
    parser.add_argument("--work-dir", help="where the runs and logs go (default: a new temporary folder)")
    parser.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to wait for the server")
    parser.add_argument("--json", help="write the report to this file")
    args = parser.parse_args(argv)
    for name in ("sessions", "turns", "max_tokens", "threads", "tensor_parallel_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    unknown = [m for m in args.methods.split(",") if m not in METHODS]
    if unknown:
        parser.error(f"--methods: unknown {', '.join(unknown)} (choose from {', '.join(METHODS)})")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the server's context manager stops it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-vs-upstream-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    sessions = write_sessions(args.data, args.sessions, args.turns, work_dir / "sessions.json")
    setup = Setup(
        engine=args.engine,
        model=args.model,
        model_path=resolve_model(args.model),
        sessions=sessions,
        data_file=work_dir / "sessions.json",
        turns=args.turns,
        max_tokens=args.max_tokens,
        threads=args.threads,
        server_concurrency=args.server_concurrency or len(sessions),
        work_dir=work_dir,
        tensor_parallel_size=args.tensor_parallel_size,
        device=args.device,
        dtype=args.dtype,
        ready_timeout_s=args.ready_timeout,
        methods=tuple(m for m in METHODS if m in args.methods.split(",")),
    )
    print(
        f"{len(sessions)} sessions x {args.turns} turns x {args.max_tokens} tokens on {args.engine}, "
        f"model {args.model}; logs and runs in {work_dir}",
        flush=True,
    )
    try:
        results = three_ways(setup)
    except KeyboardInterrupt:
        print("interrupted: the server was stopped", file=sys.stderr)
        return 130
    prediction = None
    if "in_process" in setup.methods:
        spec = args.device_spec or measured_cpu_spec(setup, work_dir)
        prediction = profile_prediction(work_dir / "run-in-process", args.threads, spec, work_dir / "bench.log")
    report = summarize(setup, results, prediction)
    report["work_dir"] = str(work_dir)
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
        print(f"wrote {args.json}")
    return 0 if report["checks"]["same_turns_and_tokens"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
