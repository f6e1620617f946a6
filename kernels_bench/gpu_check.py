"""The GPU check: one command, offline, that shows what the GPU paths do on this machine.

    python kernels_bench/gpu_check.py [--device cuda] [--quick] [--json FILE]

1. runs the ``gpu``-marked tests (``pytest -m gpu`` in a subprocess; on a CPU device
   they are reported as skipped, not run);
2. builds random-weight models from real configurations (Qwen2-7B and Llama-3.1-8B:
   layers, hidden size, heads, KV heads, MLP size, vocabulary from the project's table
   ``sysbench_gpu/model_configs.json``; RoPE and norm below) directly on the device, bf16
   on CUDA. With ``--quick`` or on a CPU the same architectures are scaled
   down (2 layers, 32-dim heads with the same GQA grouping, a 2048-token vocabulary, fp32)
   so the whole check takes a few minutes on two cores;
3. measures attention capture against a plain forward and against eager attention at
   T = 2k ... 32k where they fit (``--quick``: 512 and 1024), with time and peak memory
   of the device in use, through ``measure(...)`` of ``bench_attention_capture.py``;
4. measures hf-engine generation turn-synchronously against one session at a time on
   the same models (``bench_turn_sync.compare``), every reply forced to the same length;
5. runs the head to head of ``bench_vs_upstream.py`` on the hf engine with each model
   (``--h2h-layers`` of its layers, saved to a temporary folder; distinct sessions, shuffled
   with ``--seed``): (a) upstream's client threads against ``transformers serve`` (continuous
   batching), (b) ``generate --engine hf`` in process, (c) ``generate --engine openai``
   against the same server. These are two engines, not one: (a) and (c) run transformers'
   continuous batching with its paged cache, (b) static ``generate()`` batches, so the ratio
   (a)/(b) mixes the engine with the schedule (the row says so in ``engines``). Where
   ``transformers serve`` cannot run (its serving extras, ``transformers[serving]``, are
   missing), it says so in one line and runs (b) alone;
6. checks that every way of steps 4 and 5 decoded the same turns and output tokens (every
   reply forced to ``--max-tokens``), prints the check and exits 1 where it fails;
7. prints a table and, with ``--json``, writes ``attention``, ``generation`` and
   ``head_to_head`` row lists and ``token_check`` with the device, the torch version and the
   configurations used.

Nothing is downloaded: the models are random, and the tokenizer is a small byte-level
BPE trained in memory on the packaged demo sessions (token ids beyond its vocabulary
decode to nothing, so a random model's replies still decode). Timings on a shared
machine move with its load; compare ratios from one run only.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib
import inspect
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(BENCH_DIR))

# The published shapes come from the project's table of public config.json fields
# (sysbench_gpu/model_configs.json, which the roofline also reads); the RoPE and norm
# fields it does not hold are added here, as published in the same config.json files.
MODELS = ("qwen2-7b", "llama-3.1-8b")
SHAPE_FIELDS = (
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "tie_word_embeddings",
)
ROPE_AND_NORM: dict[str, dict[str, Any]] = {
    "qwen2-7b": {"rope_theta": 1000000.0, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6},
    "llama-3.1-8b": {
        "rope_theta": 500000.0,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
}
FULL_LENGTHS = [2048, 4096, 8192, 16384, 32768]
QUICK_LENGTHS = [512, 1024]
SCALED_LAYERS, SCALED_HEAD_DIM, SCALED_VOCAB = 2, 32, 2048
TOKENIZER_VOCAB = 1000
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
DEFAULT_MEASURE = "bench_attention_capture:measure"
MEASURE_CONTRACT = ("model", "lengths", "layers", "device")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--device", default=None, help="cuda, cuda:1 or cpu (default: cuda when available)")
    parser.add_argument("--quick", action="store_true", help="scaled-down shapes and short sequences")
    parser.add_argument("--json", help="write the results to this JSON file")
    parser.add_argument("--models", default=",".join(MODELS), help=f"which configurations ({', '.join(MODELS)})")
    parser.add_argument("--lengths", help="attention sequence lengths (default: 2k..32k; --quick: 512,1024)")
    parser.add_argument("--repeats", type=int, help="timed repeats per attention measurement (default 3; --quick 1)")
    parser.add_argument("--eager-max-gib", type=float, default=4.0, help="skip eager where its matrices exceed this")
    parser.add_argument("--sessions", type=int, help="generation: sessions (default 32; --quick 4)")
    parser.add_argument("--turns", type=int, help="generation: turns per session (default 3; --quick 2)")
    parser.add_argument("--max-tokens", type=int, help="generation: tokens per reply (default 64; --quick 8)")
    parser.add_argument("--skip-tests", action="store_true", help="do not run the gpu-marked tests")
    parser.add_argument("--no-head-to-head", action="store_true", help="skip the three-way comparison (step 5)")
    parser.add_argument(
        "--h2h-layers", type=int, default=8, help="head to head: layers of the model (default 8; full width)"
    )
    parser.add_argument("--threads", type=int, default=20, help="head to head: upstream's client threads (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="head to head: the sessions' shuffle (default 0)")
    parser.add_argument(
        "--attention-measure",
        default=DEFAULT_MEASURE,
        metavar="MODULE:FUNCTION",
        help=f"the attention measurement to call (default {DEFAULT_MEASURE})",
    )
    return parser.parse_args(argv)


# ------------------------------------------------------------------ pieces


def published_config(name: str) -> dict[str, Any]:
    """The fields of the model's published config.json that build it: shape from the shared table, RoPE and norm."""
    from sysbench_gpu.profiling.model_config import reference_configs

    table = reference_configs()[name]
    return {**{field: table[field] for field in SHAPE_FIELDS}, **copy.deepcopy(ROPE_AND_NORM[name])}


def model_config(name: str, scaled: bool) -> dict[str, Any]:
    """The published configuration, or the same architecture scaled down (same GQA grouping and RoPE)."""
    config = published_config(name)
    if scaled:
        groups = config["num_attention_heads"] // config["num_key_value_heads"]
        kv_heads = max(1, config["num_key_value_heads"] // 4)
        heads = kv_heads * groups
        hidden = heads * SCALED_HEAD_DIM
        ratio = config["intermediate_size"] / config["hidden_size"]
        config.update(
            num_hidden_layers=SCALED_LAYERS,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            intermediate_size=int(hidden * ratio) // 8 * 8,
            vocab_size=SCALED_VOCAB,
        )
    return config


def build_model(config: dict[str, Any], device: str, dtype: Any) -> Any:
    """A random-weight causal LM created directly on ``device`` (no host copy of the weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    options = copy.deepcopy(config)  # transformers rewrites nested RoPE dicts in place
    model_type = options.pop("model_type")
    hf_config = AutoConfig.for_model(model_type, **options)
    hf_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    return model.eval()


def offline_tokenizer(texts: list[str]) -> Any:
    """A byte-level BPE tokenizer trained in memory (deterministic, no download), with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|im_start|>", "<|im_end|>", "<pad>"]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    core.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<pad>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def load_measure(reference: str) -> Callable[..., list[dict[str, Any]]]:
    """The attention measurement, checked against the contract this script calls it with."""
    module_name, _, attribute = reference.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise SystemExit(f"gpu_check: cannot import {reference} ({error})") from None
    parameters = inspect.signature(function).parameters
    missing = [name for name in MEASURE_CONTRACT if name not in parameters]
    if missing:
        raise SystemExit(
            f"gpu_check: {reference} has no parameter(s) {', '.join(missing)}: it must be "
            "measure(model, lengths, layers, device, repeats=3, eager=True, eager_max_gib=4.0, chunk_mib=32, "
            "input_ids_for=None) -> list[dict] (the attention-capture rework of bench_attention_capture.py)"
        )
    return function


def visible_devices_for(device: str, visible: str | None) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for a child that should see only ``device`` (None: leave it as it is).

    ``cuda:N`` counts among the GPUs this process sees, so it picks the N-th entry of an
    existing ``CUDA_VISIBLE_DEVICES`` (an index or a ``GPU-...``/``MIG-...`` UUID, passed on as
    written), not physical GPU N.
    """
    if ":" not in device:
        return None
    index_text = device.split(":", 1)[1]
    if not index_text.isdigit():
        raise SystemExit(f"gpu_check: --device {device!r} is not cuda:N")
    index = int(index_text)
    if visible is None:
        return str(index)
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if index >= len(entries):
        raise SystemExit(
            f"gpu_check: --device {device}: CUDA_VISIBLE_DEVICES={visible!r} makes only {len(entries)} GPU(s) visible"
        )
    return entries[index]


def run_gpu_tests(device: str) -> dict[str, Any]:
    """``pytest -m gpu`` in a subprocess on CUDA; on a CPU device the tests are reported as skipped."""
    if not device.startswith("cuda"):
        return {"status": "skipped", "reason": f"device {device}: the gpu-marked tests need CUDA"}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    visible = visible_devices_for(device, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    lines = (result.stdout + result.stderr).strip().splitlines()
    summary = next((line for line in reversed(lines) if re.search(r"\d+ (passed|failed|skipped|error)", line)), "")
    counts = {
        kind: int(number) for number, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summary)
    }
    return {
        "status": "passed" if result.returncode == 0 else "failed",
        "returncode": result.returncode,
        "summary": summary.strip("= "),
        "counts": counts,
        "wall_s": round(time.perf_counter() - started, 1),
        "tail": lines[-30:] if result.returncode else [],
    }


def capture_layers(config: dict[str, Any]) -> list[int]:
    last = config["num_hidden_layers"] - 1
    return sorted({last // 2, last})


def fits(config: dict[str, Any], lengths: list[int]) -> list[int]:
    return [length for length in lengths if length <= config["max_position_embeddings"]]


def release(device: str) -> None:
    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


# ------------------------------------------------------------------ the check


def check(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may be downloaded
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    import transformers
    from bench_turn_sync import compare, pick_sessions

    from sysbench_gpu.engines.hf import HFEngine

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    on_cuda = device.startswith("cuda")
    if on_cuda and not torch.cuda.is_available():
        raise SystemExit("gpu_check: --device cuda but torch sees no CUDA device")
    if on_cuda and ":" in device:
        torch.cuda.set_device(torch.device(device))  # allocations and peak statistics on the chosen GPU
    scaled = args.quick or not on_cuda
    dtype = torch.bfloat16 if on_cuda else torch.float32
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else (QUICK_LENGTHS if scaled else FULL_LENGTHS)
    repeats = args.repeats or (1 if args.quick else 3)
    sessions_count = args.sessions or (4 if args.quick else 32)
    turns = args.turns or (2 if args.quick else 3)
    max_tokens = args.max_tokens or (8 if args.quick else 64)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise SystemExit(f"gpu_check: unknown model(s) {', '.join(unknown)} (choose from {', '.join(MODELS)})")
    measure = load_measure(args.attention_measure)  # fail before any model is built

    report: dict[str, Any] = {
        "device": device,
        "device_name": torch.cuda.get_device_name(torch.device(device)) if on_cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "quick": args.quick,
        "scaled_shapes": scaled,
        "dtype": str(dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "attention_measure": args.attention_measure,
        "configs": {},
        "gpu_tests": {"status": "not run"} if args.skip_tests else run_gpu_tests(device),
        "attention": [],
        "generation": [],
        "head_to_head": [],
    }
    gpu_tests = report["gpu_tests"]
    print(f"gpu tests: {gpu_tests.get('summary') or gpu_tests.get('reason') or gpu_tests['status']}", flush=True)
    _, sessions = pick_sessions(None, sessions_count, turns)
    texts = [s.system_prompt for s in sessions] + [t.user for s in sessions for t in s.turns]
    tokenizer = offline_tokenizer(texts)
    for name in names:
        config = model_config(name, scaled)
        report["configs"][name] = config
        started = time.perf_counter()
        model = build_model(config, device, dtype)
        params = sum(p.numel() for p in model.parameters())
        print(
            f"\n{name}: {params / 1e6:,.1f}M parameters, {report['dtype']} on {device}, built in "
            f"{time.perf_counter() - started:.1f} s",
            flush=True,
        )
        layers = capture_layers(config)
        usable = fits(config, lengths)
        rows = measure(
            model, usable, layers, device, repeats=repeats, eager=True, eager_max_gib=args.eager_max_gib, chunk_mib=32
        )
        for row in rows:
            report["attention"].append({"model": name, "layers": layers, **row})
        release(device)

        engine = HFEngine.from_model(model, tokenizer, name=name, batch_size=len(sessions), ignore_eos=True)
        row = compare(engine, sessions, turns, max_tokens)
        report["generation"].append(
            {"model": name, **{k: v for k, v in row.items() if k != "per_turn"}, "per_turn": row["per_turn"]}
        )
        del engine, model
        release(device)
        if not args.no_head_to_head:
            h2h_config = dict(config, num_hidden_layers=min(args.h2h_layers, config["num_hidden_layers"]))
            row = head_to_head(name, h2h_config, tokenizer, device, dtype, sessions_count, turns, max_tokens, args)
            report["head_to_head"].append(row)
            release(device)
    return report


def serve_available() -> tuple[bool, str]:
    """Whether ``transformers serve`` can start here, and if not, why (one line)."""
    import importlib.util

    missing = [name for name in ("fastapi", "uvicorn", "pydantic", "openai") if importlib.util.find_spec(name) is None]
    if missing:
        return False, f"transformers serve needs transformers[serving]; missing: {', '.join(missing)}"
    return True, ""


def head_to_head(
    name: str,
    config: dict[str, Any],
    tokenizer: Any,
    device: str,
    dtype: Any,
    sessions_count: int,
    turns: int,
    max_tokens: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The three ways of ``bench_vs_upstream`` on the hf engine, with this model saved to a temporary folder."""
    import tempfile

    from bench_vs_upstream import METHODS, Setup, profile_prediction, summarize, three_ways, write_sessions

    work = Path(tempfile.mkdtemp(prefix=f"gpu-check-h2h-{name}-"))
    model_dir = work / "model"
    model = build_model(config, device, dtype)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    del model
    release(device)
    available, why = serve_available()
    if not available:
        print(f"gpu_check: head to head runs (b) in process alone: {why}", flush=True)
    dtype_name = str(dtype).replace("torch.", "")
    written = write_sessions("demo", sessions_count, turns, work / "sessions.json", seed=args.seed)
    setup = Setup(
        engine="hf",
        model=str(model_dir),
        model_path=str(model_dir),
        sessions=written.sessions,
        data=written.data,
        data_file=work / "sessions.json",
        turns=turns,
        max_tokens=max_tokens,
        threads=args.threads,
        server_concurrency=sessions_count,
        work_dir=work,
        device=device,
        dtype=dtype_name,
        methods=METHODS if available else ("in_process",),
    )
    print(f"\n{name} head to head ({config['num_hidden_layers']} layers) in {work}", flush=True)
    results = three_ways(setup)
    spec = device_spec_name(device)
    prediction = profile_prediction(work / "run-in-process", args.threads, spec, work / "bench.log") if spec else None
    summary = summarize(setup, results, prediction)
    return {
        **summary,
        "model": name,
        "model_dir": summary["model"],
        "layers": config["num_hidden_layers"],
        "engine": "hf",
        "server": "transformers serve --continuous-batching" if available else None,
        "serve_missing": why or None,
        "engines": HF_ENGINES,
    }


# The hf head to head compares two engines, not two schedules on one engine.
HF_ENGINES = {
    "upstream": "transformers serve --continuous-batching (paged KV cache, requests join and leave every step)",
    "in_process": "transformers generate() (static padded batches, a new cache per call)",
    "server": "transformers serve --continuous-batching (paged KV cache, requests join and leave every step)",
}


def token_check(report: dict[str, Any]) -> list[str]:
    """Every way of the generation comparison and the head to head that did not decode N x T x M tokens."""
    problems = []
    for row in report["generation"]:
        expected = row["sessions"] * row["turns"] * row["max_tokens"]
        if row["output_tokens"] != expected:
            problems.append(
                f"{row['model']} generation: {row['output_tokens']} output tokens in each mode, expected {expected}"
            )
    for row in report["head_to_head"]:
        problems += [f"{row['model']} head to head: {problem}" for problem in row["checks"]["problems"]]
    return problems


def device_spec_name(device: str) -> str | None:
    """The packaged device spec for this GPU (profile needs one on a GPU), or None."""
    import torch

    if not device.startswith("cuda"):
        return "cpu"
    name = torch.cuda.get_device_name(torch.device(device)).lower()
    return next((spec for spec in ("h200", "h100", "a100") if spec in name), None)


# ------------------------------------------------------------------ output


def _fmt(value: Any, spec: str = ".2f") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def print_tables(report: dict[str, Any]) -> None:
    print(
        f"\ndevice {report['device']} ({report['device_name']}), torch {report['torch']}, "
        f"transformers {report['transformers']}, {report['dtype']}, "
        f"{'scaled-down shapes' if report['scaled_shapes'] else 'full shapes'}"
    )
    gpu_tests = report["gpu_tests"]
    print(f"gpu tests: {gpu_tests.get('summary') or gpu_tests.get('reason') or gpu_tests['status']}")
    print("\nattention capture (time s, peak MiB of the device in use)")
    header = (
        f"{'model':<14}{'T':>7}{'plain s':>9}{'capture s':>10}{'eager s':>9}{'cap/plain t':>12}"
        f"{'plain MiB':>10}{'cap MiB':>9}{'eager MiB':>10}{'eager/cap mem':>14}{'max|diff|':>10}"
    )
    print(header)
    for row in report["attention"]:
        print(
            f"{row['model']:<14}{row['tokens']:>7}{_fmt(row.get('plain_s')):>9}{_fmt(row.get('capture_s')):>10}"
            f"{_fmt(row.get('eager_s')):>9}{_fmt(row.get('capture_over_plain_time')):>12}"
            f"{_fmt(row.get('plain_peak_mib'), '.0f'):>10}{_fmt(row.get('capture_peak_mib'), '.0f'):>9}"
            f"{_fmt(row.get('eager_peak_mib'), '.0f'):>10}{_fmt(row.get('eager_over_capture_memory')):>14}"
            f"{_fmt(row.get('max_abs_diff_vs_eager'), '.1e'):>10}"
        )
    print("\nhf generation: turn-synchronous (a) vs one session at a time (b), replies forced to max tokens")
    print(
        f"{'model':<14}{'sessions':>9}{'turns':>6}{'tokens':>7}{'(a) s':>9}{'(b) s':>9}{'(a) tok/s':>10}"
        f"{'(b) tok/s':>10}{'(b)/(a)':>8}"
    )
    for row in report["generation"]:
        print(
            f"{row['model']:<14}{row['sessions']:>9}{row['turns']:>6}{row['max_tokens']:>7}{row['turn_sync_s']:>9.2f}"
            f"{row['sequential_s']:>9.2f}{row['turn_sync_tok_s']:>10.1f}{row['sequential_tok_s']:>10.1f}"
            f"{row['sequential_over_turn_sync_time']:>8.2f}"
        )


def print_head_to_head(report: dict[str, Any]) -> None:
    if not report.get("head_to_head"):
        return
    print(
        "\nhead to head on hf, two engines: (a) upstream's threads and (c) generate through transformers serve's "
        "continuous batching, (b) generate in process with static generate() batches"
    )
    print(f"{'model':<14}{'method':<12}{'wall s':>9}{'tokens':>8}{'tok/s':>9}{'x (a)':>8}")
    for row in report["head_to_head"]:
        for method in row["methods"]:
            ratio = method["ratio_to_upstream"]
            print(
                f"{row['model']:<14}{method['name']:<12}{method['wall_s']:>9.2f}{method['output_tokens']:>8}"
                f"{method['output_tok_s'] or 0:>9.1f}{'-' if ratio is None else format(ratio, '.2f'):>8}"
            )
        if row.get("serve_missing"):
            print(f"{row['model']:<14}{row['serve_missing']}")
        predicted = row.get("profile_predicted_ratio")
        if row.get("measured_ratio") is not None:
            print(
                f"{row['model']:<14}(a)/(b) measured {row['measured_ratio']:.2f}, profile predicted "
                + ("-" if predicted is None else f"{predicted:.2f}")
            )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    report = check(args)
    report["wall_s"] = round(time.perf_counter() - started, 1)
    print_tables(report)
    print_head_to_head(report)
    problems = token_check(report)
    report["token_check"] = {"ok": not problems, "problems": problems}
    ways = sum(len(row["methods"]) for row in report["head_to_head"]) + 2 * len(report["generation"])
    if problems:
        print("\ntoken check FAILED: " + "; ".join(problems))
    else:
        print(f"\ntoken check: every way ({ways} in all) decoded the same turns and output tokens")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
        print(f"\nwrote {args.json}")
    failed = report["gpu_tests"].get("status") == "failed" or bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
