"""Head to head on one engine: upstream's client threads against turn-synchronous generation.

The same N distinct sessions (T turns each), the same model, greedy decoding and every reply
forced to M tokens (``ignore_eos``), run three ways back to back, each with the same engine
settings (one scheduler budget, one dtype, one KV-cache size):

(a) upstream: the benchmark starts a server (``vllm serve``; ``transformers serve`` with
    continuous batching under ``--engine hf``) and K client threads (default 20, as
    upstream); each thread runs one session's turns in order with the openai client, on
    its own history, then takes the next session;
(b) in_process: ``sysbench-gpu generate --engine vllm`` (or ``hf``), turn-synchronous;
(c) server: ``sysbench-gpu generate --engine openai`` against the same server,
    turn-synchronous, ``--concurrency`` requests in flight (default: all of a turn's).

Every way is timed from its first request to its last reply: (a) around its threads, (b) and
(c) around generate's loop (``stats.json``'s ``generation_loop``), so each turn's chat-template
rendering, token counting and record writes count as they do for a user; server and engine
starts are reported apart. Each way must produce the same turns and output tokens; replies may
still differ, because batched kernels are not bit-invariant, and the share that differs is
reported. Each way's entry holds the settings its engine really ran with (``engine_settings``)
and where each was read (``engine_settings_source``). Then ``sysbench-gpu profile --threads K``
on run (b) predicts the ratio (a)/(b) from its what-ifs, printed beside the measured one.

    python kernels_bench/bench_vs_upstream.py                       # vLLM (CPU build here), SmolLM2, 200 x 3 x 32
    python kernels_bench/bench_vs_upstream.py --engine hf --json hf.json
    python kernels_bench/bench_vs_upstream.py --model Qwen/Qwen2-72B-Instruct --tensor-parallel-size 4 \\
        --sessions 500 --turns 5 --max-tokens 512 --data ../shared/sysbench/sessions.json

Publish a figure only where N >= 10 x K with K = 20, as upstream runs (fewer sessions per
thread measure a half-empty last wave; fewer threads flatter the turn-synchronous ways); the
benchmark warns below that and records N, K and the settings in the JSON. Timings on a shared
machine move with its load: compare ratios from one run only.
"""

from __future__ import annotations

import argparse
import json
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run from anywhere without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

import h2h_settings  # noqa: E402
from h2h_report import (  # noqa: E402
    SESSIONS_PER_THREAD,
    predicted_ratio,
    print_report,
    publish_warning,
    summarize,
    token_problems,
)
from h2h_sessions import AUTO, WrittenSessions, distinct_sessions, write_sessions  # noqa: E402
from h2h_setup import (  # noqa: E402
    DEFAULT_THREADS,
    METHODS,
    TIMED,
    Budget,
    MethodResult,
    Setup,
    cache_share,
    choose_budget,
    cpu_kv_bytes,
    runs_on_cpu,
    transformers_budget_args,
)

from sysbench_gpu.core.jsonio import read_json  # noqa: E402
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

# The pieces live in h2h_*.py beside this script; these names are what callers (gpu_check, tests) use.
__all__ = [
    "METHODS",
    "TIMED",
    "Budget",
    "MethodResult",
    "Setup",
    "WrittenSessions",
    "choose_budget",
    "cpu_kv_bytes",
    "distinct_sessions",
    "predicted_ratio",
    "print_report",
    "publish_warning",
    "summarize",
    "three_ways",
    "token_problems",
    "write_sessions",
]

DEFAULT_SESSIONS = SESSIONS_PER_THREAD * DEFAULT_THREADS  # the smallest N the publishing rule allows at K = 20


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
    """K threads; each runs one session's turns in order on its own history, then the next session.

    The threads are daemons that the main thread only waits for: Ctrl-C raises here at once,
    the caller stops the server, and a thread's request in flight fails with it (nothing waits
    for the sessions still running, as a ``ThreadPoolExecutor`` would).
    """
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="EMPTY", max_retries=2, timeout=3600)
    stop = threading.Event()
    pending: queue.SimpleQueue[tuple[int, Session]] = queue.SimpleQueue()
    for index, session in enumerate(sessions):
        pending.put((index, session))
    results: dict[int, list[tuple[int, str, Any]]] = {}
    errors: list[BaseException] = []

    def one_session(session: Session) -> list[tuple[int, str, Any]]:
        replies: dict[int, str] = {}
        out = []
        for turn in range(1, turns + 1):
            if stop.is_set():
                break
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

    def worker() -> None:
        while not stop.is_set():
            try:
                index, session = pending.get_nowait()
            except queue.Empty:
                return
            try:
                results[index] = one_session(session)
            except BaseException as error:  # noqa: BLE001 (reported by the main thread)
                errors.append(error)
                stop.set()
                return

    pool = [
        threading.Thread(target=worker, name=f"upstream-{n}", daemon=True) for n in range(min(threads, len(sessions)))
    ]
    started = time.perf_counter()
    try:
        for thread in pool:
            thread.start()
        for thread in pool:
            while thread.is_alive():
                thread.join(timeout=0.2)
    except BaseException:
        stop.set()  # no thread takes another session; the ones in flight die with the server
        raise
    wall = time.perf_counter() - started
    if errors:
        raise errors[0]
    client.close()
    result = MethodResult("upstream", wall, 0, 0, 0, None, concurrency=threads)
    for index, session in enumerate(sessions):
        for turn, text, usage in results.get(index, []):
            result.turns += 1
            result.replies[(session.system_id, turn)] = text
            result.output_tokens += getattr(usage, "completion_tokens", 0) or 0
            result.prompt_tokens += getattr(usage, "prompt_tokens", 0) or 0
            details = getattr(usage, "prompt_tokens_details", None)
            cached = getattr(details, "cached_tokens", None) if details is not None else None
            if cached is not None:
                result.cached_prompt_tokens = (result.cached_prompt_tokens or 0) + cached
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
    """A generated run's totals: wall = its generation loop (``stats.json``), first request to last reply."""
    stats_path = run_dir / "stats.json"
    stats = read_stats(stats_path)
    loop = stats.get("generation_loop")
    if not isinstance(loop, dict) or not isinstance(loop.get("wall_s"), (int, float)):
        raise SystemExit(f"bench_vs_upstream: {stats_path}: no generation_loop.wall_s (a generate before issue 30?)")
    wall = float(loop["wall_s"])
    calls = sum(call.get("wall_s") or 0.0 for call in stats["calls"])
    result = MethodResult(name, wall, 0, 0, 0, None, startup_s=None if total_s is None else total_s - wall)
    result.engine_calls_s = calls
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


# ------------------------------------------------------------------ the settings, chosen once


def server_spec(setup: Setup) -> ServerSpec:
    budget = setup.budget
    assert budget is not None
    if setup.engine == "vllm":
        return vllm_server_spec(
            setup.model_path,
            "bench-model",
            tensor_parallel_size=setup.tensor_parallel_size,
            dtype=budget.dtype,
            max_num_batched_tokens=budget.max_num_batched_tokens,
            max_num_seqs=budget.max_num_seqs,
            kv_cache_memory_bytes=budget.kv_cache_memory_bytes,
        )
    return transformers_server_spec(
        setup.model_path,
        device=setup.device or "auto",
        dtype=budget.dtype or "auto",
        extra_args=transformers_budget_args(budget, host_memory_bytes(setup)),
    )


def host_memory_bytes(setup: Setup) -> int | None:
    """The memory transformers serve's cache share is taken of, where it is this machine's RAM (a CPU)."""
    if not runs_on_cpu(setup):
        return None  # on a GPU its default share applies; --kv-cache-memory-bytes is not passed on
    import psutil

    return int(psutil.virtual_memory().total)


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


# ------------------------------------------------------------------ the three ways


def three_ways(setup: Setup) -> list[MethodResult]:
    """The selected ways, back to back, each on a freshly started server or engine.

    (a) and (c) each get a server of their own, started the same way, so neither finds the
    other's prompts in its prefix cache; no way is warmed up, so each pays its engine's
    first batch as a user would.
    """
    if setup.budget is None:
        setup.budget = choose_budget(setup)
    log_path = setup.work_dir / "bench.log"
    body = forced_length_body(setup.engine, setup.max_tokens)
    results: list[MethodResult] = []
    for name in setup.methods:
        if name == "in_process":
            results.append(_announce(run_in_process(setup, log_path)))
            continue
        spec = server_spec(setup)
        server_log = setup.work_dir / f"server-{name}.log"
        with ManagedServer(spec, server_log, ready_timeout_s=setup.ready_timeout_s) as server:
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
            metrics = fetch_metrics(server.root_url) if setup.engine == "vllm" else None
        result.engine_settings, result.engine_settings_source = server_settings(setup, server_log, metrics)
        results.append(_announce(result))
    return results


def fetch_metrics(root_url: str) -> str | None:
    """The server's Prometheus metrics (vLLM exposes its cache config there), or None."""
    try:
        with urllib.request.urlopen(root_url + "/metrics", timeout=10) as response:  # noqa: S310 (our loopback server)
            return response.read().decode("utf-8", errors="replace")
    except OSError:
        return None


def server_settings(setup: Setup, log_path: Path, metrics: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    if setup.engine == "vllm":
        return h2h_settings.vllm_server_settings(h2h_settings.read_text(log_path), metrics)
    budget = setup.budget
    assert budget is not None
    requested = {
        "dtype": budget.dtype,
        "enable_prefix_caching": True,
        "max_num_batched_tokens": budget.max_num_batched_tokens,
        "cache_share": cache_share(budget, host_memory_bytes(setup)),
    }
    return h2h_settings.transformers_server_settings(requested)


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


def in_process_arguments(setup: Setup) -> list[str]:
    """(b)'s ``generate`` flags: the same budget, KV size and dtype as the server ways."""
    budget = setup.budget
    assert budget is not None
    arguments = [*generate_arguments(setup), "--engine", setup.engine, "--model", setup.model, "--ignore-eos"]
    if setup.engine == "vllm":
        arguments += [
            "--max-num-batched-tokens",
            str(budget.max_num_batched_tokens),
            "--max-num-seqs",
            str(budget.max_num_seqs),
        ]
        if budget.kv_cache_memory_bytes is not None:
            arguments += ["--kv-cache-memory-bytes", str(budget.kv_cache_memory_bytes)]
        if setup.tensor_parallel_size > 1:
            arguments += ["--tensor-parallel-size", str(setup.tensor_parallel_size)]
    else:
        # Static generate() batches have no token budget; the sequence cap is the batch size.
        arguments += ["--batch-size", str(min(budget.max_num_seqs, len(setup.sessions)))]
        if setup.device:
            arguments += ["--device", setup.device]
    if budget.dtype:
        arguments += ["--dtype", budget.dtype]
    return arguments


def run_in_process(setup: Setup, log_path: Path) -> MethodResult:
    """(b): ``generate --engine vllm|hf``, every session's turn in one engine call."""
    run_dir = setup.work_dir / "run-in-process"
    result = run_generate("in_process", in_process_arguments(setup), run_dir, log_path)
    result.concurrency = len(setup.sessions)
    manifest = read_json(run_dir / "manifest.json", expect=dict)
    read = h2h_settings.vllm_engine_settings if setup.engine == "vllm" else h2h_settings.hf_engine_settings
    result.engine_settings, result.engine_settings_source = read(manifest)
    return result


def _announce(result: MethodResult) -> MethodResult:
    print(
        f"  {result.name}: {result.wall_s:.2f} s, {result.turns} turns, {result.output_tokens} output tokens",
        flush=True,
    )
    return result


# ------------------------------------------------------------------ command line


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--engine", choices=("vllm", "hf"), default="vllm")
    parser.add_argument("--model", default="smollm2", help="model name or folder (default: the embedded SmolLM2)")
    parser.add_argument(
        "--data",
        default=AUTO,
        help="sessions in upstream's schema: a file, 'demo', or 'auto' (default): SysBench's own file where found "
        "offline (../shared/sysbench/sessions.json, data/system_benchmark_eval_datas.json), else the demo set",
    )
    parser.add_argument("--sessions", type=int, default=DEFAULT_SESSIONS, help=f"N (default {DEFAULT_SESSIONS})")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0, help="the sessions' shuffle (upstream shuffles unseeded)")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="upstream's client threads, K")
    parser.add_argument("--server-concurrency", type=int, help="(c)'s requests in flight (default: all of a turn's)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        help="every way's token budget per forward (default: vllm serve's on this device)",
    )
    parser.add_argument(
        "--max-num-seqs", type=int, help="every way's sequences at once (default: vllm serve's on this device)"
    )
    parser.add_argument(
        "--kv-cache-memory-bytes",
        type=int,
        help="every way's KV cache (default: on a CPU, what the vllm engine sizes from free memory; on a GPU, "
        "each engine's default share); transformers serve gets it as a share of the RAM, on a CPU only",
    )
    parser.add_argument("--device", help="hf: cpu, cuda (default: cuda when available)")
    parser.add_argument("--dtype", help="float32, bfloat16, ... for every way (default: vLLM's auto; hf's default)")
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
    for name in ("max_num_batched_tokens", "max_num_seqs", "kv_cache_memory_bytes"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
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
    written = write_sessions(args.data, args.sessions, args.turns, work_dir / "sessions.json", seed=args.seed)
    sessions = written.sessions
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
        data=written.data,
    )
    setup.budget = choose_budget(setup, args.max_num_batched_tokens, args.max_num_seqs, args.kv_cache_memory_bytes)
    print(
        f"{len(sessions)} sessions ({written.distinct} distinct, {written.data['source']} data, seed {args.seed}) x "
        f"{args.turns} turns x {args.max_tokens} tokens on {args.engine}, model {args.model}; logs and runs in "
        f"{work_dir}",
        flush=True,
    )
    warning = publish_warning(len(sessions), args.threads)
    if warning:
        print(warning, flush=True)
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
