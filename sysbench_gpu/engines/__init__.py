"""Generation engines behind one small interface (see ``engines.base``).

Every backend module imports its heavy library (torch and transformers, vllm, openai, ray)
only when an engine is built, so ``get_engine("openai", ...)`` never imports torch and
``get_engine("hf", ...)`` never imports vllm. ``data_parallel_size`` above 1 (hf and vllm)
runs the engine as replicas on Ray (``engines.ray_pool``).
"""

from __future__ import annotations

from typing import Any

from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.engines.base import Completion, Engine, SamplingSpec
from sysbench_gpu.engines.openai_engine import OpenAIEngine
from sysbench_gpu.engines.replicated import hf_engine
from sysbench_gpu.engines.vllm_engine import VLLMEngine

ENGINE_NAMES = ("vllm", "hf", "openai")


def get_engine(name: str, **options: Any) -> Engine:
    if name == "hf":
        return hf_engine(**options)
    if name == "vllm":
        return VLLMEngine(**options)
    if name == "openai":
        return OpenAIEngine(**options)
    raise SysbenchError(f"unknown engine {name!r} (choose from {', '.join(ENGINE_NAMES)})")


__all__ = ["ChatMessage", "Completion", "Engine", "SamplingSpec", "get_engine", "ENGINE_NAMES"]
