"""The explorer's sessions: the index's row per session and the session page's record (see docs/explore.md).

Sessions are keyed by (benchmark, scope, system_id): a run holds a session only when all agree.
How a run did on a turn is its benchmark's :class:`~sysbench_gpu.benchmarks.base.TurnView`:
verdicts per checklist item and pass or fail, or a score; a session's row sums them up
the way its benchmark's layout says (``checklist``: turns passed, first failing turn,
failed kinds; ``score``: mean, lowest and per-turn scores).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sysbench_gpu.benchmarks.explorer import TurnView
from sysbench_gpu.core.sessions import NO_ALIGNMENT, Session
from sysbench_gpu.explore.data import RunView, SessionKey, json_ready, key_text

CHECKLIST = "checklist"  # ExploreLayout.outcome of benchmarks whose turns pass or fail


def session_order(views: Sequence[RunView]) -> list[SessionKey]:
    """Every session of the runs: benchmarks in the order their first run was given, then by scope and system_id."""
    rank: dict[str, int] = {}
    for view in views:
        rank.setdefault(view.benchmark.name, len(rank))
    keys = {key for view in views for key in view.sessions}
    return sorted(keys, key=lambda key: (rank[key[0]], key[1], key[2]))


def canonical(views: Sequence[RunView], key: SessionKey) -> tuple[RunView, Session]:
    """The first run that has the session, and the session as it stores it."""
    return next((view, view.sessions[key]) for view in views if key in view.sessions)


def same_session(a: Session, b: Session) -> bool:
    """Whether two runs scored the same text and checklists for a session."""
    if a.system_prompt != b.system_prompt or len(a.turns) != len(b.turns):
        return False
    return all(
        ta.user == tb.user and ta.alignment == tb.alignment and ta.constraints == tb.constraints
        for ta, tb in zip(a.turns, b.turns, strict=True)
    )


def turn_views(view: RunView, session: Session) -> list[TurnView]:
    """The run's view of every turn of the session (context turns included)."""
    return [
        view.benchmark.turn_view(session, turn.index, view.judgments.get((session.system_id, turn.index)))
        for turn in session.turns
    ]


def run_session_summary(view: RunView, session: Session) -> dict[str, Any]:
    """How one run did on one session: the index's per-run columns."""
    answered = [tv for turn, tv in zip(session.turns, turn_views(view, session), strict=True) if turn.answered]
    numbers = [turn.index for turn in session.turns if turn.answered]
    summary: dict[str, Any] = {
        "judged": sum(1 for tv in answered if tv.judged),
        "generated": sum(1 for turn in session.turns if (session.system_id, turn.index) in view.generations),
    }
    if view.layout.outcome == CHECKLIST:
        passed = [tv.passed if tv.judged else None for tv in answered]
        leading = 0
        for value in passed:
            if value is not True:
                break
            leading += 1
        summary.update(
            passed=sum(1 for p in passed if p),
            first_fail=next((number for number, p in zip(numbers, passed, strict=True) if p is False), None),
            leading=leading,
            failed_types=sorted({kind for tv in answered for kind in tv.failed_kinds}),
        )
        return summary
    scores = [tv.score if tv.judged else None for tv in answered]
    given = [float(s) for s in scores if s is not None]
    summary.update(
        score=round(sum(given) / len(given), 4) if given else None,
        lowest=min(given) if given else None,
        scores=scores,
    )
    return summary


def session_index_row(views: Sequence[RunView], key: SessionKey) -> dict[str, Any]:
    """The index's row for one session: its facets, its shape, and one summary per run (None where absent)."""
    first, session = canonical(views, key)
    facets = json_ready(first.benchmark.session_facets(session))
    return {
        **facets,
        "key": key_text(key),
        "benchmark": key[0],
        "id": key[2],
        "n_turns": len(session.turns),
        "n_answered": sum(1 for turn in session.turns if turn.answered),
        "runs": [run_session_summary(view, view.sessions[key]) if key in view.sessions else None for view in views],
    }


def _judgment_entry(view: RunView, session: Session, turn_index: int) -> dict[str, Any] | None:
    judgment = view.judgments.get((session.system_id, turn_index))
    if judgment is None:
        return None
    tv = view.benchmark.turn_view(session, turn_index, judgment)
    entry: dict[str, Any] = {"parse": judgment.parse_status}
    if tv.items or tv.passed is not None:
        entry.update(passed=tv.passed, verdicts=json_ready(tv.items))
    entry["reasoning"] = tv.note
    optional = {"score": tv.score, "scale": tv.scale, "scorer": tv.scorer, "reasoning_title": tv.note_title}
    entry.update({name: value for name, value in optional.items() if value is not None})
    if judgment.judge_model != view.judge_model:
        entry["judge"] = judgment.judge_model
    if judgment.parse_status == "unparsed":
        entry["raw_reply"] = judgment.raw_reply
    return entry


def run_turn(view: RunView, session: Session, base: Session, turn_index: int) -> dict[str, Any] | None:
    """One run's reply and verdicts or score for one turn; None when the run does not have the turn.

    Fields that hold nothing (a null finish reason, status ok) are left out: 14 runs of
    500 sessions stay near 40 MB.
    """
    if turn_index > len(session.turns):
        return None
    generation = view.generations.get((session.system_id, turn_index))
    entry: dict[str, Any] = {"reply": generation.response if generation else None}
    status = generation.status if generation else "not generated"
    optional = {
        "status": None if status == "ok" else status,
        "finish": generation.finish_reason if generation else None,
        "overflow": generation.overflow if generation else None,
    }
    entry.update({name: value for name, value in optional.items() if value is not None})
    own_user = session.turn(turn_index).user
    if turn_index > len(base.turns) or own_user != base.turn(turn_index).user:
        entry["user"] = own_user
    entry["judgment"] = _judgment_entry(view, session, turn_index)
    return entry


def _turn_record(views: Sequence[RunView], key: SessionKey, first: RunView, base: Session, index: int) -> dict:
    turn = base.turn(index) if index <= len(base.turns) else None
    record: dict[str, Any] = {
        "turn": index,
        "user": turn.user if turn else None,
        "alignment": turn.alignment if turn and turn.alignment != NO_ALIGNMENT else None,
        "constraints": [{"id": c.id, "type": c.type, "content": c.content} for c in (turn.constraints if turn else ())],
    }
    if turn is not None and not turn.answered:
        record["answered"] = False
    context = first.benchmark.turn_view(base, index, None).context if turn else ()
    if context:
        record["context"] = [{"label": label, "text": text} for label, text in context]
    record["runs"] = [
        run_turn(view, view.sessions[key], base, index) if key in view.sessions else None for view in views
    ]
    return record


def session_detail(views: Sequence[RunView], key: SessionKey) -> dict[str, Any]:
    """Everything the session page shows except attention: texts, checklists, replies and verdicts or scores per run."""
    first, session = canonical(views, key)
    n_turns = max(len(view.sessions[key].turns) for view in views if key in view.sessions)
    differs = [key in view.sessions and not same_session(view.sessions[key], session) for view in views]
    return {
        **json_ready(first.benchmark.session_facets(session)),
        "key": key_text(key),
        "benchmark": key[0],
        "id": key[2],
        "system": session.system_prompt,
        "runs_with_other_text": [view.label for view, flag in zip(views, differs, strict=True) if flag],
        "system_by_run": [
            view.sessions[key].system_prompt if flag else None for view, flag in zip(views, differs, strict=True)
        ],
        "turns": [_turn_record(views, key, first, session, index) for index in range(1, n_turns + 1)],
    }
