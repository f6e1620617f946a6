"""Files of an attention output directory: per-session arrays, per-rank shards, the merged table, the manifest.

Layout (docs/attention.md, "Output")::

    OUT/manifest.json
    OUT/sessions/<id>.<condition>.npz            written atomically; its presence marks the session done
    OUT/sessions/<id>.<condition>.skipped.json   a session that could not be measured, and why
    OUT/shards/rank<r>-of-<w>.jsonl              per-turn rows, appended as sessions finish
    OUT/turn_shares.jsonl                        merged per-turn table

A crash can tear the last line of a shard (the rows of one session are one write).
The next append cuts the torn tail first (``jsonl.append_lines``), readers ignore
an unterminated last line, and the merge (``turn_table``) recomputes from the ``.npz`` every row a
shard lacks, so a torn tail never blocks a rerun nor loses a row.
"""

from __future__ import annotations

import io
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sysbench_gpu.core import arguments, jsonl
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.jsonio import read_json
from sysbench_gpu.core.rundir import write_bytes_atomic, write_json_atomic

MANIFEST = "manifest.json"
TURN_TABLE = "turn_shares.jsonl"


def session_path(out: Path, system_id: int, condition: str) -> Path:
    return out / "sessions" / f"{system_id:04d}.{condition}.npz"


def skip_path(out: Path, system_id: int, condition: str) -> Path:
    return out / "sessions" / f"{system_id:04d}.{condition}.skipped.json"


def shard_path(out: Path, tag: str) -> Path:
    return out / "shards" / f"{tag}.jsonl"


def save_npz_atomic(path: Path, arrays: dict[str, np.ndarray]) -> None:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    write_bytes_atomic(path, buffer.getvalue())


def load_session(path: Path, keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays of one stored session (only ``keys`` when given: an .npz decompresses member by member)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {key: data[key] for key in (data.files if keys is None else keys)}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as error:
        # A torn or damaged file: zip, zlib and numpy each raise their own kind of error.
        raise SysbenchError(f"{path}: not a readable session file ({error or type(error).__name__})") from None


def append_lines(path: Path, lines: Sequence[str]) -> None:
    """Append ``lines`` in one locked, fsync'ed write, after cutting a torn last line left by a crash."""
    jsonl.append_lines(path, [(line + "\n").encode("utf-8") for line in lines])


def complete_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of every newline-terminated line; an unterminated last line is torn and left out."""
    if not path.exists():
        return []
    try:
        return [(number, line.decode("utf-8")) for number, line in jsonl.complete_lines(path.read_bytes())]
    except UnicodeDecodeError as error:
        raise SysbenchError(f"{path}: not UTF-8 text ({error})") from None


# ----------------------------------------------------------------- manifest


def read_manifest(out: Path) -> dict[str, Any]:
    path = out / MANIFEST
    if not path.exists():
        raise SysbenchError(f"{out}: not an attention output directory (no {MANIFEST})")
    return _load_manifest(path)


def _load_manifest(path: Path) -> dict[str, Any]:
    return read_json(path, expect=dict)


def check_attention_out(out: Path, run_dir: Path, *, flag: str = "--out", alone: bool = True) -> None:
    """Before anything is made: ``out`` is not the run it measures, and is new, empty or an attention output.

    The stage's own lock files (``.attention*.lock``) do not make a folder non-empty: a second process finds
    the holder's lock there. ``alone`` is False for torchrun's ranks, which may write their sessions before
    rank 0 writes the manifest; only the input check applies to them.
    """
    arguments.check_out_folder(out, flag=flag, inputs=[run_dir])
    if not alone or not out.is_dir() or (out / MANIFEST).exists():
        return
    others = sorted(p.name for p in out.iterdir() if not (p.name.startswith(".attention") and p.name.endswith(".lock")))
    if others:
        raise SysbenchError(
            f"{out}: {flag} is not empty and is not an attention output (no {MANIFEST}; holds {others[0]}); "
            "choose a new folder"
        )


def check_settings(out: Path, settings: dict[str, Any], write: bool = True) -> dict[str, Any]:
    """Refuse settings that differ from those already recorded in ``out``; merge and (if ``write``) record them."""
    manifest_path = out / MANIFEST
    manifest = _load_manifest(manifest_path) if manifest_path.exists() else {}
    for key, value in settings.items():
        if key in manifest and manifest[key] != value:
            raise SysbenchError(
                f"{manifest_path}: field {key!r} is {manifest[key]!r} but this run asks for {value!r}; "
                "use another --out directory"
            )
    manifest.update(settings)
    if write:  # under torchrun only rank 0 writes the manifest; the others check it
        write_json_atomic(manifest_path, manifest)
    return manifest
