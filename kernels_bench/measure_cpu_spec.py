"""Measure this machine's fp32 matrix-multiply FLOP/s and memory bandwidth; write a device spec.

    python kernels_bench/measure_cpu_spec.py --out cpu-spec.json
    sysbench-gpu profile RUN_DIR --device-spec cpu-spec.json

Peak FLOP/s: the best of ``--repeats`` timed fp32 GEMMs (``--gemm`` square, all torch
threads). Bandwidth: the best of ``--repeats`` timed reductions over a ``--mib`` MiB fp32
tensor (read once), larger than any cache, so it measures DRAM the way a decode step
reads weights. Both are the best observed, since a device spec must be a ceiling: a run
measured later should not beat it (``profile`` warns when one does). Numbers taken
while other processes share the cores are lower than the machine can do; rerun on an
idle machine for a tight spec. Prints what it measured and the ratio to the packaged
generic ``cpu`` ceiling.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path


def best_time(fn, repeats: int) -> float:
    fn()  # warm-up: page faults, thread pool start
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(gemm: int, mib: int, repeats: int) -> dict:
    import torch

    a = torch.randn(gemm, gemm, dtype=torch.float32)
    b = torch.randn(gemm, gemm, dtype=torch.float32)
    gemm_s = best_time(lambda: torch.mm(a, b), repeats)
    flops = 2.0 * gemm**3 / gemm_s
    big = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
    read_s = best_time(lambda: big.sum(), repeats)
    bandwidth = big.numel() * 4 / read_s
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else None
    return {
        "description": (
            f"measured CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
        ),
        "peak_flops": flops,
        "memory_bandwidth": bandwidth,
        "memory_bytes": float(memory) if memory else None,
        "source": (
            f"kernels_bench/measure_cpu_spec.py: best of {repeats} fp32 {gemm}x{gemm} GEMMs ({gemm_s * 1e3:.1f} ms) "
            f"and of {repeats} sums over {mib} MiB ({read_s * 1e3:.1f} ms), torch {torch.__version__}"
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="cpu-spec.json", help="device spec JSON to write")
    parser.add_argument("--gemm", type=int, default=2048, help="GEMM size (default 2048)")
    parser.add_argument("--mib", type=int, default=1024, help="MiB read by the bandwidth test (default 1024)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from sysbench_gpu.core.rundir import write_json_atomic
    from sysbench_gpu.profiling.device_specs import load_device_spec

    spec = measure(args.gemm, args.mib, args.repeats)
    write_json_atomic(Path(args.out), spec)
    ceiling = load_device_spec("cpu")
    print(
        f"fp32 GEMM       {spec['peak_flops'] / 1e9:10.1f} GFLOP/s   (generic cpu ceiling / measured: "
        f"{ceiling.peak_flops / spec['peak_flops']:,.0f}x)"
    )
    print(
        f"read bandwidth  {spec['memory_bandwidth'] / 1e9:10.1f} GB/s      (generic cpu ceiling / measured: "
        f"{ceiling.memory_bandwidth / spec['memory_bandwidth']:,.0f}x)"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
