"""Knockout's cost against a plain forward, measured in one run.

For each sequence length T the same model and token ids run as:

* ``plain``: a teacher-forced forward with every logit kept (what knockout's plain arm runs);
* ``knockout``: the same forward with the system span's keys hidden from every later query
  at the chosen layers (``modeling.key_bias`` with -inf: SDPA with a dense additive mask at
  those layers, plain SDPA elsewhere).

Both are timed interleaved, their order reversed on every repeat, after one untimed warm-up
each (``bench_attention_capture.interleaved``); medians are reported with the ratio
``knockout / plain``. The stage runs both forwards per conversation, so one knockout row
costs about ``1 + ratio`` plain forwards. Peak memory above the pre-forward level comes
from the same helper (CUDA: the allocator's peak; CPU: peak RSS).

Inputs: random token ids with a 3-token lead and a 300-token system span (``--model tiny``,
a random-weight Llama, or ``smollm2`` / a model folder).

Usage::

    python kernels_bench/bench_knockout.py                                   # tiny random Llama, CPU
    python kernels_bench/bench_knockout.py --model smollm2 --lengths 512,1024,2048 --layers mid-band
    python kernels_bench/bench_knockout.py --device cuda --model smollm2 --lengths 2048,8192 --json F
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_attention_capture import build_model, default_dtype, interleaved, random_inputs  # noqa: E402

from sysbench_gpu.modeling.key_bias import PATH, key_bias  # noqa: E402
from sysbench_gpu.modeling.layer_bands import parse_layer_band  # noqa: E402
from sysbench_gpu.modeling.registry import attention_modules  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--model", default="tiny", help="tiny (random-weight Llama), smollm2, or a model path")
    parser.add_argument("--lengths", default="512,1024,2048", help="sequence lengths")
    parser.add_argument("--layers", default="mid-band", help="knockout layers: mid-band, all, N or N-M")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per measurement (median reported)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    return parser.parse_args(argv)


def measure(model: Any, lengths: list[int], layers: list[int], device: str, repeats: int) -> list[dict[str, Any]]:
    """One row per length: median seconds and peak MiB of plain and knockout, and their ratio."""
    make = random_inputs(model.config.vocab_size, device)
    rows = []
    with key_bias(model, layers, float("-inf")) as bias:
        for length in lengths:
            ids, spans = make(length)
            system = spans[1]

            def plain(ids: Any = ids) -> None:
                bias.set_spans([])
                with torch.inference_mode():
                    model(input_ids=ids, use_cache=False)

            def knockout(ids: Any = ids, system: tuple[int, int] = system) -> None:
                bias.set_spans([system])
                with torch.inference_mode():
                    model(input_ids=ids, use_cache=False)

            timed = interleaved({"plain": plain, "knockout": knockout}, device, repeats)
            (plain_s, plain_peak), (knock_s, knock_peak) = timed["plain"], timed["knockout"]
            rows.append(
                {
                    "T": length,
                    "layers": len(layers),
                    "plain_s": round(plain_s, 4),
                    "knockout_s": round(knock_s, 4),
                    "ratio": round(knock_s / plain_s, 3),
                    "plain_peak_mib": round(plain_peak / 2**20, 1),
                    "knockout_peak_mib": round(knock_peak / 2**20, 1),
                }
            )
            print_rows(rows[-1:], header=len(rows) == 1)
    return rows


def print_rows(rows: list[dict[str, Any]], header: bool = True) -> None:
    names = ("T", "layers", "plain_s", "knockout_s", "ratio", "plain_peak_mib", "knockout_peak_mib")
    if header:
        print("  ".join(f"{name:>17}" for name in names))
    for row in rows:
        print("  ".join(f"{row[name]!s:>17}" for name in names), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, _ = build_model(args.model, default_dtype(args.device), args.device)
    layers = parse_layer_band(args.layers, len(attention_modules(model)), flag="--layers")
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    print(f"model {args.model} on {args.device}, knockout layers {args.layers} ({len(layers)}); path: {PATH}")
    rows = measure(model, lengths, layers, args.device, args.repeats)
    if args.json:
        Path(args.json).write_text(json.dumps({"path": PATH, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
