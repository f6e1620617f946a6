"""SysBench data model, loader, validator, download and statistics.

Provenance: SysBench, "SysBench: Can Large Language Models Follow System Messages?"
(Qin et al., arXiv 2408.10943). The official data file is
``datas/system_benchmark_eval_datas.json`` in the upstream repository
PKU-Baichuan-MLSystemLab/SysBench at commit 627ffa8 (sha256 below). Upstream
declares no license, so this project ships no copy: users download the file with
``sysbench-gpu data download`` or point ``--data`` at their own copy.

Upstream schema (one JSON array of sessions):

- ``system_id`` int; ``system_prompt`` str; ``rounds_related`` bool (true:
  multi-turn dependent, false: multi-turn parallel); ``领域`` domain; ``场景`` scene.
- ``messages``: ``[system, user1, assistant1, ..., userN, assistantN]``; assistant
  contents are reference replies, ``null`` where known to be missing.
- ``prompt_infos``: keyed by the *user message text*, each
  ``{"alignment": "align"|"misalign", "criteria": {"1": {"criteria_id": 1,
  "criteria_content": str, "criteria_type": "内容约束"}, ...}}``.

Sessions load into frozen dataclasses with English names for constraint types and
alignments; every validation error names the file, session, turn and field.
"""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from sysbench_gpu import jsonio
from sysbench_gpu.errors import SysbenchError, where

OFFICIAL_SHA256 = "d58186c227d8284e153619005cea704010e7290b4d3329c23445c6b504de1af2"
OFFICIAL_REPO = "PKU-Baichuan-MLSystemLab/SysBench"
OFFICIAL_COMMIT = "627ffa8"
OFFICIAL_PATH = "datas/system_benchmark_eval_datas.json"
OFFICIAL_URL = f"https://github.com/{OFFICIAL_REPO}/raw/{OFFICIAL_COMMIT}/{OFFICIAL_PATH}"
OFFICIAL_FILENAME = "system_benchmark_eval_datas.json"

# Chinese constraint type (as in the data) -> English name used everywhere else.
CONSTRAINT_TYPES: Mapping[str, str] = {
    "动作约束": "action",
    "内容约束": "content",
    "背景约束": "background",
    "角色约束": "role",
    "格式约束": "format",
    "风格约束": "style",
}
TYPE_ORDER: tuple[str, ...] = ("action", "content", "background", "role", "format", "style")
ALIGNMENTS: Mapping[str, str] = {"align": "aligned", "misalign": "misaligned"}
ALIGNMENT_ORDER: tuple[str, ...] = ("aligned", "misaligned")
GROUP_ORDER: tuple[str, ...] = ("dependent", "parallel")
NO_ALIGNMENT = "none"  # MT-Eval turns: the SysBench alignment does not apply


@dataclass(frozen=True)
class Constraint:
    """One checklist item of a turn."""

    id: int  # checklist number, 1-based, as the judge sees it
    content: str
    type: str  # English: one of TYPE_ORDER
    type_raw: str  # as written in the data, e.g. "内容约束"


@dataclass(frozen=True)
class MTEvalTurn:
    """What an MT-Eval turn carries beyond the shared fields (see docs/mteval.md)."""

    turn_id: str  # the turn's ``id`` in the file
    inst: str | None = None  # the instruction the answer is judged against (refinement, expansion)


@dataclass(frozen=True)
class MTEvalDialogue:
    """What an MT-Eval dialogue carries beyond the shared fields (see docs/mteval.md)."""

    dialogue_id: str  # the dialogue's ``id`` in the file (not unique in the cls_ablation files)
    setting: str  # "multi" | "single" | "ablation"
    inst_name: str | None = None  # global-inst: the verifiable instruction of every answered turn
    inst_args: Mapping[str, Any] = field(default_factory=dict, hash=False)
    n_distracts: int | None = None  # irrelevant-context ablation: unrelated turns in front


@dataclass(frozen=True)
class Turn:
    """One user turn with its checklist; ``reference`` is None when known missing.

    MT-Eval turns have no checklist; ``answered`` is False for a context turn, whose
    ``reference`` goes into the history as given and is never generated.
    """

    index: int  # 1-based
    user: str
    reference: str | None
    alignment: str  # "aligned" | "misaligned" (MT-Eval: NO_ALIGNMENT)
    constraints: tuple[Constraint, ...]
    answered: bool = True
    mteval: MTEvalTurn | None = None


@dataclass(frozen=True)
class Session:
    system_id: int
    system_prompt: str
    turns: tuple[Turn, ...]
    dependent: bool  # rounds_related: True = multi-turn dependent
    domain: str | None
    scene: str | None
    benchmark: str = "sysbench"  # "sysbench" | "mteval"
    task: str | None = None  # MT-Eval task, e.g. "refinement", "recollection-cls" (mteval.data.TASKS)
    mteval: MTEvalDialogue | None = None

    @property
    def group(self) -> str:
        return "dependent" if self.dependent else "parallel"

    def turn(self, index: int) -> Turn:
        return self.turns[index - 1]


@dataclass(frozen=True)
class Dataset:
    path: Path
    sha256: str
    sessions: tuple[Session, ...]

    @property
    def is_official(self) -> bool:
        return self.sha256 == OFFICIAL_SHA256

    @property
    def benchmark(self) -> str:
        return self.sessions[0].benchmark if self.sessions else "sysbench"

    def by_id(self) -> dict[int, Session]:
        return {session.system_id: session for session in self.sessions}

    def select(self, system_ids: Iterable[int] | None = None, limit: int | None = None) -> list[Session]:
        """Sessions in file order, restricted to ``system_ids`` and then to the first ``limit``."""
        return select_sessions(self.sessions, system_ids, limit, source=self.path)


def select_sessions(
    sessions: Sequence[Session],
    system_ids: "SessionIds | Iterable[int] | None" = None,
    limit: int | None = None,
    source: Path | str = "<data>",
) -> list[Session]:
    """Sessions in their order, restricted to ``system_ids`` (unknown ids are an error), then to the first ``limit``."""
    chosen = list(sessions)
    if system_ids is not None:
        wanted = system_ids if isinstance(system_ids, SessionIds) else SessionIds.of(system_ids)
        missing = wanted.missing_from({s.system_id for s in chosen})
        if missing:
            raise SysbenchError(f"{source}: no session with system_id {missing}")
        chosen = [s for s in chosen if s.system_id in wanted]
    if limit is not None:
        chosen = chosen[:limit]
    return chosen


_NAMED_MISSING = 5


@dataclass(frozen=True)
class SessionIds:
    """Session ids as the user wrote them (``1,2,5-9``): inclusive ranges, never expanded into a list.

    ``--sessions 1-400000000`` costs two integers; membership and the ids missing
    from a dataset are computed against the dataset's ids, so the work is bounded
    by the data, not by the range.
    """

    ranges: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, ids: Iterable[int]) -> "SessionIds":
        return cls(tuple((i, i) for i in ids))

    def __contains__(self, system_id: object) -> bool:
        return isinstance(system_id, int) and any(low <= system_id <= high for low, high in self.ranges)

    def __iter__(self) -> Iterator[int]:
        """Every id in the order written, repeats dropped (use only after checking against a dataset)."""
        seen: set[int] = set()
        for low, high in self.ranges:
            for system_id in range(low, high + 1):
                if system_id not in seen:
                    seen.add(system_id)
                    yield system_id

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SessionIds):
            return self.ranges == other.ranges
        if isinstance(other, (list, tuple)):
            return self.size() == len(other) and list(self) == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.ranges)

    def size(self) -> int:
        """How many distinct ids (ranges merged, nothing expanded)."""
        total, end = 0, None
        for low, high in sorted(self.ranges):
            if end is not None and low <= end:
                low = end + 1
            if high >= low:
                total += high - low + 1
            end = high if end is None else max(end, high)
        return total

    def missing_from(self, available: set[int]) -> str:
        """The requested ids absent from ``available``, as ``501-400000000`` or ``7, 9``; "" when none."""
        present = sorted(available)
        gaps: list[tuple[int, int]] = []
        for low, high in self.ranges:
            cursor = low
            start = bisect_left(present, low)
            for system_id in present[start:]:
                if system_id > high:
                    break
                if system_id > cursor:
                    gaps.append((cursor, system_id - 1))
                cursor = system_id + 1
            if cursor <= high:
                gaps.append((cursor, high))
        gaps = sorted(set(gaps))
        named = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in gaps[:_NAMED_MISSING])
        return named + (f" and {len(gaps) - _NAMED_MISSING} more" if len(gaps) > _NAMED_MISSING else "")

    def __str__(self) -> str:
        return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in self.ranges)


def parse_session_ids(text: str | None) -> SessionIds | None:
    """``"1,2,5-9"`` -> ids 1, 2, 5..9 (ranges stay ranges); None or empty -> None."""
    if not text:
        return None
    ranges: list[tuple[int, int]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part[1:]:
                cut = part.index("-", 1)
                low, high = int(part[:cut]), int(part[cut + 1 :])
                if high < low:
                    raise ValueError
            else:
                low = high = int(part)
        except ValueError:
            raise SysbenchError(f"--sessions: {part!r} is not a number or a range like 3-7") from None
        ranges.append((low, high))
    return SessionIds(tuple(ranges)) if ranges else None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


DEMO_NAME = "demo"


def demo_data_path() -> Path:
    """The packaged demo set: 5 English sessions in upstream's schema, written for this project."""
    from importlib import resources

    return Path(str(resources.files("sysbench_gpu").joinpath("demo", "demo_sessions.json")))


def resolve_data_path(path: str | Path) -> Path:
    """Accept a data file or a directory holding one (official name, ``sessions.json`` or a lone ``*.json``).

    The name ``demo`` (when no such file or folder exists) is the small English demo set
    packaged with sysbench-gpu.
    """
    if str(path) == DEMO_NAME and not Path(path).exists():
        return demo_data_path()
    path = Path(path)
    if path.is_dir():
        for name in (OFFICIAL_FILENAME, "sessions.json"):
            if (path / name).is_file():
                return path / name
        candidates = sorted(path.glob("*.json"))
        if len(candidates) == 1:
            return candidates[0]
        raise SysbenchError(
            f"{path}: directory holds no {OFFICIAL_FILENAME} or sessions.json"
            + (f" and {len(candidates)} other .json files" if candidates else "")
        )
    if not path.exists():
        raise SysbenchError(f"{path}: no such data file (download it with `sysbench-gpu data download`)")
    return path


def load_dataset(path: str | Path, *, system_message: str | None = None, task: str | None = None) -> Dataset:
    """Load and validate a SysBench file in upstream's schema, or an MT-Eval task file.

    The format is detected from the content (``detect_format``). ``system_message`` and
    ``task`` apply to MT-Eval only (see ``mteval.data.parse_dialogues``).
    """
    resolved = resolve_data_path(path)
    raw_bytes = resolved.read_bytes()
    text = jsonio.decode_utf8(raw_bytes, resolved)
    sha256 = hashlib.sha256(raw_bytes).hexdigest()
    if detect_format(text) == "mteval":
        from sysbench_gpu.mteval.data import parse_dialogues

        sessions = parse_dialogues(text, source=resolved, system_message=system_message, task=task)
        return Dataset(path=resolved, sha256=sha256, sessions=tuple(sessions))
    if system_message is not None or task is not None:
        option = "--system-message" if system_message is not None else "--task"
        raise SysbenchError(f"{resolved}: {option} applies to MT-Eval files only; SysBench sessions carry their own")
    raw = jsonio.loads(text, resolved)
    if isinstance(raw, dict) or (raw and isinstance(raw, list) and isinstance(raw[0], dict)
                                 and "conv" in raw[0] and "prompt_infos" not in raw[0]):
        raise SysbenchError(
            f"{resolved}: neither a SysBench file (a JSON array of sessions with 'prompt_infos') nor an MT-Eval "
            "file (JSON Lines, one dialogue object with a 'conv' list per line)"
        )
    sessions = parse_sessions(raw, source=resolved)
    return Dataset(path=resolved, sha256=sha256, sessions=tuple(sessions))


def detect_format(text: str) -> str:
    """``"mteval"`` for JSON Lines of objects (MT-Eval dialogues), else ``"sysbench"`` (a JSON array).

    A file that starts with ``{`` and is not one JSON object is JSON Lines; a single
    object counts as MT-Eval only when it has a ``conv`` list. Everything else takes
    the SysBench path, whose errors name what is wrong.
    """
    body = text.lstrip("\ufeff \t\r\n")
    if not body.startswith("{"):
        return "sysbench"
    try:
        whole = json.loads(body)
    except json.JSONDecodeError:
        return "mteval"
    except RecursionError:
        return "sysbench"  # whose reader reports the nesting as one clear line
    return "mteval" if isinstance(whole, dict) and "conv" in whole else "sysbench"


def parse_sessions(raw: Any, source: Path | str = "<data>") -> list[Session]:
    if not isinstance(raw, list):
        raise SysbenchError(f"{source}: expected a JSON array of sessions, found {type(raw).__name__}")
    sessions: list[Session] = []
    seen: set[int] = set()
    for position, item in enumerate(raw):
        session = _parse_session(item, position, source)
        if session.system_id in seen:
            raise SysbenchError(f"{where(source, session.system_id, field='system_id')}: duplicate system_id")
        seen.add(session.system_id)
        sessions.append(session)
    if not sessions:
        raise SysbenchError(f"{source}: no sessions")
    return sessions


def _require(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], loc: str) -> Any:
    if key not in obj:
        raise SysbenchError(f"{loc}: missing field {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise SysbenchError(f"{loc}: field {key!r} should be {names}, found {type(value).__name__}")
    return value


def _parse_session(item: Any, position: int, source: Path | str) -> Session:
    if not isinstance(item, dict):
        raise SysbenchError(f"{source}: entry {position} is {type(item).__name__}, expected an object")
    system_id = item.get("system_id", f"#{position}")
    loc = where(source, system_id)
    system_id = _require(item, "system_id", int, f"{source}: entry {position}")
    system_prompt = _require(item, "system_prompt", str, loc)
    messages = _require(item, "messages", list, loc)
    prompt_infos = _require(item, "prompt_infos", dict, loc)
    dependent = _require(item, "rounds_related", bool, loc)
    domain = item.get("领域")
    scene = item.get("场景")

    if not messages or not isinstance(messages[0], dict) or messages[0].get("role") != "system":
        raise SysbenchError(f"{where(source, system_id, field='messages')}: message 0 must have role 'system'")
    body = messages[1:]
    if len(body) % 2 or not body:
        raise SysbenchError(
            f"{where(source, system_id, field='messages')}: expected system then user/assistant pairs, "
            f"found {len(messages)} messages"
        )
    turns: list[Turn] = []
    for index in range(len(body) // 2):
        turn_no = index + 1
        user_msg, assistant_msg = body[2 * index], body[2 * index + 1]
        for message, role in ((user_msg, "user"), (assistant_msg, "assistant")):
            if not isinstance(message, dict) or message.get("role") != role:
                found = message.get("role") if isinstance(message, dict) else type(message).__name__
                raise SysbenchError(
                    f"{where(source, system_id, turn_no, 'messages')}: expected role {role!r}, found {found!r}"
                )
            if "content" not in message:
                raise SysbenchError(f"{where(source, system_id, turn_no, 'messages')}: {role} message has no 'content'")
        user = user_msg["content"]
        if not isinstance(user, str) or not user:
            raise SysbenchError(f"{where(source, system_id, turn_no, 'messages')}: user content must be a non-empty string")
        reference = assistant_msg["content"]
        if reference is not None and not isinstance(reference, str):
            raise SysbenchError(
                f"{where(source, system_id, turn_no, 'messages')}: assistant content must be a string or null"
            )
        info = prompt_infos.get(user)
        if info is None:
            raise SysbenchError(
                f"{where(source, system_id, turn_no, 'prompt_infos')}: no entry for the user message "
                f"{_preview(user)}"
            )
        turns.append(_parse_turn(info, turn_no, user, reference, source, system_id))
    return Session(
        system_id=system_id,
        system_prompt=system_prompt,
        turns=tuple(turns),
        dependent=dependent,
        domain=domain if isinstance(domain, str) else None,
        scene=scene if isinstance(scene, str) else None,
    )


def _parse_turn(info: Any, turn_no: int, user: str, reference: str | None, source: Path | str, system_id: int) -> Turn:
    loc = where(source, system_id, turn_no)
    if not isinstance(info, dict):
        raise SysbenchError(f"{loc}, field 'prompt_infos': entry should be an object")
    alignment_raw = _require(info, "alignment", str, loc)
    if alignment_raw not in ALIGNMENTS:
        raise SysbenchError(f"{loc}, field 'alignment': unknown value {alignment_raw!r} (expected align or misalign)")
    criteria = _require(info, "criteria", dict, loc)
    if not criteria:
        raise SysbenchError(f"{loc}, field 'criteria': empty checklist")
    constraints: list[Constraint] = []
    for key, entry in criteria.items():
        try:
            number = int(key)
        except (TypeError, ValueError):
            raise SysbenchError(f"{loc}, field 'criteria': checklist id {key!r} is not an integer") from None
        cloc = f"{loc}, constraint {key}"
        if not isinstance(entry, dict):
            raise SysbenchError(f"{cloc}: should be an object")
        criteria_id = entry.get("criteria_id", number)
        if isinstance(criteria_id, bool) or not isinstance(criteria_id, (int, str)) or str(criteria_id) != str(number):
            raise SysbenchError(f"{cloc}, field 'criteria_id': {criteria_id!r} does not match its key {key!r}")
        content = _require(entry, "criteria_content", str, cloc)
        type_raw = _require(entry, "criteria_type", str, cloc)
        if type_raw not in CONSTRAINT_TYPES:
            known = ", ".join(CONSTRAINT_TYPES)
            raise SysbenchError(f"{cloc}, field 'criteria_type': unknown constraint type {type_raw!r} (known: {known})")
        constraints.append(Constraint(id=number, content=content, type=CONSTRAINT_TYPES[type_raw], type_raw=type_raw))
    ids = [c.id for c in constraints]
    if len(set(ids)) != len(ids):
        raise SysbenchError(f"{loc}, field 'criteria': duplicate checklist ids {ids}")
    constraints.sort(key=lambda c: c.id)
    return Turn(
        index=turn_no,
        user=user,
        reference=reference,
        alignment=ALIGNMENTS[alignment_raw],
        constraints=tuple(constraints),
    )


def _preview(text: str, width: int = 40) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= width else flat[:width] + "…")


# ---------------------------------------------------------------- statistics


def dataset_stats(sessions: Sequence[Session]) -> dict[str, Any]:
    """Table 1 of the paper, computed from the sessions."""
    turns = [turn for session in sessions for turn in session.turns]
    per_turn = [len(turn.constraints) for turn in turns]
    by_type = Counter(c.type for turn in turns for c in turn.constraints)
    by_domain_turns = Counter(session.domain or "unknown" for session in sessions for _ in session.turns)
    by_domain_sessions = Counter(session.domain or "unknown" for session in sessions)
    return {
        "n_sessions": len(sessions),
        "n_turns": len(turns),
        "n_aligned": sum(turn.alignment == "aligned" for turn in turns),
        "n_misaligned": sum(turn.alignment == "misaligned" for turn in turns),
        "n_dependent": sum(session.dependent for session in sessions),
        "n_parallel": sum(not session.dependent for session in sessions),
        "n_constraints": sum(per_turn),
        "constraints_per_turn": {
            "mean": round(sum(per_turn) / len(per_turn), 4) if per_turn else 0.0,
            "min": min(per_turn, default=0),
            "max": max(per_turn, default=0),
        },
        "constraints_by_type": {name: by_type.get(name, 0) for name in TYPE_ORDER},
        "turns_by_domain": dict(by_domain_turns.most_common()),
        "sessions_by_domain": dict(by_domain_sessions.most_common()),
        "mean_system_prompt_chars": round(sum(len(s.system_prompt) for s in sessions) / len(sessions), 1)
        if sessions
        else 0.0,
        "n_missing_references": sum(turn.reference is None for turn in turns),
    }


def format_stats(stats: Mapping[str, Any], dataset: Dataset) -> str:
    lines = [
        f"file            {dataset.path}",
        f"sha256          {dataset.sha256}" + ("  (official)" if dataset.is_official else "  (not the official file)"),
        f"sessions        {stats['n_sessions']}  (dependent {stats['n_dependent']}, parallel {stats['n_parallel']})",
        f"turns           {stats['n_turns']}  (aligned {stats['n_aligned']}, misaligned {stats['n_misaligned']})",
        f"constraints     {stats['n_constraints']}  ({stats['constraints_per_turn']['mean']:.2f} per turn, "
        f"{stats['constraints_per_turn']['min']} to {stats['constraints_per_turn']['max']})",
        "by type         " + ", ".join(f"{k} {v}" for k, v in stats["constraints_by_type"].items()),
        f"domains         {len(stats['sessions_by_domain'])}",
        f"missing refs    {stats['n_missing_references']} turns",
    ]
    return "\n".join(lines)
