"""How the explorer shows MT-Eval: each answered turn's 0-10 score and who gave it, scores per task per run."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sysbench_gpu.benchmarks.explorer import ExploreLayout, TurnView
from sysbench_gpu.benchmarks.mteval.judge_prompt import turn_constraints
from sysbench_gpu.benchmarks.mteval.rules import INSTRUCTIONS, MAX_SCORE
from sysbench_gpu.benchmarks.mteval.tasks import TASKS
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.records import JudgmentRecord
from sysbench_gpu.core.sessions import Session

FACETS = (
    {"key": "task", "label": "Task", "filter": True},
    {"key": "category", "label": "Category", "filter": True},
    {"key": "setting", "label": "Setting", "filter": True},
    {"key": "scorer", "label": "Scored by", "filter": True},
    {"key": "dialogue", "label": "Dialogue id", "hint": "the dialogue's id in the task file"},
)

CAPTION = (
    "Scores 0-10 (rule-scored turns: 0 or 10), means over answered turns; brackets: 95% bootstrap confidence "
    "interval over dialogues (resampled within each task). Overall is the mean of the category means. Under a "
    "task: its mean score at each answered turn."
)


def _context(session: Session, turn: int) -> tuple[tuple[str, str], ...]:
    """What a turn is judged against (instruction, gold label), or the reply a context turn gives the history."""
    this = session.turn(turn)
    if not this.answered:
        return (("Context turn", "not answered: this reply is given in the history\n\n" + (this.reference or "")),)
    info = TASKS.get(session.task or "")
    if info is None:
        return ()
    if info.scorer == "cls" and this.reference:
        return (("Gold label", this.reference),)
    dialogue = session.mteval
    if info.scorer == "ifeval" and dialogue is not None and dialogue.inst_name:
        rule = INSTRUCTIONS.get(dialogue.inst_name)
        args = json.dumps(dict(dialogue.inst_args), ensure_ascii=False)
        return (("Instruction of every answered turn", f"{rule.describe if rule else dialogue.inst_name} {args}"),)
    if info.scorer == "judge" and this.mteval is not None and this.mteval.inst:
        try:
            constraints = turn_constraints(session, turn)
        except SysbenchError:
            return ()
        return (("Judged against", "\n".join(constraints)),)
    return ()


def turn_view(session: Session, turn: int, judgment: JudgmentRecord | None) -> TurnView:
    """An answered turn's score (1-10 from the judge, 0 or 10 from a rule); context turns are never scored."""
    context = _context(session, turn)
    if judgment is None or judgment.score is None or judgment.parse_status in ("skipped", "unparsed"):
        return TurnView(judged=False, scale=MAX_SCORE, context=context)
    rule = judgment.extra.get("rule") if isinstance(judgment.extra, dict) else None
    by_rule = judgment.scorer not in (None, "judge")
    scorer = (
        f"rule {judgment.scorer}" + (f" ({rule})" if rule and rule != judgment.scorer else "") if by_rule else "judge"
    )
    return TurnView(
        judged=True,
        score=float(judgment.score),
        scale=MAX_SCORE,
        note=judgment.reasoning,
        note_title="What the rule checked" if by_rule else "Judge's rationale",
        scorer=scorer,
        context=context,
    )


def session_facets(session: Session) -> dict[str, Any]:
    info = TASKS.get(session.task or "")
    dialogue = session.mteval
    return {
        "task": session.task,
        "category": info.category if info else None,
        "setting": dialogue.setting if dialogue else None,
        "scorer": info.scorer if info else None,
        "dialogue": dialogue.dialogue_id if dialogue else None,
    }


def _by_turn(values: Any) -> str | None:
    """``by turn: 10 · 6.7 · –``: the mean score at each answered turn, one decimal."""
    if not values:
        return None
    return "by turn: " + " · ".join("–" if v is None else f"{v:.1f}".removesuffix(".0") for v in values)


def explore_layout(metrics: Mapping[str, Any] | None) -> ExploreLayout:
    m = metrics or {}
    cells: list[dict[str, Any]] = [
        {"label": "Dialogues", "value": m.get("n_sessions"), "kind": "count"},
        {"label": "Answered turns", "value": m.get("n_turns"), "kind": "count"},
        {"label": "Overall", "value": m.get("overall"), "kind": "score", "ci": m.get("overall_ci95")},
    ]
    categories = m.get("categories") or {}
    tasks = m.get("tasks") or {}
    for name, block in categories.items():
        members = [task for task, entry in tasks.items() if entry.get("category") == name]
        if len(members) == 1:
            continue  # the category is its one task here: shown with the tasks
        cells.append(
            {
                "label": f"{name} (category)",
                "value": block.get("score"),
                "kind": "score",
                "ci": block.get("ci95"),
                "detail": _by_turn(block.get("by_turn")),
            }
        )
    for name, block in tasks.items():
        cells.append(
            {
                "label": name,
                "value": block.get("score"),
                "kind": "score",
                "ci": block.get("ci95"),
                "detail": _by_turn(block.get("by_turn")),
            }
        )
    # Each task's file numbers its dialogues from 1: the task keeps dialogue 1 of two tasks apart.
    return ExploreLayout(
        unit="dialogue",
        outcome="score",
        scale=MAX_SCORE,
        facets=FACETS,
        cells=tuple(cells),
        caption=CAPTION,
        scope="task",
    )
