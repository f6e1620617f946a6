"""``--knockout-layers`` and ``--steer-layers``: ``mid-band``, ``all``, ``N``, ``N-M`` (inclusive), comma-separated."""

from __future__ import annotations

from sysbench_gpu.core.errors import SysbenchError


def mid_band(n_layers: int) -> list[int]:
    """The middle third of the layers (10-19 of SmolLM2's 30)."""
    third = n_layers // 3
    return list(range(third, n_layers - third))


def parse_layer_band(spec: str, n_layers: int, flag: str = "--knockout-layers") -> list[int]:
    """Sorted layer indices named by ``spec``; one line naming the flag when a part is not understood."""
    chosen: set[int] = set()
    for part in [p.strip() for p in str(spec).split(",") if p.strip()]:
        if part == "mid-band":
            chosen.update(mid_band(n_layers))
        elif part == "all":
            chosen.update(range(n_layers))
        else:
            first, _, last = part.partition("-")
            try:
                lo, hi = int(first), int(last or first)
            except ValueError:
                raise SysbenchError(f"{flag}: {part!r} is not mid-band, all, N or N-M") from None
            if not 0 <= lo <= hi < n_layers:
                raise SysbenchError(
                    f"{flag}: {part!r} is out of range (the model has {n_layers} layers, 0-{n_layers - 1})"
                )
            chosen.update(range(lo, hi + 1))
    if not chosen:
        raise SysbenchError(f"{flag}: no layer selected")
    return sorted(chosen)
