"""``sysbench-gpu generate``: flags, engine options, and the command (docs/generation.md).

The scheduler is ``generation.scheduler``; what each turn sees is ``generation.plan``. Errors that
need no model (a mismatched run directory, missing references, an ablation the data
cannot have) are found before the engine loads: ``job_from_args`` turns the flags into a checked
``generation.job.GenerationJob``, which the verb, ``generation.api.generate`` and a plan's step run.
"""

from __future__ import annotations

import argparse
import dataclasses

from sysbench_gpu.benchmarks.registry import benchmark_names, generation_presets
from sysbench_gpu.core.ablation_files import DEFAULT_DISTRACTOR_SEED
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.progress import add_progress_flags
from sysbench_gpu.core.redact import redact_settings
from sysbench_gpu.core.sessions import parse_session_ids
from sysbench_gpu.engines.base import SamplingSpec
from sysbench_gpu.generation.flags import check_generate_flags, engine_options_from_args, json_object
from sysbench_gpu.generation.job import GenerationJob, prepare_generation, run_generation_job
from sysbench_gpu.generation.plan import HISTORY_MODES
from sysbench_gpu.generation.settings import OVERFLOW_POLICIES, GenerateSettings
from sysbench_gpu.modeling.steering import Steering, read_steer_heads


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="generate replies turn by turn, all sessions together (resumable)",
        description="Generate replies for SysBench sessions or MT-Eval dialogues. With --history model all sessions "
        "advance together, one batched engine call per turn; records are appended after each call and a rerun resumes.",
    )
    parser.add_argument(
        "--data",
        required=True,
        help="data file or folder (SysBench or an MT-Eval task file, told apart by content), "
        "or 'demo' for the packaged demo set",
    )
    parser.add_argument(
        "--benchmark", choices=benchmark_names(), help="read --data as this benchmark's (default: by its format)"
    )
    parser.add_argument("--model", required=True, help="model path or hub id; 'smollm2' is the embedded model")
    parser.add_argument("--engine", required=True, choices=("vllm", "hf", "openai"))
    parser.add_argument("--out", required=True, help="run directory (created; reused to resume)")
    parser.add_argument("--limit", type=int, help="first N selected sessions")
    parser.add_argument("--sessions", help="session ids, e.g. 1,2,5-9")
    parser.add_argument(
        "--history",
        choices=HISTORY_MODES,
        default="model",
        help="model: the model's own earlier replies (default); reference: the reference replies "
        "(MT-Eval's gold context); single-turn (SysBench): each turn sees the system message and "
        "its own user message only",
    )
    parser.add_argument(
        "--distractor-turns",
        type=int,
        default=0,
        metavar="K",
        help="SysBench: K unrelated exchanges (other sessions' reference turns) between the system "
        "message and user turn 1",
    )
    parser.add_argument(
        "--distractor-seed",
        type=int,
        metavar="N",
        help=f"seed of the distractor draw (default {DEFAULT_DISTRACTOR_SEED})",
    )
    parser.add_argument(
        "--system-message",
        metavar="TEXT",
        help="MT-Eval: the system message (default: MT-Eval's assistant message; '' sends none)",
    )
    parser.add_argument("--task", help="MT-Eval: the task when the file name does not say (e.g. refinement_multi)")
    presets = generation_presets()
    parser.add_argument(
        "--preset",
        choices=sorted(presets),
        help="a benchmark's published decoding: "
        + "; ".join(f"{name}: {preset.description}" for name, (_, preset) in sorted(presets.items())),
    )
    parser.add_argument(
        "--skip-missing-reference",
        action="store_true",
        help="with --history reference, leave out sessions whose needed references are null",
    )
    parser.add_argument(
        "--on-overflow",
        choices=OVERFLOW_POLICIES,
        default="error",
        help="when prompt + max tokens exceeds the context (default: error)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")
    add_progress_flags(parser)
    sampling = parser.add_argument_group("sampling (default: the model's own generation config)")
    sampling.add_argument("--max-tokens", type=int)
    sampling.add_argument("--temperature", type=float)
    sampling.add_argument("--top-p", type=float)
    sampling.add_argument("--top-k", type=int)
    sampling.add_argument("--repetition-penalty", type=float)
    sampling.add_argument("--seed", type=int, help="sampling seed (also the engine seed for hf and vllm)")
    sampling.add_argument(
        "--ignore-eos",
        action="store_true",
        help="decode every reply to --max-tokens (for throughput comparisons; openai engine: vLLM's server field)",
    )
    hf = parser.add_argument_group("hf engine")
    hf.add_argument("--batch-size", type=int, help="sequences per generate() batch (default 32)")
    hf.add_argument("--device", help="cuda, cuda:1, cpu (default: cuda when available)")
    hf.add_argument("--device-map", help="'auto' spreads a large model over the GPUs through accelerate")
    hf.add_argument(
        "--cpu-threads",
        type=int,
        help="torch threads on a CPU (default: the cores idle at start; OMP_NUM_THREADS wins when set)",
    )
    hf.add_argument(
        "--steer-system",
        type=float,
        metavar="ALPHA",
        help="PASTA-style steering: add log ALPHA to the attention logits of the system text's keys (1: off)",
    )
    hf.add_argument("--steer-layers", help="layers to steer: mid-band (default), all, N or N-M, comma-separated")
    hf.add_argument("--steer-heads", metavar="FILE", help="JSON list of [layer, head] pairs to steer (the head map's)")
    both = parser.add_argument_group("hf and vllm engines")
    both.add_argument("--dtype", help="bfloat16, float16, float32 or auto")
    both.add_argument(
        "--data-parallel-size",
        type=int,
        help="N replicas of the engine as Ray actors, sessions split between them (default 1: no Ray)",
    )
    both.add_argument(
        "--ray-address",
        metavar="auto|HOST:PORT",
        help="join this Ray cluster for the replicas (default: a local Ray started for the run, on 127.0.0.1)",
    )
    vllm = parser.add_argument_group("vllm engine")
    vllm.add_argument("--tensor-parallel-size", type=int)
    vllm.add_argument("--pipeline-parallel-size", type=int)
    vllm.add_argument("--no-prefix-caching", action="store_true")
    vllm.add_argument("--max-model-len", type=int)
    vllm.add_argument("--gpu-memory-utilization", type=float)
    vllm.add_argument("--distributed-executor-backend", help="mp, ray or external_launcher (torchrun)")
    vllm.add_argument("--enforce-eager", action="store_true")
    vllm.add_argument(
        "--max-num-batched-tokens",
        type=int,
        help="tokens the scheduler puts in one forward (default: vLLM's for LLM(...), which differs from vllm serve's)",
    )
    vllm.add_argument("--max-num-seqs", type=int, help="sequences the scheduler runs at once (default: vLLM's)")
    vllm.add_argument(
        "--kv-cache-memory-bytes",
        type=int,
        help="KV cache size in bytes (default: vLLM's share of the GPU; on the CPU build, sized from free memory)",
    )
    openai = parser.add_argument_group("openai engine")
    openai.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1")
    openai.add_argument("--api-key-env", help="environment variable holding the API key (default OPENAI_API_KEY)")
    openai.add_argument("--concurrency", type=int)
    openai.add_argument("--max-retries", type=int)
    openai.add_argument("--timeout", type=float)
    openai.add_argument(
        "--extra-body",
        metavar="JSON",
        help="fields added to every request body, e.g. '{\"min_tokens\": 8}' (vLLM) or "
        '\'{"generation_config": "..."}\' (transformers serve)',
    )
    parser.set_defaults(func=_cmd_generate)


def sampling_from_args(args: argparse.Namespace) -> SamplingSpec:
    for name in ("max_tokens", "top_k"):
        value = getattr(args, name)
        if value is not None and value < (1 if name == "max_tokens" else 0):
            raise SysbenchError(f"--{name.replace('_', '-')} must be positive, got {value}")
    return SamplingSpec(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        ignore_eos=True if getattr(args, "ignore_eos", False) else None,
    )


_FROM_ARGS = object()  # settings_from_args: build the Steering from the flags


def steering_from_args(args: argparse.Namespace) -> Steering | None:
    """The ``--steer-*`` flags as a ``Steering``; None without ``--steer-system``."""
    alpha = getattr(args, "steer_system", None)
    layers, heads_file = getattr(args, "steer_layers", None), getattr(args, "steer_heads", None)
    if alpha is None:
        if layers or heads_file:
            raise SysbenchError("--steer-layers and --steer-heads need --steer-system")
        return None
    if args.engine != "hf":
        raise SysbenchError(
            f"--steer-system: the {args.engine} engine cannot hook attention (it runs its own kernels); use --engine hf"
        )
    heads = read_steer_heads(heads_file) if heads_file else None
    return Steering(alpha=alpha, layers_spec=layers, heads=heads, heads_file=heads_file)


def settings_from_args(args: argparse.Namespace, steering: Steering | None | object = _FROM_ARGS) -> GenerateSettings:
    """The run's settings from the flags; ``steering``: the flags' ``Steering`` when the caller already built it."""
    if args.distractor_seed is not None and not args.distractor_turns:
        raise SysbenchError("--distractor-seed needs --distractor-turns")
    if isinstance(getattr(args, "extra_body", None), str):
        args.extra_body = json_object(args.extra_body)  # the engine gets the object (engine_options_from_args)
    extra_body = getattr(args, "extra_body", None) or None
    if steering is _FROM_ARGS:
        steering = steering_from_args(args)
    assert steering is None or isinstance(steering, Steering)
    return GenerateSettings(
        model=args.model,
        engine=args.engine,
        history=args.history,
        sampling=sampling_from_args(args),
        on_overflow=args.on_overflow,
        skip_missing_reference=args.skip_missing_reference,
        distractor_turns=args.distractor_turns,
        distractor_seed=DEFAULT_DISTRACTOR_SEED if args.distractor_seed is None else args.distractor_seed,
        steering=None if steering is None else steering.describe(),
        # As the manifest stores it (engine_options.extra_body), so a resume compares like with like.
        extra_body=None if extra_body is None else redact_settings(extra_body, getattr(args, "secrets", None)),
    )


def apply_preset(args: argparse.Namespace) -> str | None:
    """Fill the decoding flags from ``--preset``; a flag given with another value is one line."""
    name = getattr(args, "preset", None)
    if name is None:
        return None
    benchmark, preset = generation_presets()[name]
    if args.benchmark not in (None, benchmark.name):
        raise SysbenchError(
            f"--preset {name} is for {benchmark.title or benchmark.name} data, not --benchmark {args.benchmark}"
        )
    args.benchmark = benchmark.name
    for flag, value in (
        ("temperature", preset.temperature),
        ("max_tokens", preset.max_tokens),
        ("system_message", preset.system_message),
        ("repetition_penalty", preset.repetition_penalty),
    ):
        given = getattr(args, flag)
        if value is None or given == value:
            continue
        if given is not None:
            raise SysbenchError(
                f"--preset {name} sets --{flag.replace('_', '-')} {value!r}; drop --{flag.replace('_', '-')} {given!r}"
            )
        setattr(args, flag, value)
    return name


def _cmd_generate(args: argparse.Namespace) -> int:
    job = job_from_args(args)
    summary, primary = run_generation_job(job, progress=not args.no_progress, log_every=args.log_every)
    if primary:
        run_dir = job.run_dir
        print(
            f"{run_dir.generations.path}: {summary.total_records} records ({summary.new_records} new, "
            f"{summary.skipped_records} skipped); statistics in {run_dir.stats_path}"
        )
    return 0


def job_from_args(args: argparse.Namespace) -> GenerationJob:
    """The generate call the flags ask for, checked: flags, data, an existing run directory; nothing made or loaded.

    The verb, ``generation.api.generate`` and a plan's step (``plans.status``) all start here (docs/cli.md:
    parse, validate, create folders, load models, write).
    """
    check_generate_flags(args)
    preset = apply_preset(args)
    steering = steering_from_args(args)
    settings = dataclasses.replace(settings_from_args(args, steering), preset=preset)
    return prepare_generation(
        settings,
        data=args.data,
        out=args.out,
        engine_options=engine_options_from_args(args.engine, args),
        benchmark=args.benchmark,
        system_message=args.system_message,
        task=args.task,
        system_ids=parse_session_ids(args.sessions),
        limit=args.limit,
        steering=steering,
        secrets=getattr(args, "secrets", None),
    )
