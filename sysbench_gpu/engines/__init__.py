"""Generation engines behind one small interface (see ``engines.base``).

``get_engine(name, ...)`` imports the backend lazily, so choosing ``openai`` never
imports torch and choosing ``hf`` never imports vllm.
"""

from __future__ import annotations

from typing import Any

from sysbench_gpu.engines.base import ChatMessage, Completion, Engine, SamplingSpec
from sysbench_gpu.errors import SysbenchError

ENGINE_NAMES = ("vllm", "hf", "openai")


def get_engine(name: str, **options: Any) -> Engine:
    if name == "hf":
        from sysbench_gpu.engines.hf import HFEngine

        return HFEngine(**options)
    if name == "vllm":
        from sysbench_gpu.engines.vllm_engine import VLLMEngine

        return VLLMEngine(**options)
    if name == "openai":
        from sysbench_gpu.engines.openai_engine import OpenAIEngine

        return OpenAIEngine(**options)
    raise SysbenchError(f"unknown engine {name!r} (choose from {', '.join(ENGINE_NAMES)})")


__all__ = ["ChatMessage", "Completion", "Engine", "SamplingSpec", "get_engine", "ENGINE_NAMES"]
