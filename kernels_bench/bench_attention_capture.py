"""Attention-share capture versus eager materialization (``output_attentions=True``).

For each sequence length T the same model and inputs run three ways:

* ``plain``: a normal SDPA forward (no capture): the baseline cost;
* ``capture``: the same forward with ``AttentionShareCapture`` at the selected layers
  (chunked span shares, no T x T tensor);
* ``eager``: eager attention with ``output_attentions=True`` (every layer's
  heads x T x T matrix materialized), span shares summed from it, as upstream did.

It prints per T: time and peak extra memory of each, and the ratios eager/capture
(memory, time) and capture/plain (time, memory): the cost of capture. All ratios
come from one run of this script. Peak memory is ``torch.cuda.max_memory_allocated``
above the pre-forward allocation on CUDA; on CPU it is the peak RSS (VmHWM, reset
through /proc/self/clear_refs, after malloc_trim) above the pre-forward RSS. Eager is skipped where its
attention matrices alone would exceed ``--eager-max-gib``.

Usage::

    python kernels_bench/bench_attention_capture.py                      # tiny random Llama, CPU
    python kernels_bench/bench_attention_capture.py --device cuda --model smollm2 --lengths 1024,2048,4096,8192,16384
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sysbench_gpu.attn_hooks import AttentionShareCapture, eager_reference_shares, resolve_layers  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--model", default="tiny", help="tiny (random-weight Llama, GQA), smollm2, or a model path")
    parser.add_argument("--lengths", default="1024,2048,4096,8192", help="sequence lengths")
    parser.add_argument("--layers", default="mid,last", help="layers to capture (mid, last, numbers)")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16, float16")
    parser.add_argument("--repeats", type=int, default=1, help="timed repeats per measurement (median reported)")
    parser.add_argument("--chunk-mib", type=int, default=32, help="capture's score-block budget (MiB)")
    parser.add_argument("--eager-max-gib", type=float, default=4.0, help="skip eager when its attention matrices exceed this")
    parser.add_argument("--json", help="also write the results to this JSON file")
    return parser.parse_args()


def build_model(name: str, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if name == "tiny":
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768,
        )
        model = LlamaForCausalLM(config).to(dtype)
    else:
        from sysbench_gpu.models import resolve_model

        model = AutoModelForCausalLM.from_pretrained(resolve_model(name), dtype=dtype)
    return model.to(device).eval()


class PeakMemory:
    """Peak extra memory of a block: CUDA allocator peak, or CPU peak RSS."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")

    def __enter__(self) -> "PeakMemory":
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            _release_free_heap()
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
            self.base = _status_kib("VmRSS") * 1024
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.base
        else:
            self.peak = _status_kib("VmHWM") * 1024 - self.base


def _release_free_heap() -> None:
    """Return freed heap pages to the OS so the RSS baseline is what is really in use."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure(run, device: str, repeats: int) -> tuple[float, int]:
    """Median seconds and max peak extra bytes over repeats (after one untimed warm-up)."""
    run()
    times, peaks = [], []
    for _ in range(repeats):
        with PeakMemory(device) as memory:
            started = time.perf_counter()
            run()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
        peaks.append(memory.peak)
    return statistics.median(times), max(peaks)


def main() -> int:
    args = parse_args()
    dtype = getattr(torch, args.dtype)
    model = build_model(args.model, dtype, args.device)
    config = model.config
    n_layers = config.num_hidden_layers
    layers = sorted(set(resolve_layers(args.layers, n_layers).values()))
    heads = config.num_attention_heads
    element = torch.finfo(dtype).bits // 8
    lengths = [int(x) for x in args.lengths.split(",")]
    print(f"model {args.model}: {n_layers} layers, {heads} heads / {config.num_key_value_heads} KV heads, "
          f"{args.dtype}, device {args.device}, capture layers {layers}, threads {torch.get_num_threads()}")
    header = (f"{'T':>6} {'plain s':>8} {'capture s':>9} {'eager s':>8} {'plain MiB':>9} {'capture MiB':>11} "
              f"{'eager MiB':>9} {'eager/cap mem':>13} {'eager/cap time':>14} {'cap/plain time':>14} {'max|diff|':>9}")
    print(header)
    results = []
    for length in lengths:
        ids = torch.randint(0, min(config.vocab_size, 1000), (1, length), generator=torch.Generator().manual_seed(length)).to(args.device)
        spans = [(0, 3), (3, length // 3)]

        def plain() -> None:
            with torch.inference_mode():
                model(input_ids=ids, use_cache=False, logits_to_keep=1)

        captured = {}

        def capture() -> None:
            with AttentionShareCapture(model, layers=layers, spans=spans, budget_bytes=args.chunk_mib << 20) as cap:
                captured.update(cap.forward(ids, stop_early=False))

        t_plain, m_plain = measure(plain, args.device, args.repeats)
        t_cap, m_cap = measure(capture, args.device, args.repeats)
        eager_bytes = n_layers * heads * length * length * element
        row = {"T": length, "plain_s": t_plain, "capture_s": t_cap, "plain_peak": m_plain, "capture_peak": m_cap,
               "eager_s": None, "eager_peak": None, "eager_attention_bytes": eager_bytes, "max_abs_diff": None}
        if eager_bytes <= args.eager_max_gib * (1 << 30):
            eager_shares = {}

            def eager() -> None:
                with torch.inference_mode():
                    attentions = model(input_ids=ids, use_cache=False, logits_to_keep=1, output_attentions=True).attentions
                    for layer in layers:
                        eager_shares[layer] = eager_reference_shares(attentions[layer], spans).mean(dim=1)

            model.set_attn_implementation("eager")
            try:
                row["eager_s"], row["eager_peak"] = measure(eager, args.device, args.repeats)
            finally:
                model.set_attn_implementation("sdpa")
            row["max_abs_diff"] = max(
                float((eager_shares[layer].float().cpu() - captured[layer].mean).abs().max()) for layer in layers
            )
        results.append(row)
        mib = lambda b: "-" if b is None else f"{b / (1 << 20):.0f}"  # noqa: E731
        ratio = lambda a, b: "-" if a is None or b is None or b <= 0 else f"{a / b:.2f}"  # noqa: E731
        secs = lambda s: "-" if s is None else f"{s:.2f}"  # noqa: E731
        print(f"{length:>6} {secs(t_plain):>8} {secs(t_cap):>9} {secs(row['eager_s']):>8} {mib(m_plain):>9} {mib(m_cap):>11} "
              f"{mib(row['eager_peak']):>9} {ratio(row['eager_peak'], m_cap):>13} {ratio(row['eager_s'], t_cap):>14} "
              f"{ratio(t_cap, t_plain):>14} {'-' if row['max_abs_diff'] is None else format(row['max_abs_diff'], '.1e'):>9}",
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
