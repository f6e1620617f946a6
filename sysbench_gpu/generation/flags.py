"""What ``generate``'s flags mean and allow, read without a model: the engine flags each engine takes
(``ENGINE_FLAGS``, also a plan's engine options), ``--extra-body``'s JSON, and the ranges of the flags only
``generate`` has (the flags many verbs share are ``core.arguments``'). ``generation.cli`` parses, these check.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from sysbench_gpu.core.arguments import check_finite, check_integer
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.engines.hf import TORCH_DTYPES as HF_DTYPES
from sysbench_gpu.engines.openai_engine import check_extra_body

# CLI flag (argparse dest) -> engine keyword, per engine. A flag set for an engine that
# does not take it is an error rather than silently ignored.
ENGINE_FLAGS: dict[str, dict[str, str]] = {
    "hf": {
        "device": "device",
        "dtype": "dtype",
        "batch_size": "batch_size",
        "device_map": "device_map",
        "seed": "seed",
        "cpu_threads": "cpu_threads",
        "data_parallel_size": "data_parallel_size",
        "ray_address": "ray_address",
    },
    "vllm": {
        "tensor_parallel_size": "tensor_parallel_size",
        "pipeline_parallel_size": "pipeline_parallel_size",
        "data_parallel_size": "data_parallel_size",
        "no_prefix_caching": "enable_prefix_caching",
        "max_model_len": "max_model_len",
        "gpu_memory_utilization": "gpu_memory_utilization",
        "dtype": "dtype",
        "seed": "seed",
        "distributed_executor_backend": "distributed_executor_backend",
        "enforce_eager": "enforce_eager",
        "max_num_batched_tokens": "max_num_batched_tokens",
        "max_num_seqs": "max_num_seqs",
        "kv_cache_memory_bytes": "kv_cache_memory_bytes",
        "ray_address": "ray_address",
    },
    "openai": {
        "base_url": "base_url",
        "api_key_env": "api_key_env",
        "concurrency": "concurrency",
        "max_retries": "max_retries",
        "timeout": "timeout",
        "extra_body": "extra_body",
    },
}
_SHARED_FLAGS = {"seed"}  # a sampling flag that engines also take when they have it


def engine_options_from_args(engine: str, args: argparse.Namespace) -> dict[str, Any]:
    """The ``get_engine`` keyword arguments for the engine flags the user set."""
    mapping = ENGINE_FLAGS[engine]
    options: dict[str, Any] = {}
    for flags in ENGINE_FLAGS.values():
        for dest in flags:
            value = getattr(args, dest, None)
            if value is None or value is False:
                continue
            if dest not in mapping:
                if dest in _SHARED_FLAGS:
                    continue
                owners = [name for name, m in ENGINE_FLAGS.items() if dest in m]
                raise SysbenchError(
                    f"--{dest.replace('_', '-')} is a flag of the {'/'.join(owners)} engine; --engine {engine} does "
                    "not take it"
                )
            options[mapping[dest]] = False if dest == "no_prefix_caching" else value
    return options


def json_object(text: str, flag: str = "--extra-body") -> dict[str, Any]:
    """``--extra-body``'s JSON object, checked (``check_extra_body``); one line naming the flag otherwise.

    Parsed in validation rather than as an argparse type, so a bad value is one ``error:`` line without
    the usage block. NaN and Infinity are refused: they are not JSON, and no server could read the body.
    """

    def refuse_constant(name: str) -> Any:
        raise SysbenchError(f"{flag}: {name} is not a JSON value")

    try:
        value = json.loads(text, parse_constant=refuse_constant)
    except json.JSONDecodeError as error:
        raise SysbenchError(f"{flag}: not JSON ({error.msg} at character {error.pos})") from None
    except RecursionError:
        raise SysbenchError(f"{flag}: JSON nested too deeply") from None
    return check_extra_body(value, flag)


# Engine and sampling flags the engines would check only after --out is made and the model loaded (or a
# server is paid): dest -> (flag, smallest value). The flags every verb shares are in core.arguments.
GENERATE_INTEGER_FLAGS: dict[str, tuple[str, int]] = {
    "distractor_turns": ("--distractor-turns", 0),
    "top_k": ("--top-k", 0),
    "batch_size": ("--batch-size", 1),
    "concurrency": ("--concurrency", 1),
    "max_retries": ("--max-retries", 0),
    "tensor_parallel_size": ("--tensor-parallel-size", 1),
    "pipeline_parallel_size": ("--pipeline-parallel-size", 1),
    "max_model_len": ("--max-model-len", 1),
    "max_num_batched_tokens": ("--max-num-batched-tokens", 1),
    "max_num_seqs": ("--max-num-seqs", 1),
    "kv_cache_memory_bytes": ("--kv-cache-memory-bytes", 1),
}
# dest -> (flag, lowest, highest, whether the lowest is allowed); always finite.
GENERATE_FLOAT_FLAGS: dict[str, tuple[str, float, float, bool]] = {
    "temperature": ("--temperature", 0.0, math.inf, True),
    "top_p": ("--top-p", 0.0, 1.0, False),
    "repetition_penalty": ("--repetition-penalty", 0.0, math.inf, False),
    "timeout": ("--timeout", 0.0, math.inf, False),
    "gpu_memory_utilization": ("--gpu-memory-utilization", 0.0, 1.0, False),
}


def check_generate_flags(args: argparse.Namespace) -> None:
    """``generate``'s own flags, each one line naming the flag, before anything is read or made."""
    data = Path(args.data)
    if data.is_dir() and Path(args.out).resolve() == data.resolve():
        raise SysbenchError(f"{args.out}: --out is the --data folder; choose a new folder for the run")
    if args.engine == "hf" and args.dtype is not None and args.dtype.lower() not in HF_DTYPES:
        # The engine's own check runs after --out is made.
        raise SysbenchError(f"--dtype: unknown dtype {args.dtype!r} for --engine hf ({', '.join(sorted(HF_DTYPES))})")
    for dest, (flag, minimum) in GENERATE_INTEGER_FLAGS.items():
        check_integer(getattr(args, dest, None), flag, minimum)
    for dest, (flag, low, high, low_allowed) in GENERATE_FLOAT_FLAGS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        check_finite(value, flag)
        if value < low or (value == low and not low_allowed) or value > high:
            lower = f"{'at least' if low_allowed else 'above'} {low:g}"
            wanted = lower if math.isinf(high) else f"{lower} and at most {high:g}"
            raise SysbenchError(f"{flag} must be {wanted}, got {value:g}")
