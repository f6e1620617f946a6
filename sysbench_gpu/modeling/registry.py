"""Register an attention function with transformers for one block, and switch a model to it.

transformers looks attention up by the name in ``config._attn_implementation``
(``ALL_ATTENTION_FUNCTIONS``) and builds the mask with the function registered under the
same name (``ALL_MASK_ATTENTION_FUNCTIONS``). Both are process-wide tables, so every
registration here is undone on exit, and the model's configs get back their own value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sysbench_gpu.core.errors import SysbenchError


def attention_modules(model: Any) -> dict[int, Any]:
    """Attention modules by ``layer_idx`` (the modules transformers' interface is called with)."""
    found: dict[int, Any] = {}
    for module in model.modules():
        index = getattr(module, "layer_idx", None)
        if isinstance(index, int) and not isinstance(index, bool) and "Attention" in type(module).__name__:
            found.setdefault(index, module)
    return found


def all_configs(model: Any) -> list[Any]:
    """Every config object reachable from the model's modules and their sub-configs (deduplicated)."""
    seen: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is None or not hasattr(config, "_attn_implementation"):
            continue
        stack = [config]
        while stack:
            item = stack.pop()
            if id(item) in seen:
                continue
            seen[id(item)] = item
            for key in getattr(item, "sub_configs", {}) or {}:
                sub = getattr(item, key, None)
                if sub is not None and hasattr(sub, "_attn_implementation"):
                    stack.append(sub)
    return list(seen.values())


@contextmanager
def registered_attention(name: str, function: Callable[..., Any], mask_like: str = "sdpa") -> Iterator[str]:
    """``function`` registered as ``name`` (with ``mask_like``'s mask function) for the block; removed after."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    functions = ALL_ATTENTION_FUNCTIONS._global_mapping
    masks = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
    if name in functions:
        raise SysbenchError(f"attention function {name!r} is already registered (a hook left active?)")
    added_mask = name not in masks
    ALL_ATTENTION_FUNCTIONS.register(name, function)
    if added_mask:
        # The wrapped path needs exactly the mask its own implementation would get.
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, masks[mask_like])
    try:
        yield name
    finally:
        functions.pop(name, None)
        if added_mask:
            masks.pop(name, None)


@contextmanager
def attention_implementation(model: Any, name: str) -> Iterator[None]:
    """The model runs attention implementation ``name`` for the block; every config gets its own value back."""
    if not hasattr(model, "set_attn_implementation") or not hasattr(model, "config"):
        raise SysbenchError(f"{type(model).__name__} is not a transformers PreTrainedModel; cannot hook attention")
    saved = [
        (config, config.__dict__.get("_attn_implementation_internal"), "_attn_was_changed" in config.__dict__)
        for config in all_configs(model)
    ]
    try:
        model.set_attn_implementation(name)
        if model.config._attn_implementation != name:
            raise SysbenchError(
                f"{type(model).__name__} refused the attention implementation {name!r}; "
                "it does not route attention through transformers' AttentionInterface"
            )
        yield
    finally:
        for config, value, had_flag in saved:
            config._attn_implementation_internal = value
            if not had_flag and "_attn_was_changed" in config.__dict__:
                del config.__dict__["_attn_was_changed"]
