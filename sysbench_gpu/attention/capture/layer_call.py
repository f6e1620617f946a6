"""One attention call of a captured layer: its inputs and the span hull (the configs: ``modeling.registry``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.modeling.registry import all_configs as _all_configs

__all__ = ["_LayerCall", "_all_configs", "_span_hull"]


@dataclass(frozen=True)
class _LayerCall:
    """What the model passed to one attention call, read once.

    Scale, visibility and softcap as the base path applies them.
    """

    scale: float | None
    causal: bool
    mask: Any  # the model's 4-D mask, or None
    softcap: float | None  # the softcap the base path applies (SDPA applies none)
    note: str  # appended to the recorded path, e.g. that the model's SDPA path ignores its softcap

    @classmethod
    def read(cls, layer: int, module: Any, base: str, attention_mask: Any, kwargs: dict[str, Any]) -> _LayerCall:
        for unsupported in ("position_bias", "s_aux", "sinks"):
            if kwargs.get(unsupported) is not None:
                raise SysbenchError(
                    f"layer {layer} ({type(module).__name__}) uses {unsupported}; "
                    "attention share capture does not model it"
                )
        if getattr(module, "training", False) and kwargs.get("dropout"):
            raise SysbenchError("attention capture needs the model in eval mode (dropout is on)")
        mask = (
            attention_mask
            if (attention_mask is not None and getattr(attention_mask, "dim", lambda: 0)() == 4)
            else None
        )
        if attention_mask is not None and mask is None:
            raise SysbenchError(
                f"layer {layer}: attention mask of shape {tuple(attention_mask.shape)} is not supported (padding?); "
                "run one unpadded sequence per forward"
            )
        scale = kwargs.get("scaling")
        if scale is None:
            scale = getattr(module, "scaling", None)
        is_causal = kwargs.get("is_causal")
        if is_causal is None:
            is_causal = getattr(module, "is_causal", True)
        softcap = kwargs.get("softcap") or None
        note = ""
        if softcap and base != "eager":
            # transformers' SDPA path drops softcap: the model ran without it, so the shares have none either.
            note = f"; softcap {softcap:g} not applied: the model's {base} attention ignores it"
            softcap = None
        # A sliding window reaches SDPA and eager attention only through the mask, so only the mask is used here.
        return cls(
            scale=None if scale is None else float(scale), causal=bool(is_causal), mask=mask, softcap=softcap, note=note
        )

    def sdpa_is_causal(self, query: Any) -> bool:
        """The causal flag transformers' SDPA path passes: only without a mask and with more than one query."""
        return self.causal and self.mask is None and query.shape[2] > 1


def _span_hull(spans: Sequence[tuple[int, int]], t_k: int) -> int:
    """Keys between the first span's start and the last span's end (what span_share_given_lse reads per query)."""
    live = [(max(0, a), min(t_k, b)) for a, b in spans if min(t_k, b) > max(0, a)]
    return max(1, max(b for _, b in live) - min(a for a, _ in live)) if live else 1
