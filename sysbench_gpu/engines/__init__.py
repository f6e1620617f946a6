"""Generation engines behind one small interface (see ``engines.base``).

Every backend module imports its heavy library (torch and transformers, vllm, openai)
only when an engine is built, so ``get_engine("openai", ...)`` never imports torch and
``get_engine("hf", ...)`` never imports vllm.
"""

from __future__ import annotations

from typing import Any

from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.engines.base import Completion, Engine, SamplingSpec
from sysbench_gpu.engines.hf import HFEngine
from sysbench_gpu.engines.openai_engine import OpenAIEngine
from sysbench_gpu.engines.vllm_engine import VLLMEngine

ENGINE_NAMES = ("vllm", "hf", "openai")


def get_engine(name: str, **options: Any) -> Engine:
    if name == "hf":
        return HFEngine(**options)
    if name == "vllm":
        return VLLMEngine(**options)
    if name == "openai":
        return OpenAIEngine(**options)
    raise SysbenchError(f"unknown engine {name!r} (choose from {', '.join(ENGINE_NAMES)})")


__all__ = ["ChatMessage", "Completion", "Engine", "SamplingSpec", "get_engine", "ENGINE_NAMES"]
