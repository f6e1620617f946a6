"""A model's layer and head counts from its configuration alone, before any weight loads.

Verbs that take layer or head numbers (``attention --layers/--knockout-layers``, ``generate
--steer-layers/--steer-heads``) check them against these before they create their output folder
or load the model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sysbench_gpu.engines.models import resolve_model

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConfigDepth:
    """``num_hidden_layers`` and ``num_attention_heads`` of a model's (text) config; None where it gives none."""

    n_layers: int | None
    n_heads: int | None


def config_depth(model: str) -> ConfigDepth:
    """The depth ``model``'s config gives; both None when the config cannot be read (the model load says why).

    ``model`` is resolved as every stage resolves it (``resolve_model``: a missing folder is one line here).
    """
    path = resolve_model(model)
    from transformers import AutoConfig  # heavy: only when a verb needs the depth

    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as error:  # noqa: BLE001 (an unreadable config: the model load reports it, as one line)
        log.debug("%s: no config before the load (%s)", model, error)
        return ConfigDepth(None, None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return ConfigDepth(_count(text, "num_hidden_layers"), _count(text, "num_attention_heads"))


def _count(config: object, name: str) -> int | None:
    value = getattr(config, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
