"""The explorer's data: runs with their metrics, and one record per session (see docs/explore.md).

Everything here is plain JSON-ready dicts built from run directories; nothing imports
torch. ``explore.py`` writes them as ``<script>`` data files, ``explore_attention.py``
adds the token-level attention.

A run that ``metrics`` refuses as it stands (turns not judged, unparsed or skipped)
is scored again with the missing turns left out and shown as *partial*, with the
reason, rather than stopping the build.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from sysbench_gpu.data import Session
from sysbench_gpu.errors import SysbenchError
from sysbench_gpu.runstore import GenerationRecord, JudgmentRecord, RunDir
from sysbench_gpu.verdicts import NO

Key = tuple[int, int]

# Headline metrics shown per run, and the fields copied from the metrics dict.
RUN_METRIC_FIELDS = (
    "n_sessions", "n_turns", "n_constraints", "csr", "csr_macro", "isr", "ssr", "ci95",
    "isr_by_alignment", "csr_by_type", "verdict_counts", "n_missing_turns", "n_unparsed_turns",
    "n_skipped_turns", "partial", "bootstrap",
)


@dataclass(frozen=True)
class RunView:
    """One run directory as the explorer shows it."""

    path: Path
    label: str
    model: str | None
    judge_model: str | None
    status: str  # complete | partial | unscored
    note: str | None  # why a run is partial or unscored
    metrics: dict[str, Any] | None
    sessions: dict[int, Session]
    generations: dict[Key, GenerationRecord]
    judgments: dict[Key, JudgmentRecord]


def score_run(path: Path, resamples: int, seed: int) -> tuple[str, str | None, dict[str, Any] | None]:
    """(status, note, metrics): strict first; a refused run is scored leniently and called partial."""
    from sysbench_gpu.metrics import run_metrics  # a sibling stage module

    try:
        return "complete", None, run_metrics(path, resamples=resamples, seed=seed)
    except SysbenchError as strict:
        reason = str(strict)
    try:
        lenient = run_metrics(
            path, allow_partial=True, exclude_unparsed=True, exclude_skipped=True, resamples=resamples, seed=seed
        )
    except SysbenchError as error:
        return "unscored", str(error), None
    return "partial", reason, lenient


def load_run_view(path: str | Path, resamples: int = 1000, seed: int = 0) -> RunView:
    run = RunDir(path).require()
    sessions = {s.system_id: s for s in run.load_sessions()}
    generations = run.generations.read()
    judgments = run.judgments.read()
    status, note, metrics = score_run(run.path, resamples, seed)
    judges = Counter(j.judge_model for j in judgments.values() if j.judge_model)
    label = metrics["label"] if metrics else run.path.resolve().name
    model = metrics["model"] if metrics else None
    if model is None:
        models = Counter(g.model for g in generations.values() if g.model)
        model = models.most_common(1)[0][0] if models else None
    return RunView(
        path=run.path,
        label=str(label),
        model=model,
        judge_model=judges.most_common(1)[0][0] if judges else None,
        status=status,
        note=note,
        metrics=metrics,
        sessions=sessions,
        generations=generations,
        judgments=judgments,
    )


def run_summary(view: RunView) -> dict[str, Any]:
    """The index's row for one run."""
    metrics = view.metrics or {}
    return {
        "label": view.label,
        "model": view.model,
        "judge_model": view.judge_model,
        "path": str(view.path.resolve()),
        "status": view.status,
        "note": view.note,
        "metrics": {key: metrics.get(key) for key in RUN_METRIC_FIELDS} if view.metrics else None,
    }


# ---------------------------------------------------------------- sessions


def session_order(views: Sequence[RunView]) -> list[int]:
    return sorted({system_id for view in views for system_id in view.sessions})


def canonical_session(views: Sequence[RunView], system_id: int) -> Session:
    """The session as the first run that has it stores it."""
    return next(view.sessions[system_id] for view in views if system_id in view.sessions)


def same_session(a: Session, b: Session) -> bool:
    """Whether two runs scored the same text and checklists for a session."""
    if a.system_prompt != b.system_prompt or len(a.turns) != len(b.turns):
        return False
    return all(
        ta.user == tb.user and ta.alignment == tb.alignment and ta.constraints == tb.constraints
        for ta, tb in zip(a.turns, b.turns)
    )


def turn_passed(judgment: JudgmentRecord | None) -> bool | None:
    """True/False when the turn has usable verdicts; None when it is not judged or unparsed."""
    return None if judgment is None else judgment.passed


def run_session_summary(view: RunView, session: Session) -> dict[str, Any]:
    """How one run did on one session: the index's per-run columns."""
    passed = [turn_passed(view.judgments.get((session.system_id, t.index))) for t in session.turns]
    generated = sum(1 for t in session.turns if (session.system_id, t.index) in view.generations)
    failed_types: set[str] = set()
    for turn in session.turns:
        judgment = view.judgments.get((session.system_id, turn.index))
        if judgment is not None:
            failed_types.update(v.type for v in judgment.verdicts.values() if v.value == NO)
    first_fail = next((t.index for t, p in zip(session.turns, passed) if p is False), None)
    leading = 0
    for value in passed:
        if value is not True:
            break
        leading += 1
    return {
        "judged": sum(1 for p in passed if p is not None),
        "passed": sum(1 for p in passed if p),
        "generated": generated,
        "first_fail": first_fail,
        "leading": leading,
        "failed_types": sorted(failed_types),
    }


def session_index_row(views: Sequence[RunView], system_id: int) -> dict[str, Any]:
    """The index's row for one session: its shape, and one summary per run (None where absent)."""
    session = canonical_session(views, system_id)
    alignments = [t.alignment for t in session.turns]
    return {
        "id": system_id,
        "domain": session.domain,
        "scene": session.scene,
        "group": session.group,
        "alignment": "".join("M" if a == "misaligned" else "A" for a in alignments),
        "n_turns": len(session.turns),
        "runs": [
            run_session_summary(view, view.sessions[system_id]) if system_id in view.sessions else None
            for view in views
        ],
    }


# Raw verdict strings that say no more than their value; others ("不适用", "部分是") are kept for the page.
_PLAIN_RAW = {"yes": ("是", "yes"), "no": ("否", "no")}


def _verdicts(judgment: JudgmentRecord, session: Session, turn_index: int) -> list[dict[str, Any]]:
    """Verdicts in checklist order, then any lines the judge added outside the checklist.

    ``raw`` is kept when it says more than the value, ``type`` when it is not the checklist's.
    """
    types = {str(c.id): c.type for c in session.turn(turn_index).constraints}
    order = list(types) + [key for key in judgment.verdicts if key not in types]
    rows = []
    for key in order:
        verdict = judgment.verdicts.get(key)
        if verdict is None:
            rows.append({"id": key, "value": "missing"})
            continue
        row = {"id": key, "value": verdict.value}
        if verdict.raw not in _PLAIN_RAW.get(verdict.value, ()):
            row["raw"] = verdict.raw
        if verdict.type != types.get(key):
            row["type"] = verdict.type
        rows.append(row)
    return rows


def run_turn(view: RunView, session: Session, canonical: Session, turn_index: int) -> dict[str, Any] | None:
    """One run's reply and verdicts for one turn; None when the run does not have the turn.

    Fields that hold nothing (a null finish reason, status ok) are left out: 14 runs of
    500 sessions stay near 40 MB.
    """
    if turn_index > len(session.turns):
        return None
    key = (session.system_id, turn_index)
    generation = view.generations.get(key)
    judgment = view.judgments.get(key)
    entry: dict[str, Any] = {"reply": generation.response if generation else None}
    status = generation.status if generation else "not generated"
    optional = {
        "status": None if status == "ok" else status,
        "finish": generation.finish_reason if generation else None,
        "overflow": generation.overflow if generation else None,
    }
    entry.update({name: value for name, value in optional.items() if value is not None})
    own_user = session.turn(turn_index).user
    if turn_index > len(canonical.turns) or own_user != canonical.turn(turn_index).user:
        entry["user"] = own_user
    if judgment is None:
        entry["judgment"] = None
        return entry
    entry["judgment"] = {
        "parse": judgment.parse_status,
        "passed": judgment.passed,
        "verdicts": _verdicts(judgment, session, turn_index),
        "reasoning": judgment.reasoning,
    }
    if judgment.judge_model != view.judge_model:
        entry["judgment"]["judge"] = judgment.judge_model
    if judgment.parse_status == "unparsed":
        entry["judgment"]["raw_reply"] = judgment.raw_reply
    return entry


def session_detail(views: Sequence[RunView], system_id: int) -> dict[str, Any]:
    """Everything the session page shows except attention: texts, checklists, replies and verdicts per run."""
    session = canonical_session(views, system_id)
    n_turns = max(len(view.sessions[system_id].turns) for view in views if system_id in view.sessions)
    differs = []
    for view in views:
        own = view.sessions.get(system_id)
        differs.append(own is not None and not same_session(own, session))
    turns = []
    for index in range(1, n_turns + 1):
        base = session.turn(index) if index <= len(session.turns) else None
        turns.append(
            {
                "turn": index,
                "user": base.user if base else None,
                "alignment": base.alignment if base else None,
                "constraints": [
                    {"id": c.id, "type": c.type, "content": c.content} for c in (base.constraints if base else ())
                ],
                "runs": [
                    run_turn(view, view.sessions[system_id], session, index) if system_id in view.sessions else None
                    for view in views
                ],
            }
        )
    return {
        "id": system_id,
        "system": session.system_prompt,
        "domain": session.domain,
        "scene": session.scene,
        "group": session.group,
        "runs_with_other_text": [view.label for view, flag in zip(views, differs) if flag],
        "system_by_run": [
            view.sessions[system_id].system_prompt if flag else None for view, flag in zip(views, differs)
        ],
        "turns": turns,
    }


def unique_labels(views: Sequence[RunView]) -> list[RunView]:
    """Runs with distinct labels (``name``, ``name-2``, ...), in the given order."""
    from dataclasses import replace

    from sysbench_gpu.report import unique_labels as distinct

    return [replace(view, label=label) for view, label in zip(views, distinct([v.label for v in views]))]
