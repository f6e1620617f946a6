"""Device specs for the roofline: a packaged table (``device_specs.json``) and user JSON files.

``--device-spec`` takes a table name (``h100``, ``h200``, ``a100``, ``cpu``), a JSON file
holding one spec (``{"peak_flops": ..., "memory_bandwidth": ..., "memory_bytes": ...}``),
or ``FILE#NAME`` for a file laid out like the packaged table (``{"devices": {NAME: spec}}``).
``kernels_bench/measure_cpu_spec.py`` writes a one-spec file measured on this machine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.profiling.roofline import DeviceSpec

TABLE = "device_specs.json"
_FIELDS = ("peak_flops", "memory_bandwidth", "memory_bytes", "description", "source")


def builtin_table() -> dict[str, dict[str, Any]]:
    text = resources.files("sysbench_gpu").joinpath(TABLE).read_text(encoding="utf-8")
    return dict(json.loads(text)["devices"])


def spec_from_mapping(name: str, data: Mapping[str, Any], origin: str) -> DeviceSpec:
    """A ``DeviceSpec`` from a JSON object; a one-line error naming ``origin`` and the field."""
    if not isinstance(data, Mapping):
        raise SysbenchError(f"{origin}: a device spec must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(_FIELDS) - {"name"})
    if unknown:
        raise SysbenchError(f"{origin}: unknown field {unknown[0]!r} (fields: {', '.join(_FIELDS)})")
    for key in ("peak_flops", "memory_bandwidth"):
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise SysbenchError(f"{origin}: field {key!r} must be a positive number, got {value!r}")
    memory = data.get("memory_bytes")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, (int, float)) or memory <= 0):
        raise SysbenchError(f"{origin}: field 'memory_bytes' must be a positive number or null, got {memory!r}")
    return DeviceSpec(
        name=str(data.get("name") or name),
        peak_flops=float(data["peak_flops"]),
        memory_bandwidth=float(data["memory_bandwidth"]),
        memory_bytes=float(memory) if memory is not None else None,
        description=str(data.get("description") or ""),
        source=str(data.get("source") or origin),
    )


def load_device_spec(text: str) -> DeviceSpec:
    """Resolve ``--device-spec``: a packaged name, a one-spec JSON file, or ``FILE#NAME``."""
    table = builtin_table()
    if text.lower() in table:
        return spec_from_mapping(text.lower(), table[text.lower()], f"{TABLE} entry {text.lower()!r}")
    path_text, _, wanted = text.partition("#")
    path = Path(path_text)
    if not path.is_file():
        raise SysbenchError(f"--device-spec {text!r}: neither a known device ({', '.join(table)}) nor a JSON file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SysbenchError(f"{path}: not a readable JSON file ({error})") from None
    if isinstance(data, Mapping) and isinstance(data.get("devices"), Mapping):
        devices = data["devices"]
        if not wanted:
            if len(devices) != 1:
                raise SysbenchError(f"{path}: holds {len(devices)} devices; name one as {path}#NAME")
            wanted = next(iter(devices))
        if wanted not in devices:
            raise SysbenchError(f"{path}: no device {wanted!r} (has {', '.join(devices)})")
        return spec_from_mapping(wanted, devices[wanted], f"{path}: device {wanted!r}")
    if wanted:
        raise SysbenchError(f"{path}: holds one spec, not a 'devices' table; drop '#{wanted}'")
    return spec_from_mapping(path.stem, data, str(path))
