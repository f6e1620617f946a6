"""The text report of ``sysbench-gpu profile``: one row per engine call, the whole run, and the what-if estimates."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def fmt_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if value >= 0.1 else f"{value:.3g}"


def fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def fmt_eta(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def fmt_flops(value: float) -> str:
    return f"{value / 1e12:,.1f} TFLOP/s" if value >= 1e12 else f"{value / 1e9:,.1f} GFLOP/s"


def _phases(row: dict[str, Any]) -> str:
    return f"{row['prefill']['bound_by']}/{row['decode']['bound_by']}"


def render_data(data: Mapping[str, Any]) -> str:
    """The text report of a profile's JSON (``Profile.to_json``)."""
    model, device, layout = data["model"], data["device"], data["layout"]
    lines = [
        f"profile of {data['run_dir']}: {model['name']} ({model['params'] / 1e6:,.1f}M params, {model['dtype']}), "
        f"engine {data['engine'] or 'none (' + data['stage'] + ' run)'}, "
        f"layout tp={layout['tp']} pp={layout['pp']} dp={layout['dp']}",
        f"device {device['name']}: {fmt_flops(device['peak_flops'])}, "
        f"{device['memory_bandwidth'] / 1e9:,.0f} GB/s ({device['description'] or device['source']})",
        f"tokens: {data['inputs'].get('tokens')}",
        "",
        f"{'call':>4} {'turn':>4} {'reqs':>5} {'prompt':>8} {'cached':>7} {'output':>7} {'measured s':>11} "
        f"{'tok/s':>8} {'bound s':>10} {'bound tok/s':>11} {'eta':>9}  bound by (prefill/decode)",
    ]
    for row in data["calls"] + [dict(data["run"], index="run", turn="", requests=data["run"]["requests"])]:
        cached = "-" if row["cached_prompt_tokens"] is None else str(row["cached_prompt_tokens"])
        lines.append(
            f"{row['index']:>4} {row['turn']!s:>4} {row['requests']:>5} {row['prompt_tokens']:>8} {cached:>7} "
            f"{row['output_tokens']:>7} {fmt_seconds(row['measured_s']):>11} {fmt_rate(row['output_tokens_per_s']):>8} "
            f"{fmt_seconds(row['bound_s']):>10} {fmt_rate(row['bound_output_tokens_per_s']):>11} "
            f"{fmt_eta(row['efficiency']):>9}  {row['bound_by']} ({_phases(row)})"
        )
    hit = data["run"]["cache_hit_rate"]
    lines += ["", f"prefix-cache hit rate: {'not reported by the engine' if hit is None else f'{hit:.1%}'}"]
    lines += ["", "what-if (estimates from the same requests; docs/profile.md says how each is computed):"]
    for item in data["what_if"]:
        if item["bound_s"] is None:
            lines.append(f"  {item['name']:<44} -  ({'; '.join(item['notes'])})")
            continue
        notes = f"  [{'; '.join(item['notes'])}]" if item["notes"] else ""
        lines.append(
            f"  {item['name']:<44} {fmt_seconds(item['bound_s']):>10} s  {fmt_rate(item['output_tokens_per_s']):>9} "
            f"tok/s  {item['bound_by']:<7}  x{item['relative_to_turn_synchronous']:.2f} of turn-synchronous{notes}"
        )
    for warning in data["warnings"]:
        lines.append(f"warning: {warning}")
    return "\n".join(lines) + "\n"
