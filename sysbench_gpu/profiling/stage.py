"""``sysbench-gpu profile``: how far a run is from the hardware's limit, and what-if estimates.

For every engine call of a run and for the whole run: the measured time and tokens/s,
the prefix-cache hit rate, a lower bound on the time from the roofline
(:mod:`sysbench_gpu.profiling.roofline`), the efficiency eta = bound / measured and the resource
that bounds it; then what-if estimates from the same requests
(:mod:`sysbench_gpu.profiling.schedule`). Reads only the manifest, ``stats.json``,
``generations.jsonl`` and the model's ``config.json`` (with ``--estimate``, also
``sessions.json`` and a tokenizer). See docs/profile.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sysbench_gpu import __version__
from sysbench_gpu.core.arguments import check_out_folder
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.rundir import utc_now, write_json_atomic
from sysbench_gpu.engines.vllm_memory import FALLBACK_GPU_MEMORY_UTILIZATION, vllm_default_utilization
from sysbench_gpu.profiling.bounds import SegmentBound, sequential
from sysbench_gpu.profiling.device_specs import load_device_spec
from sysbench_gpu.profiling.figures import plot_profile
from sysbench_gpu.profiling.inputs import (
    DEFAULT_CACHE_BLOCK,
    PREFIX_CACHE_MODES,
    RunCall,
    RunInputs,
    default_device,
    estimate_calls,
    manifest_dtype,
    manifest_layout,
    read_generated_run,
)
from sysbench_gpu.profiling.model_config import find_model_config
from sysbench_gpu.profiling.roofline import Layout, ModelShape, dtype_bytes
from sysbench_gpu.profiling.schedule import (
    DEFAULT_THREADS,
    Hardware,
    call_bound,
    what_ifs,
)
from sysbench_gpu.profiling.text import fmt_eta, fmt_seconds, render_data

PROFILE_JSON = "profile.json"


@dataclass
class ProfileOptions:
    device_spec: str | None = None
    model_config: str | None = None
    dtype: str | None = None
    kv_dtype: str | None = None
    layout: str | None = None
    what_if: Sequence[str] = ()
    threads: int = DEFAULT_THREADS
    estimate: bool = False
    tokenizer: str | None = None
    prefix_cache: str = "history"
    cache_block: int = DEFAULT_CACHE_BLOCK
    memory_utilization: float | None = None  # None: vLLM's default (memory_utilization_for)


@dataclass
class Profile:
    inputs: RunInputs
    hw: Hardware
    config_source: str
    dtype: str
    kv_dtype: str
    calls: list[dict[str, Any]]
    run: dict[str, Any]
    what_if: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    memory_utilization_source: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": "sysbench-gpu",
            "version": __version__,
            "created": utc_now(),
            "run_dir": str(self.inputs.run_dir),
            "estimate": self.inputs.calls[0].measured_s is None if self.inputs.calls else True,
            "model": {
                **self.hw.shape.summary(),
                "config": self.config_source,
                "dtype": self.dtype,
                "kv_dtype": self.kv_dtype,
                "weight_bytes_per_param": self.hw.weight_bytes,
                "kv_bytes_per_element": self.hw.kv_bytes,
            },
            "engine": self.inputs.engine,
            "stage": self.inputs.stage,
            "device": self.hw.device.to_json(),
            "layout": {
                "tp": self.hw.layout.tp,
                "pp": self.hw.layout.pp,
                "dp": self.hw.layout.dp,
                "gpus": self.hw.layout.gpus,
            },
            "memory_utilization": {"value": self.hw.memory_utilization, "source": self.memory_utilization_source},
            "inputs": dict(self.inputs.sources),
            "calls": self.calls,
            "run": self.run,
            "what_if": self.what_if,
            "warnings": list(self.warnings),
        }


# ---------------------------------------------------------------- assembly


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _row(bound: SegmentBound, measured: float | None, prompt: int, cached: int | None, output: int) -> dict[str, Any]:
    return {
        "measured_s": measured,
        "bound_s": bound.bound_s,
        "efficiency": _ratio(bound.bound_s, measured),
        "bound_by": bound.bound_by,
        "prompt_tokens": prompt,
        "cached_prompt_tokens": cached,
        "output_tokens": output,
        "cache_hit_rate": _ratio(cached, prompt) if cached is not None else None,
        "output_tokens_per_s": _ratio(output, measured),
        "bound_output_tokens_per_s": _ratio(output, bound.bound_s),
        "forwards": bound.forwards,
        "compute_s": bound.compute_s,
        "memory_s": bound.memory_s,
        "latency_s": bound.latency_s,
        "flops": bound.work.flops,
        "bytes": bound.weight_bytes + bound.kv_bytes,
        "prefill": bound.prefill.to_json(),
        "decode": bound.decode.to_json(),
    }


def _call_label(call: RunCall) -> str:
    return f"call {call.index} (turn {call.turn})"


def build_profile(inputs: RunInputs, options: ProfileOptions) -> Profile:
    """Every bound and what-if of a run; warnings for efficiencies above 1 (a spec too low)."""
    config, config_source = find_model_config(inputs, options.model_config)
    shape = ModelShape.from_config(config, name=str(inputs.model or config_source))
    spec_name = options.device_spec or default_device(inputs)
    if spec_name is None:
        raise SysbenchError(
            f"{inputs.run_dir / 'manifest.json'}: the engine ran on a GPU; name it with --device-spec "
            "h100|h200|a100|FILE"
        )
    device = load_device_spec(spec_name)
    quantized = config.get("quantization_config")
    if isinstance(quantized, dict) and not options.dtype:
        # Packed low-bit weights are fewer bytes than the dtype the engine reports: the bound would overshoot.
        raise SysbenchError(
            f"{config_source}: quantized checkpoint ({quantized.get('quant_method', '?')}, "
            f"{quantized.get('bits', '?')} bits); pass --dtype for the weights' width, e.g. int4 or fp8"
        )
    dtype = options.dtype or manifest_dtype(inputs, config)
    kv_dtype = options.kv_dtype or (dtype if not quantized else manifest_dtype(inputs, {}))
    layout = Layout.parse(options.layout, manifest_layout(inputs)) if options.layout else manifest_layout(inputs)
    memory_utilization, memory_source = memory_utilization_for(options.memory_utilization, device.memory_bytes)
    hw = Hardware(shape, device, layout, dtype_bytes(dtype), dtype_bytes(kv_dtype), memory_utilization)
    engine = inputs.engine
    batch_size = inputs.described.get("batch_size") if engine == "hf" else None
    if engine == "hf" and layout.gpus > 1:
        raise SysbenchError("--layout: the hf engine runs on one device (device_map spreads layers, one after another)")

    warnings: list[str] = []
    bounds: list[SegmentBound] = []
    rows: list[dict[str, Any]] = []
    for call in inputs.calls:
        bound = call_bound(call, hw, engine, batch_size if isinstance(batch_size, int) else None)
        bounds.append(bound)
        row = {
            "index": call.index,
            "turn": call.turn,
            "requests": len(call.requests),
            **_row(
                bound,
                call.measured_s,
                call.prompt_tokens,
                call.cached_tokens if call.cached_reported else None,
                call.output_tokens,
            ),
        }
        rows.append(row)
        if row["efficiency"] is not None and row["efficiency"] > 1:
            warnings.append(
                f"{_call_label(call)}: measured {call.measured_s:.3g} s beats the bound {bound.bound_s:.3g} s "
                f"(efficiency {row['efficiency']:.2f}); the device spec {device.name!r} understates this device"
            )
    total = sequential(bounds)
    measured = [c.measured_s for c in inputs.calls]
    measured_total = sum(m for m in measured if m is not None) if all(m is not None for m in measured) else None
    cached_reported = all(c.cached_reported for c in inputs.calls)
    run = _row(
        total,
        measured_total,
        sum(c.prompt_tokens for c in inputs.calls),
        sum(c.cached_tokens for c in inputs.calls) if cached_reported else None,
        sum(c.output_tokens for c in inputs.calls),
    )
    run.update(calls=len(inputs.calls), requests=sum(len(c.requests) for c in inputs.calls))
    extra_layouts = [Layout.parse(text, layout) for text in options.what_if]
    if options.threads < 1:
        raise SysbenchError(f"--threads must be positive, got {options.threads}")
    scenarios = what_ifs(inputs.calls, hw, options.threads, extra_layouts)
    reference = scenarios[0].bound.bound_s if scenarios[0].bound else None
    output = run["output_tokens"]
    return Profile(
        inputs=inputs,
        hw=hw,
        config_source=config_source,
        dtype=dtype,
        kv_dtype=kv_dtype,
        calls=rows,
        run=run,
        what_if=[s.to_json(output, reference) for s in scenarios],
        warnings=warnings,
        memory_utilization_source=memory_source,
    )


def memory_utilization_for(given: float | None, device_memory: float | None) -> tuple[float, str]:
    """The what-ifs' share of device memory and where it comes from.

    Not given: vLLM's default, read from the installed vLLM (imported only here, and only when the
    device spec gives a memory size, the one case the share is used), else a documented fallback.
    """
    if given is not None:
        if not 0 < given <= 1:
            raise SysbenchError(f"--memory-utilization must lie in (0, 1], got {given}")
        return given, "--memory-utilization"
    if device_memory is None:
        return FALLBACK_GPU_MEMORY_UTILIZATION, "not used: the device spec gives no memory size"
    return vllm_default_utilization().value_or_fallback()


def profile_run(run_dir: str | Path, options: ProfileOptions) -> Profile:
    if options.estimate:
        if not options.tokenizer:
            raise SysbenchError("--estimate needs --tokenizer NAME|PATH to count the tokens of the prompts and replies")
        inputs = estimate_calls(run_dir, options.tokenizer, options.prefix_cache, options.cache_block)
    else:
        inputs = read_generated_run(run_dir)
    return build_profile(inputs, options)


# ---------------------------------------------------------------- text


def render_text(profile: Profile) -> str:
    return render_data(profile.to_json())


# ---------------------------------------------------------------- report section


def report_section(run_dirs: Sequence[Path], device_spec: str | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    """Markdown lines and JSON entries of the profile of every run that has ``stats.json``.

    A run that cannot be profiled (no model config, no device named) gets a line saying
    why; runs without ``stats.json`` are left out.
    """
    lines: list[str] = []
    entries: list[dict[str, Any]] = []
    for path in run_dirs:
        if not (Path(path) / "stats.json").is_file():
            continue
        try:
            profile = profile_run(path, ProfileOptions(device_spec=device_spec))
        except SysbenchError as error:
            lines += [f"- `{path}`: not profiled: {error}"]
            entries.append({"run_dir": str(path), "error": str(error)})
            continue
        data = profile.to_json()
        device = data["device"]["name"]
        lines += [
            "",
            f"`{path}` on {device} (tp={data['layout']['tp']} pp={data['layout']['pp']} dp={data['layout']['dp']}):",
            "",
            "| Call | Turn | Measured s | Bound s | η | Bound by |",
            "| ---: | ---: | ---: | ---: | ---: | :--- |",
        ]
        for row in data["calls"] + [dict(data["run"], index="run", turn="all")]:
            lines.append(
                f"| {row['index']} | {row['turn']} | {fmt_seconds(row['measured_s'])} | {fmt_seconds(row['bound_s'])} "
                f"| {fmt_eta(row['efficiency'])} | {row['bound_by']} |"
            )
        entries.append(
            {
                "run_dir": str(path),
                "device": device,
                "calls": data["calls"],
                "run": data["run"],
                "warnings": data["warnings"],
            }
        )
    if lines:
        lines = [
            "## Throughput profile",
            "",
            "Bound: roofline lower bound on each call's time (`sysbench-gpu profile`, docs/profile.md); "
            "η = bound / measured.",
        ] + lines
    return lines, entries


# ---------------------------------------------------------------- CLI


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "profile",
        help="throughput against the hardware's limit (roofline) and what-if estimates",
        description="For every engine call and the whole run: measured time, tokens/s, prefix-cache hit rate, a "
        "roofline lower bound on the time, eta = bound / measured and what bounds it; then what-if estimates "
        "(one session at a time, N client threads, other tp/pp/dp layouts).",
    )
    parser.add_argument("run", metavar="RUN_DIR")
    parser.add_argument(
        "--device-spec",
        help="h100, h200, a100, cpu, a JSON file, or FILE#NAME (default: cpu when the engine ran on the CPU)",
    )
    parser.add_argument(
        "--model-config",
        help="config.json, a model folder, or a packaged name (qwen2-7b, qwen2-72b, "
        "llama-3.1-8b, llama-3.1-70b); default: the model in the manifest",
    )
    parser.add_argument(
        "--dtype",
        help="weights' dtype: float32, bfloat16, fp8, int4, ... (default: the engine's, "
        "else the config's, else bfloat16)",
    )
    parser.add_argument("--kv-dtype", help="KV cache dtype, e.g. fp8 for vLLM's kv_cache_dtype=fp8 (default: --dtype)")
    parser.add_argument("--layout", help="parallel layout, e.g. tp=4 or tp=2,dp=2 (default: the manifest's)")
    parser.add_argument(
        "--what-if",
        action="append",
        default=[],
        metavar="LAYOUT",
        help="also estimate this layout, e.g. tp=4 or dp=4 (repeatable)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help=f"client threads of the server what-if (default {DEFAULT_THREADS}, as upstream)",
    )
    parser.add_argument(
        "--memory-utilization",
        type=float,
        default=None,
        help="share of device memory for weights and KV in the what-ifs (default: the installed vLLM's default; "
        f"{FALLBACK_GPU_MEMORY_UTILIZATION} without vLLM)",
    )
    parser.add_argument(
        "--estimate",
        action="store_true",
        help="no stats.json (e.g. an imported run): count tokens with --tokenizer; bounds only",
    )
    parser.add_argument("--tokenizer", help="with --estimate: smollm2, a tokenizer folder or a cached hub id")
    parser.add_argument(
        "--prefix-cache",
        choices=PREFIX_CACHE_MODES,
        default="history",
        help="with --estimate: history = each turn reuses the previous turn's KV (default)",
    )
    parser.add_argument(
        "--cache-block",
        type=int,
        default=DEFAULT_CACHE_BLOCK,
        help=f"with --estimate: prefix-cache block size in tokens (default {DEFAULT_CACHE_BLOCK})",
    )
    parser.add_argument("--out", help="write profile.json and the figures here")
    parser.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    parser.add_argument("--no-figures", action="store_true", help="with --out: no figures")
    parser.set_defaults(func=_cmd_profile)


def _cmd_profile(args: argparse.Namespace) -> int:
    options = ProfileOptions(
        device_spec=args.device_spec,
        model_config=args.model_config,
        dtype=args.dtype,
        kv_dtype=args.kv_dtype,
        layout=args.layout,
        what_if=args.what_if,
        threads=args.threads,
        estimate=args.estimate,
        tokenizer=args.tokenizer,
        prefix_cache=args.prefix_cache,
        cache_block=args.cache_block,
        memory_utilization=args.memory_utilization,
    )
    if args.out:
        # Inside the run is where the docs put it (RUN/profile); the run's own folder is not.
        check_out_folder(
            args.out, inputs=[args.run], own_marker=PROFILE_JSON, kind="profile folder", inside_inputs=True
        )
    profile = profile_run(args.run, options)
    data = profile.to_json()
    data["arguments"] = {k: v for k, v in vars(args).items() if k not in ("func", "secrets")}
    written: list[Path] = []
    if args.out:
        out = Path(args.out)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise SysbenchError(f"{out}: cannot create the --out folder ({error.strerror or error})") from None
        if not args.no_figures:
            data["figures"] = [p.name for p in plot_profile(data, out)]
        write_json_atomic(out / PROFILE_JSON, data)
        written = [out / PROFILE_JSON] + [out / name for name in data.get("figures", [])]
    if args.json:
        json.dump(data, sys.stdout, ensure_ascii=False, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(profile))
        if written:
            print(f"wrote {', '.join(str(p) for p in written)}")
    for warning in profile.warnings:
        if args.json:
            print(f"warning: {warning}", file=sys.stderr)
    return 0
