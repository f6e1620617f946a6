"""Steering (PASTA-style): log α added to the attention logits of the system text's keys during generation.

``Steering`` is what ``generate --steer-system α [--steer-layers ...] [--steer-heads FILE]``
asks for; the hf engine applies it around each ``generate`` call (``modeling.key_bias``).
α = 1 installs nothing: generation takes the model's unmodified attention path.
``--steer-heads`` reads the head map's list of ``[layer, head]`` pairs, as a bare list or
``{"heads": [...]}``, and warns (one line) when a steered head is not significant in the
file: its session-aware q (``attention-analyze``'s ``top_heads.json``) is at or above the
file's ``alpha``, or the file gives none (a bare list, or a map written before the session
permutation test, whose q treated turns as independent).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sysbench_gpu.core.arguments import check_finite, parse_layer_spec
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.modeling.key_bias import PATH, layer_heads, steering_value
from sysbench_gpu.modeling.layer_bands import parse_layer_band

log = logging.getLogger(__name__)

DEFAULT_LAYERS = "mid-band"
DEFAULT_ALPHA = 0.05  # the heads map's FDR level, for a file that does not name its own
SESSION_AWARE_P = "session-permutation"  # top_heads.json's p_value.method when its q is session-aware


@dataclass(frozen=True)
class Steering:
    alpha: float
    layers_spec: str | None = None  # None: the layers of ``heads``, else mid-band
    heads: tuple[tuple[int, int], ...] | None = None  # [layer, head] pairs; None: every head
    heads_file: str | None = None

    def __post_init__(self) -> None:
        # α scales the span's attention weights (log α on the logits): a finite α > 0. An infinite α would
        # put all weight on the system text and record Infinity in the manifest.
        check_finite(self.alpha, "--steer-system")
        steering_value(self.alpha)  # refuses α <= 0
        if self.layers_spec is not None:
            parse_layer_spec(self.layers_spec, None, "--steer-layers")  # syntax now; the range once the depth is known

    def check_depth(self, n_layers: int, n_heads: int | None = None) -> None:
        """The layers and heads named exist in a model of this depth (read from its config before it loads)."""
        if self.layers_spec is not None or self.heads is None:
            self.layers(n_layers)
        where = self.heads_file or "--steer-heads"
        for index, (layer, head) in enumerate(self.heads or ()):
            if layer >= n_layers:
                raise SysbenchError(
                    f"{where}: heads[{index}] names layer {layer}; the model has {n_layers} layers (0-{n_layers - 1})"
                )
            if n_heads is not None and head >= n_heads:
                raise SysbenchError(
                    f"{where}: heads[{index}] names head {head}; the model has {n_heads} heads per layer "
                    f"(0-{n_heads - 1})"
                )

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
    warn_unsupported_heads(path, data, out)
    return tuple(out)


def unsupported_heads(data: Any, pairs: Sequence[tuple[int, int]]) -> tuple[list[tuple[int, int]], str]:
    """The pairs the file gives no significant session-aware q for, and why (for the warning)."""
    if not isinstance(data, Mapping):
        return list(pairs), "a bare list gives no q"
    method = data.get("p_value")
    if not isinstance(method, Mapping) or method.get("method") != SESSION_AWARE_P:
        return list(pairs), "no session-aware q: the file predates attention-analyze's session permutation test"
    alpha = data.get("alpha")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 < alpha < 1:
        alpha = DEFAULT_ALPHA
    q_by_head: dict[tuple[int, int], Any] = {}
    for item in data.get("details") or []:
        if isinstance(item, Mapping):
            q_by_head[(item.get("layer"), item.get("head"))] = item.get("q")
    weak = []
    for pair in pairs:
        q = q_by_head.get(pair)
        if not isinstance(q, (int, float)) or isinstance(q, bool) or not q < alpha:
            weak.append(pair)
    return weak, f"session-aware q >= {alpha} or missing"


def warn_unsupported_heads(path: Path, data: Any, pairs: Sequence[tuple[int, int]]) -> None:
    """One warning line when ``--steer-heads`` steers heads the head map does not call significant."""
    weak, reason = unsupported_heads(data, pairs)
    if not weak:
        return
    shown = ", ".join(f"[{layer}, {head}]" for layer, head in weak[:8]) + (" ..." if len(weak) > 8 else "")
    log.warning(
        "--steer-heads %s: %d of %d heads are not significant (%s): %s; steering them rests on no evidence "
        "that they carry the system message",
        path,
        len(weak),
        len(pairs),
        reason,
        shown,
    )


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
