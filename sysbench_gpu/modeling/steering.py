"""Steering (PASTA-style): log α added to the attention logits of the system text's keys during generation.

``Steering`` is what ``generate --steer-system α [--steer-layers ...] [--steer-heads FILE]``
asks for; the hf engine applies it around each ``generate`` call (``modeling.key_bias``).
α = 1 installs nothing: generation takes the model's unmodified attention path.
``--steer-heads`` reads the head map's list of ``[layer, head]`` pairs, as a bare list or
``{"heads": [...]}``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.modeling.key_bias import PATH, layer_heads, steering_value
from sysbench_gpu.modeling.layer_bands import parse_layer_band

DEFAULT_LAYERS = "mid-band"


@dataclass(frozen=True)
class Steering:
    alpha: float
    layers_spec: str | None = None  # None: the layers of ``heads``, else mid-band
    heads: tuple[tuple[int, int], ...] | None = None  # [layer, head] pairs; None: every head
    heads_file: str | None = None

    def __post_init__(self) -> None:
        steering_value(self.alpha)  # refuses α <= 0

    @property
    def active(self) -> bool:
        """α = 1 changes nothing, and then nothing is hooked."""
        return self.alpha != 1.0

    @property
    def value(self) -> float:
        return steering_value(self.alpha)

    def layers(self, n_layers: int) -> list[int]:
        if self.layers_spec is None and self.heads is not None:
            return sorted({layer for layer, _ in self.heads if 0 <= layer < n_layers})
        return parse_layer_band(self.layers_spec or DEFAULT_LAYERS, n_layers, flag="--steer-layers")

    def heads_by_layer(self, n_layers: int) -> dict[int, tuple[int, ...]] | None:
        if self.heads is None:
            return None
        return layer_heads(self.heads, self.layers(n_layers))

    def describe(self, n_layers: int | None = None) -> dict[str, Any]:
        """The manifest's ``steering`` section."""
        out: dict[str, Any] = {
            "span": "system",
            "alpha": self.alpha,
            "log_alpha": self.value,
            "layers_spec": self.layers_spec or (None if self.heads is not None else DEFAULT_LAYERS),
            "heads_file": self.heads_file,
            "heads": None if self.heads is None else [list(pair) for pair in self.heads],
            "path": PATH if self.active else "plain: α = 1 installs no hook",
            "queries": "every query at or after the system text's end (prompt and generated tokens)",
        }
        if n_layers is not None:
            out["layers"] = self.layers(n_layers)
        return out


def read_steer_heads(path: str | Path) -> tuple[tuple[int, int], ...]:
    """The ``[layer, head]`` pairs of a head-map file: a bare list, or an object with ``heads``."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise SysbenchError(f"{path}: cannot read the --steer-heads file ({error})") from None
    pairs = data.get("heads") if isinstance(data, dict) else data
    if not isinstance(pairs, list):
        raise SysbenchError(f"{path}: field 'heads' must be a list of [layer, head] pairs")
    out = []
    for index, pair in enumerate(pairs):
        if (
            not isinstance(pair, (list, tuple))
            or len(pair) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in pair)
        ):
            raise SysbenchError(f"{path}: heads[{index}] is {pair!r}, expected [layer, head] (two integers >= 0)")
        out.append((int(pair[0]), int(pair[1])))
    if not out:
        raise SysbenchError(f"{path}: field 'heads' is empty")
    return tuple(out)


def text_token_span(tokenizer: Any, rendered: str, text: str) -> tuple[int, int] | None:
    """Token span [start, end) of the first occurrence of ``text`` in ``rendered`` (None when absent)."""
    if not text:
        return None
    char_start = rendered.find(text)
    if char_start < 0:
        char_start = rendered.find(text.strip())
        text = text.strip()
    if char_start < 0:
        return None
    char_end = char_start + len(text)
    offsets: Sequence[tuple[int, int]] = tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)[
        "offset_mapping"
    ]
    start = next((i for i, (_, end) in enumerate(offsets) if end > char_start), len(offsets))
    stop = next((i for i, (begin, _) in enumerate(offsets) if begin >= char_end), len(offsets))
    return (start, stop)
