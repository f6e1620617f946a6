"""The model's ``config.json`` for the roofline: the packaged reference table, a file or folder, or the hub cache.

``find_model_config`` looks, in order, at ``--model-config`` (a packaged name, a file or
a folder), the paths the run's manifest records, the embedded model, a local folder and
a hub id already in the local cache; it never downloads.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.engines.models import is_embedded, resolve_model
from sysbench_gpu.profiling.inputs import RunInputs

MODEL_TABLE = "model_configs.json"


def reference_configs() -> dict[str, dict[str, Any]]:
    text = resources.files("sysbench_gpu").joinpath(MODEL_TABLE).read_text(encoding="utf-8")
    return dict(json.loads(text)["models"])


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SysbenchError(f"{path}: not a readable config.json ({error})") from None
    if not isinstance(data, dict):
        raise SysbenchError(f"{path}: a config.json must hold a JSON object")
    return data


def _config_in(candidate: str | None) -> Path | None:
    if not candidate:
        return None
    path = Path(candidate)
    if path.is_file() and path.suffix == ".json":
        return path
    if (path / "config.json").is_file():
        return path / "config.json"
    return None


def _hub_cached_config(model: str) -> Path | None:
    if "/" not in model or Path(model).exists():
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(model, "config.json")
    return Path(found) if isinstance(found, str) else None


def find_model_config(inputs: RunInputs, override: str | None = None) -> tuple[dict[str, Any], str]:
    """The model's config and where it came from; a one-line error naming what was tried."""
    table = reference_configs()
    if override:
        if override.lower() in table:
            entry = dict(table[override.lower()])
            return entry, f"{MODEL_TABLE} entry {override.lower()!r} ({entry.get('source', 'packaged')})"
        path = _config_in(override)
        if path is None:
            raise SysbenchError(
                f"--model-config {override!r}: not a config.json, a folder holding one, or a packaged name "
                f"({', '.join(table)})"
            )
        return _read_config(path), str(path)
    described = inputs.described
    tried = []
    for candidate in (described.get("model_path"), described.get("path"), described.get("model")):
        path = _config_in(candidate)
        if path is not None:
            return _read_config(path), str(path)
        if candidate:
            tried.append(str(candidate))
    model = inputs.model
    if model:
        if is_embedded(model):
            path = _config_in(resolve_model(model))
            if path is not None:
                return _read_config(path), str(path)
        path = _config_in(model) or _hub_cached_config(model)
        if path is not None:
            return _read_config(path), str(path)
        tried.append(model)
    raise SysbenchError(
        f"{inputs.run_dir / 'manifest.json'}: cannot find the model's config.json (tried "
        f"{', '.join(dict.fromkeys(tried)) or 'no model named'}); pass --model-config FILE, a model folder, "
        f"or one of {', '.join(table)}"
    )
