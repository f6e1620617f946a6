"""The explorer's "Heads, failure probe, decay" section: what ``attention-analyze`` wrote in each attention folder.

For each attention directory given to ``explore --attention`` that holds ``heads.json``,
``probe.json`` or ``decay.json``, a small summary for ``data/index.js`` (top heads, the
probe's AUCs, the decay slopes) and its figures, copied under ``data/interp/`` so the
site still opens from disk on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sysbench_gpu.attention.analysis.interp_report import DECAY_FILE, HEADS_FILE, PROBE_FILE, TOP_HEADS_FILE
from sysbench_gpu.core.jsonio import read_json

FIGURES = ("heads_map.png", "probe_roc.png")


@dataclass
class InterpEntry:
    """One attention folder's summary for the index, and the figure files to copy (site path -> bytes)."""

    summary: dict[str, Any]
    files: dict[str, bytes] = field(default_factory=dict)


def interp_entry(directory: Path, position: int, name: str) -> InterpEntry | None:
    """The folder's summary, or None when ``attention-analyze`` has not run there."""
    if not any((directory / f).exists() for f in (HEADS_FILE, PROBE_FILE, DECAY_FILE)):
        return None
    summary: dict[str, Any] = {"name": name, "figures": []}
    if (directory / TOP_HEADS_FILE).exists():
        top = read_json(directory / TOP_HEADS_FILE, expect=dict)
        summary["top_heads"] = top.get("details", [])
        summary["criterion"] = top.get("criterion")
    if (directory / PROBE_FILE).exists():
        data = read_json(directory / PROBE_FILE, expect=dict)
        summary["probe"] = {key: data.get(key) for key in ("status", "reason", "probe", "baseline", "n_turns")}
    if (directory / DECAY_FILE).exists():
        data = read_json(directory / DECAY_FILE, expect=dict)
        summary["decay"] = [
            {
                "history": item["history"],
                "condition": item["condition"],
                "layer": item["layer_label"],
                "turn_slope": item["turn"]["slope"],
                "turn_ci95": item["turn"]["slope_ci95"],
                "distance_slope": item["distance"]["slope"],
                "distance_ci95": item["distance"]["slope_ci95"],
            }
            for item in data.get("series", [])
        ]
    figures = directory / "figures"
    names = [name for name in FIGURES if (figures / name).exists()]
    names += sorted(path.name for path in figures.glob("decay_*.png"))
    entry = InterpEntry(summary)
    for figure in names:
        site_path = f"data/interp/{position}_{figure}"
        entry.files[site_path] = (figures / figure).read_bytes()
        summary["figures"].append(site_path)
    return entry
