"""MT-Eval task files -> the shared Session/Turn model; statistics and download (the task table: ``tasks``).

An MT-Eval file is JSON Lines, one dialogue per line::

    {"id": str, "conv": [{"user": str, "sys": str, "id": str, "do_inference": bool, "inst"?: str}, ...],
     "inst_name"?: str, "inst_args"?: {...}, "n_distracts"?: int}

Mapping (docs/mteval.md):

- ``Session.system_id`` is the dialogue's 1-based line number in the file (dialogue ids are
  strings and are not unique in the ``cls_ablation_*`` files); the file's ``id`` is kept as
  ``Session.mteval.dialogue_id``. A snapshot written by ``dialogue_to_json`` carries its
  ``system_id`` so a subset keeps its numbers.
- ``Session.system_prompt`` is MT-Eval's default assistant message unless the caller gives
  another (``""``: no system message).
- ``Turn.index`` is the 1-based position in ``conv`` (context turns count), so
  ``session.turn(record.turn)`` works for MT-Eval as for SysBench. ``Turn.answered`` is
  ``do_inference``; ``Turn.reference`` is ``sys``, or None where an answered turn's ``sys``
  is empty (no reference: ``*_single``, global-inst).
- ``Session.task`` comes from the file name as upstream names its files
  (``refinement_multi.jsonl`` -> ``refinement``), or from the caller.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.mteval.rules import INSTRUCTION_NAMES, check_instruction_args
from sysbench_gpu.benchmarks.mteval.tasks import (
    BENCHMARK,
    DEFAULT_SYSTEM_MESSAGE,
    TASKS,
    TaskInfo,
    task_from_name,
)
from sysbench_gpu.core.errors import SysbenchError, where
from sysbench_gpu.core.sessions import (
    NO_ALIGNMENT,
    MTEvalDialogue,
    MTEvalTurn,
    Session,
    Turn,
)

# ------------------------------------------------------------------ parsing


def parse_dialogues(
    text: str,
    source: Path | str = "<mteval>",
    *,
    system_message: str | None = None,
    task: str | None = None,
) -> list[Session]:
    """Every dialogue of an MT-Eval JSON Lines text, validated; errors name file, line, dialogue, turn and field."""
    named = task_from_name(task) if task is not None else task_from_name(str(source))
    if task is not None and named is None:
        raise SysbenchError(f"{source}: unknown MT-Eval task {task!r} (known: {', '.join(TASKS)})")
    objects: list[tuple[int, dict[str, Any]]] = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as error:
            raise SysbenchError(
                f"{source}: line {line_no}: not valid JSON at column {error.colno}: {error.msg}"
            ) from None
        except RecursionError:
            raise SysbenchError(f"{source}: line {line_no}: JSON nested too deeply to read") from None
        if not isinstance(obj, dict):
            raise SysbenchError(f"{source}: line {line_no}: is {type(obj).__name__}, expected a dialogue object")
        objects.append((line_no, obj))
    if not objects:
        raise SysbenchError(f"{source}: no dialogues")
    if named is None:
        named = _task_from_content(objects, source)
    task_name, setting = named
    if not setting:
        setting = _setting_from_content(task_name, objects)
    sessions: list[Session] = []
    seen: dict[int, int] = {}
    for line_no, obj in objects:
        session = _parse_dialogue(obj, line_no, source, task_name, setting, system_message)
        if session.system_id in seen:
            raise SysbenchError(
                f"{source}: line {line_no}: field 'system_id' {session.system_id} repeats line "
                f"{seen[session.system_id]}"
            )
        seen[session.system_id] = line_no
        sessions.append(session)
    return sessions


def _task_from_content(objects: Sequence[tuple[int, dict[str, Any]]], source: Path | str) -> tuple[str, str]:
    recorded = {obj.get("task") for _, obj in objects}
    if len(recorded) == 1 and isinstance(next(iter(recorded)), str) and next(iter(recorded)) in TASKS:
        return next(iter(recorded)), ""  # a snapshot written by dialogue_to_json
    if all("inst_name" in obj for _, obj in objects):
        return "recollection-global-inst", ""
    raise SysbenchError(
        f"{source}: cannot tell the MT-Eval task from the file name; name the file as upstream does "
        f"(e.g. refinement_multi.jsonl, recollection_multi_cls.jsonl) or pass --task (one of {', '.join(TASKS)})"
    )


def _setting_from_content(task: str, objects: Sequence[tuple[int, dict[str, Any]]]) -> str:
    recorded = {obj.get("setting") for _, obj in objects}
    if len(recorded) == 1 and next(iter(recorded)) in ("multi", "single", "ablation"):
        return str(next(iter(recorded)))
    if task.startswith(("cls-ablation", "refinement-irrelevant")):
        return "ablation"
    single = all(isinstance(obj.get("conv"), list) and len(obj["conv"]) == 1 for _, obj in objects)
    return "single" if single else "multi"


def _where(source: Path | str, line: int, dialogue: object, turn: int | None = None, field: str | None = None) -> str:
    """``file: line 7, dialogue '7_rewrite_qa', turn 3, field 'inst'``."""
    head = f"{source}: line {line}" + (f", dialogue {dialogue!r}" if dialogue is not None else "")
    rest = where(None, None, turn, field)
    return f"{head}, {rest}" if rest else head


def _text_id(value: Any, loc: str, key: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise SysbenchError(f"{loc}, field {key!r}: should be a string, found {type(value).__name__}")
    return str(value)


def _parse_dialogue(
    obj: Mapping[str, Any],
    line: int,
    source: Path | str,
    task: str,
    setting: str,
    system_message: str | None,
) -> Session:
    if "id" not in obj:
        raise SysbenchError(f"{_where(source, line, None, field='id')}: missing")
    dialogue_id = _text_id(obj["id"], _where(source, line, None), "id")
    loc = _where(source, line, dialogue_id)
    info = TASKS[task]

    system_id = obj.get("system_id", line)
    if isinstance(system_id, bool) or not isinstance(system_id, int) or system_id < 1:
        raise SysbenchError(f"{loc}, field 'system_id': should be a positive integer, found {system_id!r}")
    if system_message is None:
        system_message = obj.get("system_message", DEFAULT_SYSTEM_MESSAGE)
        if not isinstance(system_message, str):
            raise SysbenchError(f"{loc}, field 'system_message': should be a string")

    conv = obj.get("conv")
    if not isinstance(conv, list) or not conv:
        found = "missing" if conv is None else f"{type(conv).__name__}" if not isinstance(conv, list) else "empty"
        raise SysbenchError(f"{loc}, field 'conv': should be a non-empty list of turns ({found})")
    turns = tuple(_parse_turn(item, position, source, line, dialogue_id, info) for position, item in enumerate(conv, 1))
    if not any(turn.answered for turn in turns):
        raise SysbenchError(f"{loc}, field 'conv': no turn has do_inference true")

    inst_name = obj.get("inst_name")
    inst_args = obj.get("inst_args", {})
    if inst_name is not None and not isinstance(inst_name, str):
        raise SysbenchError(f"{loc}, field 'inst_name': should be a string")
    if inst_args is None:
        inst_args = {}
    if not isinstance(inst_args, dict):
        raise SysbenchError(f"{loc}, field 'inst_args': should be an object")
    if info.scorer == "ifeval":
        if inst_name not in INSTRUCTION_NAMES:
            raise SysbenchError(
                f"{loc}, field 'inst_name': {inst_name!r} is not a known instruction "
                f"(known: {', '.join(INSTRUCTION_NAMES)})"
            )
        problem = check_instruction_args(inst_name, inst_args)
        if problem:
            raise SysbenchError(f"{loc}, field 'inst_args': {problem}")
    n_distracts = obj.get("n_distracts")
    if n_distracts is not None and (
        isinstance(n_distracts, bool) or not isinstance(n_distracts, int) or n_distracts < 0
    ):
        raise SysbenchError(f"{loc}, field 'n_distracts': should be a non-negative integer, found {n_distracts!r}")

    return Session(
        system_id=system_id,
        system_prompt=system_message,
        turns=turns,
        dependent=True,  # every later turn may lean on the earlier ones
        domain=None,
        scene=None,
        benchmark=BENCHMARK,
        task=task,
        mteval=MTEvalDialogue(
            dialogue_id=dialogue_id,
            setting=setting,
            inst_name=inst_name,
            inst_args=dict(inst_args),
            n_distracts=n_distracts,
        ),
    )


def _parse_turn(item: Any, position: int, source: Path | str, line: int, dialogue_id: str, info: TaskInfo) -> Turn:
    loc = _where(source, line, dialogue_id, position)
    if not isinstance(item, dict):
        raise SysbenchError(f"{loc}: is {type(item).__name__}, expected a turn object")
    user = item.get("user")
    if not isinstance(user, str) or not user.strip():
        raise SysbenchError(f"{loc}, field 'user': should be a non-empty string")
    reply = item.get("sys")
    if not isinstance(reply, str):
        raise SysbenchError(f"{loc}, field 'sys': should be a string, found {type(reply).__name__}")
    answered = item.get("do_inference")
    if not isinstance(answered, bool):
        raise SysbenchError(f"{loc}, field 'do_inference': should be true or false, found {answered!r}")
    if "id" not in item:
        raise SysbenchError(f"{loc}, field 'id': missing")
    turn_id = _text_id(item["id"], loc, "id")
    inst = item.get("inst")
    if inst is not None and not isinstance(inst, str):
        raise SysbenchError(f"{loc}, field 'inst': should be a string")
    if answered and info.scorer == "cls" and not reply.strip():
        raise SysbenchError(f"{loc}, field 'sys': a classification turn needs its gold label")
    if answered and info.scorer == "judge" and info.category != "follow-up" and not (inst and inst.strip()):
        raise SysbenchError(f"{loc}, field 'inst': the judge needs the turn's instruction")
    # An answered turn with an empty ``sys`` has no reference; a context turn's ``sys`` is history as given.
    reference: str | None = reply if (reply.strip() or not answered) else None
    return Turn(
        index=position,
        user=user,
        reference=reference,
        alignment=NO_ALIGNMENT,
        constraints=(),
        answered=answered,
        mteval=MTEvalTurn(turn_id=turn_id, inst=inst),
    )


def dialogue_to_json(session: Session) -> dict[str, Any]:
    """A session in MT-Eval's schema plus ``system_id``, ``system_message``, ``task`` and ``setting``.

    ``parse_dialogues`` reads it back to an equal session, whatever the file name.
    """
    if session.mteval is None:
        raise SysbenchError(f"session {session.system_id}: not an MT-Eval dialogue")
    info = session.mteval
    out: dict[str, Any] = {
        "id": info.dialogue_id,
        "conv": [
            {
                "user": turn.user,
                "sys": turn.reference if turn.reference is not None else "",
                "id": turn.mteval.turn_id if turn.mteval else str(turn.index),
                "do_inference": turn.answered,
                **({"inst": turn.mteval.inst} if turn.mteval and turn.mteval.inst is not None else {}),
            }
            for turn in session.turns
        ],
    }
    if info.inst_name is not None:
        out["inst_name"] = info.inst_name
        out["inst_args"] = dict(info.inst_args)
    if info.n_distracts is not None:
        out["n_distracts"] = info.n_distracts
    out.update(
        system_id=session.system_id, system_message=session.system_prompt, task=session.task, setting=info.setting
    )
    return out


# ------------------------------------------------------------------ statistics


def answered_turns(session: Session) -> list[Turn]:
    return [turn for turn in session.turns if turn.answered]


def answered_ordinal(session: Session, turn_index: int) -> int:
    """1-based position of answered turn ``turn_index`` among the session's answered turns."""
    turn = session.turn(turn_index)
    if not turn.answered:
        raise SysbenchError(f"session {session.system_id}, turn {turn_index}: a context turn, never answered")
    return sum(t.answered for t in session.turns[:turn_index])


def mteval_stats(sessions: Sequence[Session]) -> dict[str, Any]:
    """Dialogues (``n_sessions``) and answered turns (``n_turns``), overall and per task."""
    by_task: dict[str, list[Session]] = {}
    for session in sessions:
        by_task.setdefault(session.task or "unknown", []).append(session)

    def block(group: Sequence[Session]) -> dict[str, Any]:
        answered = [len(answered_turns(s)) for s in group]
        all_turns = sum(len(s.turns) for s in group)
        return {
            "n_sessions": len(group),
            "n_turns": sum(answered),
            "n_context_turns": all_turns - sum(answered),
            "n_conversation_turns": all_turns,
            "answered_per_dialogue": {"min": min(answered, default=0), "max": max(answered, default=0)},
            "n_missing_references": sum(t.reference is None for s in group for t in s.turns),
        }

    tasks = {}
    for name, group in by_task.items():
        info = TASKS.get(name)
        tasks[name] = {
            **block(group),
            "setting": sorted({s.mteval.setting for s in group if s.mteval}),
            "category": info.category if info else None,
            "scorer": info.scorer if info else None,
        }
        names = Counter(s.mteval.inst_name for s in group if s.mteval and s.mteval.inst_name)
        if names:
            tasks[name]["inst_names"] = dict(sorted(names.items()))
        distracts = Counter(s.mteval.n_distracts for s in group if s.mteval and s.mteval.n_distracts is not None)
        if distracts:
            tasks[name]["n_distracts"] = {str(k): v for k, v in sorted(distracts.items())}
    return {
        "benchmark": BENCHMARK,
        **block(sessions),
        "system_messages": sorted({s.system_prompt for s in sessions}),
        "tasks": tasks,
    }


def format_mteval_stats(stats: Mapping[str, Any], path: Path | str, sha256: str) -> str:
    lines = [
        f"file            {path}",
        f"sha256          {sha256}",
        "benchmark       MT-Eval",
        f"dialogues       {stats['n_sessions']}",
        f"answered turns  {stats['n_turns']}  (context turns {stats['n_context_turns']}, "
        f"{stats['n_conversation_turns']} in all)",
        f"missing refs    {stats['n_missing_references']} answered turns without a reference reply",
        "system message  " + " | ".join(repr(m) for m in stats["system_messages"]),
    ]
    for name, task in stats["tasks"].items():
        lines.append(
            f"task {name:<24} {'/'.join(task['setting'])}: {task['n_sessions']} dialogues, {task['n_turns']} answered "
            f"turns ({task['answered_per_dialogue']['min']}-{task['answered_per_dialogue']['max']} per dialogue), "
            f"scored by {task['scorer']}"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------ download
