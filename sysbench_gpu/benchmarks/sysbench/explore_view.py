"""How the explorer shows SysBench: verdicts per constraint, turns that pass or fail, CSR / ISR / SSR per run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sysbench_gpu.benchmarks.explorer import ExploreLayout, TurnView
from sysbench_gpu.benchmarks.sysbench.data import TYPE_ORDER
from sysbench_gpu.core.records import JudgmentRecord
from sysbench_gpu.core.sessions import Session
from sysbench_gpu.core.verdicts import NO

# Raw verdict strings that say no more than their value; others ("不适用", "部分是") are kept for the page.
_PLAIN_RAW = {"yes": ("是", "yes"), "no": ("否", "no")}

FACETS = (
    {"key": "domain", "label": "Domain", "filter": True},
    {"key": "scene", "label": "Scene"},
    {"key": "group", "label": "Turns are", "filter": True},
    {"key": "alignment", "label": "Alignment", "mono": True, "hint": "A aligned, M misaligned, per turn"},
    {"key": "misaligned", "label": "Alignment", "column": False, "filter": True},
)

CAPTION = (
    "Percentages; brackets: 95% bootstrap confidence interval over sessions. CSR is pooled over constraints; "
    "a turn passes when none of its verdicts is no; SSR is the mean share of sessions whose first n turns all pass."
)


def verdict_items(judgment: JudgmentRecord, session: Session, turn: int) -> list[dict[str, Any]]:
    """Verdicts in checklist order, then any lines the judge added outside the checklist.

    ``raw`` is kept when it says more than the value, ``type`` when it is not the checklist's.
    """
    types = {str(c.id): c.type for c in session.turn(turn).constraints}
    order = list(types) + [key for key in judgment.verdicts if key not in types]
    rows: list[dict[str, Any]] = []
    for key in order:
        verdict = judgment.verdicts.get(key)
        if verdict is None:
            rows.append({"id": key, "value": "missing"})
            continue
        row: dict[str, Any] = {"id": key, "value": verdict.value}
        if verdict.raw not in _PLAIN_RAW.get(verdict.value, ()):
            row["raw"] = verdict.raw
        if verdict.type != types.get(key):
            row["type"] = verdict.type
        rows.append(row)
    return rows


def turn_view(session: Session, turn: int, judgment: JudgmentRecord | None) -> TurnView:
    """A turn passes when no verdict is no; unparsed and skipped judgments are not judged."""
    if judgment is None:
        return TurnView(judged=False)
    passed = judgment.passed
    failed = sorted({v.type for v in judgment.verdicts.values() if v.value == NO})
    return TurnView(
        judged=passed is not None,
        passed=passed,
        items=tuple(verdict_items(judgment, session, turn)),
        note=judgment.reasoning,
        failed_kinds=tuple(failed),
    )


def session_facets(session: Session) -> dict[str, Any]:
    alignment = "".join("M" if t.alignment == "misaligned" else "A" for t in session.turns)
    return {
        "domain": session.domain,
        "scene": session.scene,
        "group": session.group,
        "alignment": alignment,
        "misaligned": "has misaligned turns" if "M" in alignment else "all aligned",
    }


def explore_layout(metrics: Mapping[str, Any] | None) -> ExploreLayout:
    m = metrics or {}
    ci = m.get("ci95") or {}
    align = m.get("isr_by_alignment") or {}

    def rate(label: str, value: Any, interval: Any = None) -> dict[str, Any]:
        return {"label": label, "value": value, "kind": "percent", "ci": interval}

    cells = (
        {"label": "Sessions", "value": m.get("n_sessions"), "kind": "count"},
        {"label": "Turns", "value": m.get("n_turns"), "kind": "count"},
        {"label": "Constraints", "value": m.get("n_constraints"), "kind": "count"},
        rate("CSR", m.get("csr"), ci.get("csr")),
        rate("ISR", m.get("isr"), ci.get("isr")),
        rate("SSR", m.get("ssr"), ci.get("ssr")),
        rate("CSR (Eq. 1)", m.get("csr_macro")),
        rate("ISR aligned", align.get("aligned")),
        rate("ISR misaligned", align.get("misaligned")),
    )
    return ExploreLayout(
        unit="session", outcome="checklist", kinds=TYPE_ORDER, facets=FACETS, cells=cells, caption=CAPTION
    )
