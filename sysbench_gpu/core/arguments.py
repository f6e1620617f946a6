"""Checks of the flags many verbs share, in one place, run before any folder is made or model loaded.

Every verb validates in the same order: parse, check every argument and every input file's
readability, then create folders, then load models, then write (docs/architecture.md, Rules). ``check_shared_flags``
is called by the CLI for every verb right after parsing, on whichever of the shared flags the verb
has; the verb-specific checks below are called by the verbs themselves before their first write.
Each failure is one ``SysbenchError`` line naming the flag.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
from collections.abc import Callable, Iterable
from pathlib import Path

from sysbench_gpu.core.errors import SysbenchError

# argparse dest -> (flag, smallest allowed value). A dest a verb does not have is skipped; None is "not given".
SHARED_INTEGER_FLAGS: dict[str, tuple[str, int]] = {
    "seed": ("--seed", 0),
    "resamples": ("--resamples", 1),
    "bootstrap": ("--bootstrap", 1),
    "folds": ("--folds", 2),
    "top": ("--top", 1),
    "cpu_threads": ("--cpu-threads", 1),
    "data_parallel_size": ("--data-parallel-size", 1),
    "limit": ("--limit", 1),  # first N sessions: 0 selects none, a negative N would drop sessions from the end
    "max_tokens": ("--max-tokens", 1),
    "permutations": ("--permutations", 1),
}
# argparse dest -> (flag, must be > 0). Finite always.
SHARED_FLOAT_FLAGS: dict[str, tuple[str, bool]] = {
    "log_every": ("--log-every", True),
    "steer_system": ("--steer-system", True),  # α scales attention weights by α (log α on the logits): α > 0
}


def check_integer(value: int | None, flag: str, minimum: int) -> int | None:
    """``value`` unless it is below ``minimum``: one line naming the flag."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SysbenchError(f"{flag}: expected a whole number, got {value!r}")
    if value < minimum:
        wanted = "0 or more" if minimum == 0 else f"at least {minimum}"
        raise SysbenchError(f"{flag} must be {wanted}, got {value}")
    return value


def check_finite(value: float | None, flag: str, *, positive: bool = False) -> float | None:
    """``value`` unless it is NaN, infinite, or (``positive``) not above zero."""
    if value is None:
        return None
    if not math.isfinite(value):
        raise SysbenchError(f"{flag} must be a finite number, got {value}")
    if positive and value <= 0:
        raise SysbenchError(f"{flag} must be above 0, got {value}")
    return value


def check_shared_flags(args: argparse.Namespace) -> None:
    """Check whichever shared flags ``args`` has (called by the CLI before the verb runs)."""
    for dest, (flag, minimum) in SHARED_INTEGER_FLAGS.items():
        check_integer(getattr(args, dest, None), flag, minimum)
    for dest, (flag, positive) in SHARED_FLOAT_FLAGS.items():
        value = getattr(args, dest, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            check_finite(float(value), flag, positive=positive)
    check_replica_flags(getattr(args, "data_parallel_size", None), getattr(args, "ray_address", None))


def require_ray(what: str) -> None:
    """One line naming the ``[ray]`` extra where Ray is not installed (looked up, never imported)."""
    if importlib.util.find_spec("ray") is None:
        raise SysbenchError(f"{what} runs its replicas on Ray, which is not installed: pip install 'sysbench-gpu[ray]'")


def check_ray_address(address: str | None, flag: str = "--ray-address") -> str | None:
    """``auto`` or ``HOST:PORT`` (a Ray head's address), else one line naming the flag."""
    if address is None:
        return None
    text = str(address).strip()
    if text == "auto":
        return text
    host, colon, port = text.rpartition(":")
    if not colon or not host or "/" in text or not port.isdigit() or not 0 < int(port) < 65536:
        raise SysbenchError(
            f"{flag} {address!r}: expected auto or HOST:PORT, the Ray head's address (e.g. 10.0.0.1:6379)"
        )
    return text


def check_replica_flags(
    size: object,
    address: str | None,
    size_flag: str = "--data-parallel-size",
    address_flag: str = "--ray-address",
) -> str | None:
    """The checked Ray address: one only with replicas, and Ray installed for more than one (before any load)."""
    count = size if isinstance(size, int) and not isinstance(size, bool) else None
    checked = check_ray_address(address, address_flag)
    if checked is not None and (count or 1) < 2:
        raise SysbenchError(f"{address_flag} places data-parallel replicas; it needs {size_flag} 2 or more")
    if count is not None and count > 1:
        require_ray(f"{size_flag} {count}")
    return checked


def parse_layer_spec(spec: str, n_layers: int | None = None, flag: str = "--layers") -> list[int] | None:
    """Layer indices named by ``mid-band``, ``all``, ``N`` or ``N-M`` (inclusive), comma-separated.

    Without ``n_layers`` only the syntax is checked (``mid-band`` and ``all`` need the model's depth),
    and None is returned; with it, the sorted indices. ``5-2`` is empty (start after end), which is not
    the same fault as a layer past the model's last.
    """
    parts = [p.strip() for p in str(spec).split(",") if p.strip()]
    if not parts:
        raise SysbenchError(f"{flag}: no layer selected")
    chosen: set[int] = set()
    for part in parts:
        if part in ("mid-band", "all"):
            if n_layers is not None:
                third = n_layers // 3
                chosen.update(range(third, n_layers - third) if part == "mid-band" else range(n_layers))
            continue
        first, dash, last = part.partition("-")
        try:
            lo, hi = int(first), int(last if dash else first)
        except ValueError:
            raise SysbenchError(f"{flag}: {part!r} is not mid-band, all, N or N-M") from None
        if lo < 0 or hi < 0:
            raise SysbenchError(f"{flag}: {part!r} is not mid-band, all, N or N-M (layers count from 0)")
        if lo > hi:
            raise SysbenchError(f"{flag}: {part!r} is empty (start after end)")
        if n_layers is not None:
            if hi >= n_layers:
                raise SysbenchError(
                    f"{flag}: {part!r} is out of range (the model has {n_layers} layers, 0-{n_layers - 1})"
                )
            chosen.update(range(lo, hi + 1))
    if n_layers is None:
        return None
    if not chosen:
        raise SysbenchError(f"{flag}: no layer selected")
    return sorted(chosen)


def check_out_folder(
    out: str | Path,
    *,
    flag: str = "--out",
    inputs: Iterable[str | Path] = (),
    own_marker: str | None = None,
    kind: str = "output",
    is_own: Callable[[Path], bool] | None = None,
    inside_inputs: bool = False,
) -> Path:
    """Check an output folder before anything is made: never one of the inputs, and empty or already ours.

    ``inputs``: folders the verb reads (run directories, attention folders); ``--out`` may be none of them
    nor (unless ``inside_inputs``, for a verb whose docs put its folder inside a run) inside one.
    ``own_marker``: a file that only this verb's own output holds; ``is_own``: the same test where one
    file does not tell (an arena's manifest, a site of two kinds). A non-empty folder that passes
    neither is refused. Nothing is created here.
    """
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise SysbenchError(f"{path}: {flag} exists and is not a folder")
    resolved = path.resolve()
    for source in inputs:
        source_path = Path(source).resolve()
        if resolved == source_path:
            raise SysbenchError(f"{path}: {flag} is the input {source}; choose a new folder")
        if not inside_inputs and source_path in resolved.parents:
            raise SysbenchError(f"{path}: {flag} is inside the input {source}; choose a folder outside it")
    if (own_marker is None and is_own is None) or not path.is_dir() or not any(path.iterdir()):
        return path
    if (own_marker is not None and (path / own_marker).exists()) or (is_own is not None and is_own(path)):
        return path
    missing = f" (no {own_marker})" if own_marker is not None else ""
    raise SysbenchError(f"{path}: {flag} is not empty and is not an earlier {kind}{missing}; choose a new folder")
