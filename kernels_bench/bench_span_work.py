"""The capture's own work at one layer, apart from the model: span sums against the kernel.

A whole-forward benchmark (``bench_attention_capture.py``) reads the capture's cost as a
small difference between two long forwards, and on a shared machine that difference drowns
in noise. This times the pieces of one captured layer directly, on random fp32 queries and
keys of the given head shape:

* ``kernel``: the attention kernel that also returns the row log-sum-exp (SDPA's CPU
  flash kernel on the CPU, the flash or efficient kernel on CUDA), i.e. the call the layer
  makes anyway;
* ``kernel-lse``: the extra work of the kernel-LSE path, the LSE over the span keys;
* ``fallback``: the extra work of the fallback path, every row's LSE over all visible keys
  plus the span LSE.

Each extra is timed with the chunk plan the stage would choose on this device
(``plan_chunks(..., device_type)``) and, on the CPU, with the plan sized by the memory budget
alone (what the CPU used before the cache-sized block plan), so the two can be compared.
Medians of ``--repeats``, all runs interleaved, after one warm-up. ``measure_layer`` is also
what ``estimate_attention_run.py --measure-capture`` times at a model's head shape.

Usage::

    python kernels_bench/bench_span_work.py                               # SmolLM2's shape: 9 heads over 3, d 64
    python kernels_bench/bench_span_work.py --heads 64 --kv-heads 8 --head-dim 128 --span 298
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any


def _plan_key(name: str) -> str:
    return name.replace(" ", "_").replace("-", "_")


def measure_layer(
    query: Any,
    key: Any,
    value: Any,
    spans: list[tuple[int, int]],
    plans: Mapping[str, str],
    budget_bytes: int,
    repeats: int,
) -> dict[str, Any]:
    """Median seconds of one captured layer's pieces: ``kernel_s`` (the LSE kernel the layer calls
    anyway) and, for each named plan (a ``plan_chunks`` device type), ``kernel_lse_s_<plan>`` and
    ``fallback_s_<plan>`` with the chunk lengths used in ``plan_<plan>``. Every run once untimed,
    then all of them interleaved over ``repeats``, so a change of load hits them alike."""
    import torch

    from sysbench_gpu.attention.capture.chunks import plan_chunks
    from sysbench_gpu.attention.capture.kernels import KernelInputs, choose_kernel
    from sysbench_gpu.attention.capture.span_math import span_share, span_share_given_lse

    choice = choose_kernel(query, key, value, None, "sdpa")
    if choice.function is None:
        raise SystemExit(f"no LSE kernel takes these inputs on {query.device}: {choice.reason}")
    kernel, inputs = choice.function, KernelInputs(None, True)
    lse = kernel(query, key, value, None, inputs).lse
    tokens = query.shape[2]
    result: dict[str, Any] = {"tokens": tokens, "kernel": choice.name}
    runs: dict[str, Callable[[], object]] = {"kernel_s": lambda: kernel(query, key, value, None, inputs)}
    for name, plan_device in plans.items():
        given = plan_chunks(1, query.shape[1], tokens, spans[-1][1], budget_bytes, device_type=plan_device)
        full = plan_chunks(1, query.shape[1], tokens, tokens, budget_bytes, device_type=plan_device)
        result[f"plan_{_plan_key(name)}"] = {
            "lse": [given.q_chunk, given.k_chunk],
            "fallback": [full.q_chunk, full.k_chunk],
        }
        runs[f"kernel_lse_s_{_plan_key(name)}"] = functools.partial(
            span_share_given_lse, query, key, spans, lse, q_chunk=given.q_chunk, k_chunk=given.k_chunk
        )
        runs[f"fallback_s_{_plan_key(name)}"] = functools.partial(
            span_share, query, key, spans, q_chunk=full.q_chunk, k_chunk=full.k_chunk
        )
    sync = torch.cuda.synchronize if query.device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        run()
    for _ in range(max(1, repeats)):
        for name, run in runs.items():
            sync()
            start = time.perf_counter()
            run()
            sync()
            times[name].append(time.perf_counter() - start)
    result.update({name: statistics.median(values) for name, values in times.items()})
    return result


def _cell(seconds: float, kernel_seconds: float) -> str:
    return f"{seconds:.3f} s {seconds / kernel_seconds:5.2f} x"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="1024,2048,4096,8192", help="query and key counts T, comma-separated")
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--span", type=int, default=1382, help="system span end (keys 3..span); SmolLM2's session 1")
    parser.add_argument("--budget-mib", type=int, default=256, help="the stage's --chunk-mib")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)

    import torch

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    generator = torch.Generator(device="cpu").manual_seed(0)
    plans = {"stage plan": device.type, **({"budget-only plan": "cuda"} if device.type == "cpu" else {})}
    rows = []
    header = f"{'T':>6} {'kernel s':>9}" + "".join(
        f"  {'lse, ' + name:>18}  {'fallback, ' + name:>18}" for name in plans
    )
    print(
        f"heads {args.heads} over {args.kv_heads}, head dim {args.head_dim}, span keys 3..{args.span}, "
        f"{dtype}, device {device}, median of {args.repeats}; extras as a multiple of the kernel's time"
    )
    print(header)
    for tokens in (int(x) for x in args.lengths.split(",")):

        def randn(heads: int, tokens: int = tokens) -> torch.Tensor:
            return torch.randn(1, heads, tokens, args.head_dim, generator=generator).to(device, dtype)

        query, key, value = randn(args.heads), randn(args.kv_heads), randn(args.kv_heads)
        row = measure_layer(
            query, key, value, [(0, 3), (3, min(args.span, tokens))], plans, args.budget_mib << 20, args.repeats
        )
        line = f"{tokens:>6} {row['kernel_s']:9.3f}"
        for name in plans:
            lse_s, fallback_s = row[f"kernel_lse_s_{_plan_key(name)}"], row[f"fallback_s_{_plan_key(name)}"]
            line += (
                f"  {_cell(lse_s, row['kernel_s']):>{max(18, len(name) + 5)}}"
                f"  {_cell(fallback_s, row['kernel_s']):>{max(18, len(name) + 10)}}"
            )
        print(line, flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"rows": rows, "args": vars(args)}, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
