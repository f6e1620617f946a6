"""SysBench data: loader, validator and statistics (the session model is ``core.sessions``, the download ``download``).

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

Sessions load into the frozen dataclasses of ``core.sessions`` with English names for
constraint types and alignments; every validation error names the file, session, turn and field.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sysbench_gpu.core import jsonio
from sysbench_gpu.core.errors import SysbenchError, where
from sysbench_gpu.core.sessions import Constraint, Dataset, Session, Turn

OFFICIAL_SHA256 = "d58186c227d8284e153619005cea704010e7290b4d3329c23445c6b504de1af2"
BENCHMARK = "sysbench"  # the registered name (benchmark.py), stored in every session
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


def claims_text(text: str) -> bool:
    """Whether a file's text takes the SysBench path: a JSON array, or anything that is no JSON Lines.

    A file that starts with ``{`` and is not one JSON object is JSON Lines (another
    benchmark's); a single object is SysBench's only without a ``conv`` list (its reader then
    reports what is wrong).
    """
    body = text.lstrip("\ufeff \t\r\n")
    if not body.startswith("{"):
        return True
    try:
        whole = json.loads(body)
    except json.JSONDecodeError:
        return False
    except RecursionError:
        return True  # whose reader reports the nesting as one clear line
    return not (isinstance(whole, dict) and "conv" in whole)


def parse_text(text: str, source: Path, *, system_message: str | None = None, task: str | None = None) -> list[Session]:
    """Sessions of a SysBench file in upstream's schema; every error names file, session, turn and field."""
    if system_message is not None or task is not None:
        option = "--system-message" if system_message is not None else "--task"
        raise SysbenchError(f"{source}: {option} applies to MT-Eval files only; SysBench sessions carry their own")
    raw = jsonio.loads(text, source)
    if isinstance(raw, dict) or (
        raw and isinstance(raw, list) and isinstance(raw[0], dict) and "conv" in raw[0] and "prompt_infos" not in raw[0]
    ):
        raise SysbenchError(
            f"{source}: neither a SysBench file (a JSON array of sessions with 'prompt_infos') nor an MT-Eval "
            "file (JSON Lines, one dialogue object with a 'conv' list per line)"
        )
    return parse_sessions(raw, source=source)


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
            raise SysbenchError(
                f"{where(source, system_id, turn_no, 'messages')}: user content must be a non-empty string"
            )
        reference = assistant_msg["content"]
        if reference is not None and not isinstance(reference, str):
            raise SysbenchError(
                f"{where(source, system_id, turn_no, 'messages')}: assistant content must be a string or null"
            )
        info = prompt_infos.get(user)
        if info is None:
            raise SysbenchError(
                f"{where(source, system_id, turn_no, 'prompt_infos')}: no entry for the user message {_preview(user)}"
            )
        turns.append(_parse_turn(info, turn_no, user, reference, source, system_id))
    return Session(
        system_id=system_id,
        system_prompt=system_prompt,
        turns=tuple(turns),
        dependent=dependent,
        domain=domain if isinstance(domain, str) else None,
        scene=scene if isinstance(scene, str) else None,
        benchmark=BENCHMARK,
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
