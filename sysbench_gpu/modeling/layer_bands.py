"""``--knockout-layers`` and ``--steer-layers``: ``mid-band``, ``all``, ``N``, ``N-M`` (inclusive), comma-separated."""

from __future__ import annotations

from sysbench_gpu.core.arguments import parse_layer_spec


def mid_band(n_layers: int) -> list[int]:
    """The middle third of the layers (10-19 of SmolLM2's 30)."""
    third = n_layers // 3
    return list(range(third, n_layers - third))


def parse_layer_band(spec: str, n_layers: int, flag: str = "--knockout-layers") -> list[int]:
    """Sorted layer indices named by ``spec``; one line naming the flag when a part is not understood."""
    layers = parse_layer_spec(spec, n_layers, flag)
    assert layers is not None  # given n_layers, the spec's indices
    return layers
