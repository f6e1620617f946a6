"""What a benchmark tells the explorer: how a turn shows (:class:`TurnView`) and how its runs and
sessions are laid out (:class:`ExploreLayout`); returned by the explorer methods of
:class:`~sysbench_gpu.benchmarks.base.Benchmark` (and importable from ``benchmarks.base``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TurnView:
    """How the explorer shows one turn of one run: a pass/fail or a score, and what stands behind it.

    ``judged``: the turn has a usable outcome (verdicts that parsed, or a score); a missing,
    unparsed or skipped judgment is not judged. ``items``: a checklist's verdicts in checklist
    order, each ``{"id", "value"}`` (yes, no, other or missing) with ``raw`` (the judge's own
    word, when it says more than the value) and ``type`` (when it is not the checklist's).
    ``context``: labelled texts about the turn itself, shown once beside its user message (what
    the turn is judged against, the reply a context turn gives the history); they do not
    depend on the judgment, so ``turn_view(session, turn, None)`` has them too.
    """

    judged: bool
    passed: bool | None = None  # checklist benchmarks: no item failed
    score: float | None = None  # scored benchmarks: the turn's score
    scale: float | None = None  # the score's maximum
    items: Sequence[Mapping[str, Any]] = field(default_factory=tuple)
    note: str | None = None  # the judge's reasoning or the rule's explanation
    note_title: str | None = None  # what ``note`` is (the page says "Judge's reasoning" when None)
    scorer: str | None = None  # who gave the score, for the page ("judge", "rule cls")
    failed_kinds: Sequence[str] = field(default_factory=tuple)  # kinds of the items that failed
    context: Sequence[tuple[str, str]] = field(default_factory=tuple)  # (label, text) about the turn


@dataclass(frozen=True)
class ExploreLayout:
    """How the explorer lays out a benchmark's runs and sessions (docs/explore.md).

    ``outcome``: ``checklist`` (a turn passes or fails on items of ``kinds``) or ``score``
    (a turn has a score out of ``scale``). ``facets``: the session table's fields, each
    ``{"key", "label"}`` naming a field of :meth:`Benchmark.session_facets`, with ``column``
    (shown as a column; default true), ``filter`` (a choice among its values), ``mono`` and
    ``hint``. ``cells``: one run's headline numbers from ``run_metrics``' result, each
    ``{"label", "value", "kind"}`` (``count``, ``percent`` of a fraction, or ``score``) with
    optional ``ci`` (a pair) and ``detail`` (a short text under the number). ``scope``: the facet
    that, with the benchmark and the ``system_id``, names a session, when ids repeat across a
    benchmark's data files (sessions of two scopes never share a page).
    """

    unit: str = "session"  # what one session is called on the pages ("dialogue")
    outcome: str = "score"
    scale: float | None = None
    kinds: Sequence[str] = field(default_factory=tuple)
    facets: Sequence[Mapping[str, Any]] = field(default_factory=tuple)
    cells: Sequence[Mapping[str, Any]] = field(default_factory=tuple)
    caption: str = ""  # how to read the run table's numbers
    scope: str | None = None  # a field of ``session_facets`` (MT-Eval: the task; each task file numbers from 1)
