"""A model's attention layers: the modules transformers' attention interface is called with, and ``--layers``."""

from __future__ import annotations

from typing import Any

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.modeling.registry import attention_modules

__all__ = ["attention_modules", "num_layers", "resolve_layers"]


def num_layers(model: Any) -> int:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    count = getattr(config, "num_hidden_layers", None)
    if not isinstance(count, int):
        raise SysbenchError(f"{type(model).__name__}: config has no num_hidden_layers")
    return count


def resolve_layers(spec: str, n_layers: int) -> dict[str, int]:
    """``mid``, ``last``, ``all`` or comma-separated indices (negatives count from the end) -> {label: index}.

    ``mid`` is ``n_layers // 2`` (layer 16 of 32 for Llama-3.1-8B, 40 of 80 for Qwen2-72B,
    as upstream used), ``last`` is ``n_layers - 1``.
    """
    labels: dict[str, int] = {}
    for part in [p.strip() for p in str(spec).split(",") if p.strip()]:
        if part == "mid":
            labels["mid"] = n_layers // 2
        elif part == "last":
            labels["last"] = n_layers - 1
        elif part == "all":
            for index in range(n_layers):
                labels.setdefault(f"layer{index}", index)
        else:
            try:
                index = int(part)
            except ValueError:
                raise SysbenchError(f"--layers: {part!r} is not mid, last, all or a layer number") from None
            if index < 0:
                index += n_layers
            if not 0 <= index < n_layers:
                raise SysbenchError(f"--layers: layer {part} is out of range (the model has {n_layers} layers)")
            labels.setdefault(f"layer{index}", index)
    if not labels:
        raise SysbenchError("--layers: no layer selected")
    return labels
