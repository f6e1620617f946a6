"""What each way of the head to head really ran with, and where each value was read.

``bench_vs_upstream.py`` passes one scheduler budget, one dtype and one KV-cache size to every
way; an engine may still change what it was asked for (vLLM's platforms do), so the report
holds the values read back: from the engine itself (``generate`` records vLLM's resolved
``vllm_config`` and the hf engine's settings in its manifest), from a server's startup log or
its ``/metrics``, and only where neither says anything, from our own request. Each value's
source goes beside it (``engine_settings_source``), so a reader can tell a measured setting
from an assumed one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# The settings compared across the ways; equal values make the comparison one of schedules alone.
FIELDS = (
    "max_num_batched_tokens",
    "max_num_seqs",
    "dtype",
    "enable_prefix_caching",
    "kv_cache_memory_bytes",
    "kv_cache_size_tokens",
)

ENGINE_CONFIG = "engine: vllm_config as generate read it (manifest engine_describe.engine_config)"
NON_DEFAULT_ARGS = "server log: 'non-default args' (what vLLM parsed from our flags)"
CONFIG_LINE = "server log: 'Initializing a V1 LLM engine ... with config'"
KV_SIZE_LINE = "server log: '... KV cache size: N tokens'"
CACHE_INFO = "server /metrics: vllm:cache_config_info"
OUR_REQUEST = "our request (the server does not report it)"


def settings(values: Mapping[str, Any], sources: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The compared fields in their order: (values, sources); unreported fields are None, 'not reported'."""
    found = {name: values.get(name) for name in FIELDS}
    where = {name: sources.get(name, "not reported") for name in FIELDS}
    return found, where


def normal_dtype(value: Any) -> str | None:
    return None if value is None else str(value).replace("torch.", "")


# ------------------------------------------------------------------ vLLM


def vllm_engine_settings(manifest: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Way (b) on vLLM: the resolved ``vllm_config`` that ``generate`` read from its engine."""
    stage = manifest.get("stages", {}).get("generate", manifest)
    config = (stage.get("engine_describe") or {}).get("engine_config") or {}
    values = {name: config.get(name) for name in FIELDS}
    values["dtype"] = normal_dtype(values["dtype"])
    return settings(values, {name: ENGINE_CONFIG for name in FIELDS if values.get(name) is not None})


_INT_ARG = r"'{name}': (\d+)"
_CONFIG_FIELD = r"\b{name}=([^,\s]+)"


def vllm_server_settings(log_text: str, metrics_text: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    """Ways (a) and (c) on ``vllm serve``: its startup log and ``/metrics`` (the engine's cache config)."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    args_line = _last_line(log_text, "non-default args:")
    config_line = _last_line(log_text, "with config:")
    for name in ("max_num_batched_tokens", "max_num_seqs", "kv_cache_memory_bytes"):
        match = re.search(_INT_ARG.format(name=name), args_line or "")
        if match:
            values[name], sources[name] = int(match.group(1)), NON_DEFAULT_ARGS
    chunked = re.search(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)", log_text)
    if chunked:  # the scheduler's own report wins over the parsed flag
        values["max_num_batched_tokens"] = int(chunked.group(1))
        sources["max_num_batched_tokens"] = "server log: 'Chunked prefill is enabled with max_num_batched_tokens'"
    for name in ("dtype", "enable_prefix_caching"):
        match = re.search(_CONFIG_FIELD.format(name=name), config_line or "")
        if match:
            values[name], sources[name] = _literal(match.group(1)), CONFIG_LINE
    values["dtype"] = normal_dtype(values.get("dtype"))
    size = list(re.finditer(r"KV cache size: ([\d,]+) tokens", log_text))
    if size:
        values["kv_cache_size_tokens"] = int(size[-1].group(1).replace(",", ""))
        sources["kv_cache_size_tokens"] = KV_SIZE_LINE
    info = prometheus_labels(metrics_text or "", "vllm:cache_config_info")
    for name in ("kv_cache_memory_bytes", "enable_prefix_caching", "kv_cache_size_tokens"):
        if info.get(name) not in (None, "None", ""):
            values[name], sources[name] = _literal(info[name]), CACHE_INFO
    return settings(values, sources)


def prometheus_labels(text: str, metric: str) -> dict[str, str]:
    """The labels of the last sample of ``metric`` in a Prometheus text exposition ({} where absent)."""
    labels: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith(metric + "{"):
            body = line[len(metric) + 1 : line.rindex("}")]
            labels = {key: json.loads(f'"{value}"') for key, value in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', body)}
    return labels


# ------------------------------------------------------------------ hf


def hf_engine_settings(manifest: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Way (b) on hf: static ``generate()`` batches, which have no token budget and no cache between calls."""
    stage = manifest.get("stages", {}).get("generate", manifest)
    described = stage.get("engine_describe") or {}
    values = {
        "max_num_seqs": described.get("batch_size"),
        "dtype": normal_dtype(described.get("dtype")),
        "enable_prefix_caching": False,
    }
    engine = "engine: the hf engine's settings (manifest engine_describe)"
    sources = {
        "max_num_seqs": engine + ", batch_size: sequences per generate() batch",
        "dtype": engine,
        "enable_prefix_caching": "the hf engine: generate() keeps no KV cache from one call to the next",
        "max_num_batched_tokens": "none: generate() prefills a whole batch in one forward, with no token budget",
        "kv_cache_memory_bytes": "none: generate() grows a cache for each batch",
        "kv_cache_size_tokens": "none: generate() grows a cache for each batch",
    }
    return settings(values, sources)


def transformers_server_settings(requested: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Ways (a) and (c) on ``transformers serve --continuous-batching``: our flags, named as such.

    It reports none of them: its paged cache logs its size through a logger of its own
    (``ContinuousBatchingLogger``) that has no handler in the server, whatever ``--log-level`` says.
    """
    values: dict[str, Any] = {
        "dtype": normal_dtype(requested.get("dtype")),
        "enable_prefix_caching": requested.get("enable_prefix_caching"),
        "max_num_batched_tokens": requested.get("max_num_batched_tokens"),
    }
    sources = {name: OUR_REQUEST for name, value in values.items() if value is not None}
    sources["enable_prefix_caching"] = (
        "transformers' default (ContinuousBatchingConfig.allow_block_sharing; it shares blocks only for models "
        "whose layers all use full attention)"
    )
    sources["max_num_seqs"] = "not settable: transformers serve has no flag for its requests per batch"
    share = requested.get("cache_share")
    sized = "not reported: transformers sizes its paged cache itself within --cb-max-memory-percent"
    sources["kv_cache_memory_bytes"] = sized + (f" {share:.3f} (our request)" if share else " (its default)")
    sources["kv_cache_size_tokens"] = sources["kv_cache_memory_bytes"]
    return settings(values, sources)


# ------------------------------------------------------------------ comparison


def differing(per_way: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The fields whose values are not the same in every way: field -> {way: value}."""
    ways = list(per_way)
    out: dict[str, dict[str, Any]] = {}
    for name in FIELDS:
        seen = {way: per_way[way].get(name) for way in ways}
        if len({json.dumps(value) for value in seen.values()}) > 1:
            out[name] = seen
    return out


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _last_line(text: str, marker: str) -> str | None:
    lines: Sequence[str] = [line for line in text.splitlines() if marker in line]
    return lines[-1] if lines else None


def _literal(text: str) -> Any:
    """A logged scalar: True/False, an integer, else the text itself."""
    if text in ("True", "False"):
        return text == "True"
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return text
