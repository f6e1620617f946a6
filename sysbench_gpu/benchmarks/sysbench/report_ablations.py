"""SysBench history ablations in the report: which kind each run is, per-turn ISR side by side, GT gains by group.

A run's kind comes from its manifest: ``stages.generate`` (``history``: model, reference or
single-turn; ``distractor_turns``: K > 0 for unrelated exchanges in front) or, for a run
imported from upstream's workbooks, ``stages.import.history`` (model, or reference for the
ground-truth-history workbooks). Older manifests record neither: own history, no distractors.

The ablation table and figure are drawn when a report shows single-turn or distractor runs,
or runs of more than one kind for one model; the runs of a ``--gt-pair`` then join their
model's panel. A report of ordinary runs with ``--gt-pair`` only is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sysbench_gpu.benchmarks.sysbench.data import GROUP_ORDER
from sysbench_gpu.benchmarks.sysbench.report_runs import N_TURNS, GtPair, RunSummary, as_sequence
from sysbench_gpu.core.tables import Table, _num, pct

HISTORY_NAMES = {"model": "own history", "reference": "ground-truth history", "single-turn": "single-turn"}


@dataclass(frozen=True)
class RunKind:
    """How a SysBench run's model saw earlier turns."""

    history: str = "model"  # model | reference | single-turn
    distractor_turns: int = 0
    imported: bool = False

    @property
    def name(self) -> str:
        base = HISTORY_NAMES.get(self.history, self.history)
        if not self.distractor_turns:
            return base
        plural = "s" if self.distractor_turns != 1 else ""
        extra = "" if self.history == "model" else f", {base}"
        return f"{self.distractor_turns} distractor turn{plural}{extra}"

    @property
    def style(self) -> str:
        """The figure's style key (figures.KIND_STYLES)."""
        return "distractor" if self.distractor_turns else self.history

    @property
    def order(self) -> tuple[int, int, str]:
        rank = {"model": 0, "reference": 1, "single-turn": 2}.get(self.history, 3)
        return (1 if self.distractor_turns else 0, self.distractor_turns * 10 + rank, self.history)

    @property
    def is_ablation(self) -> bool:
        """Single-turn and distractor runs: ablations that only this figure shows."""
        return self.history == "single-turn" or self.distractor_turns > 0


def run_kind(manifest: Mapping[str, Any]) -> RunKind:
    stages = manifest.get("stages") if isinstance(manifest.get("stages"), Mapping) else {}
    generate, imported = stages.get("generate"), stages.get("import")
    if isinstance(generate, Mapping) and generate:
        turns = generate.get("distractor_turns")
        return RunKind(
            history=str(generate.get("history") or "model"),
            distractor_turns=turns if isinstance(turns, int) and not isinstance(turns, bool) and turns > 0 else 0,
        )
    if isinstance(imported, Mapping) and imported:
        return RunKind(history=str(imported.get("history") or "model"), imported=True)
    return RunKind()


@dataclass(frozen=True)
class ModelAblation:
    """The runs of one model, one per kind, in the figure's order."""

    model: str
    members: tuple[tuple[RunKind, RunSummary], ...]


def _model_of(run: RunSummary) -> str:
    return run.model or run.label


def ablation_groups(runs: Sequence[RunSummary], pairs: Sequence[GtPair] = ()) -> tuple[list[ModelAblation], list[str]]:
    """Per model, its runs by kind (when the report shows an ablation); and warnings about repeated kinds.

    Returns no groups when no listed run is single-turn or distractor and no model has listed
    runs of two kinds: then the report stays as it always was.
    """
    kinds_of: dict[str, set[RunKind]] = {}
    for run in runs:
        kinds_of.setdefault(_model_of(run), set()).add(run_kind(run.manifest))
    wanted = any(run_kind(run.manifest).is_ablation for run in runs) or any(len(k) > 1 for k in kinds_of.values())
    if not wanted:
        return [], []
    members: dict[str, dict[RunKind, RunSummary]] = {}
    warnings: list[str] = []
    seen: set[Any] = set()
    for run in [*runs, *(r for pair in pairs for r in (pair.base, pair.gt))]:
        key = run.path.resolve()
        if key in seen:
            continue
        seen.add(key)
        kind = run_kind(run.manifest)
        by_kind = members.setdefault(_model_of(run), {})
        if kind in by_kind:
            warnings.append(
                f"history ablation of {_model_of(run)}: {run.label} and {by_kind[kind].label} are both "
                f"{kind.name} runs; the figure shows {by_kind[kind].label}"
            )
            continue
        by_kind[kind] = run
    groups = [
        ModelAblation(model, tuple(sorted(by_kind.items(), key=lambda item: item[0].order)))
        for model, by_kind in members.items()
        if len(by_kind) > 1 or any(kind.is_ablation for kind in by_kind)
    ]
    return groups, warnings


def ablation_panels(groups: Sequence[ModelAblation]) -> list[tuple[str, list[tuple[str, str, list[float | None]]]]]:
    """What figures.plot_history_ablation_isr draws: per model, ISR per turn (%) of each kind."""
    return [
        (
            group.model,
            [
                (kind.name, kind.style, [pct(v) for v in as_sequence(run.metrics.get("isr_by_round"))])
                for kind, run in group.members
            ],
        )
        for group in groups
    ]


def table_history_ablation(groups: Sequence[ModelAblation]) -> Table:
    rows = []
    for group in groups:
        for kind, run in group.members:
            per_turn = [pct(v) for v in as_sequence(run.metrics.get("isr_by_round"))]
            rows.append(
                (f"{group.model}: {kind.name}", per_turn + [pct(run.metrics.get("isr")), pct(run.metrics.get("ssr"))])
            )
    return Table(
        name="table_history_ablation",
        title="History ablations: ISR per turn",
        caption="ISR (%) per turn, overall ISR and SSR of each model's runs with its own history, ground-truth "
        "history, single-turn (no earlier turns) and unrelated distractor turns in front.",
        groups=[("ISR per turn", [f"T{n}" for n in range(1, N_TURNS + 1)]), ("Overall", ["ISR", "SSR"])],
        rows=rows,
        bold_best=False,
        first_header="Model: history",
        markdown_headers=[f"T{n}" for n in range(1, N_TURNS + 1)] + ["ISR", "SSR"],
    )


def gains_by_group(pair: GtPair) -> dict[str, list[float | None]]:
    """ISR gain per turn (points, GT minus base) within dependent and within parallel sessions."""
    gt = pair.gt.metrics.get("isr_by_round_by_group") or {}
    base = pair.base.metrics.get("isr_by_round_by_group") or {}
    out: dict[str, list[float | None]] = {}
    for group in GROUP_ORDER:
        values = []
        for g, b in zip(as_sequence(gt.get(group)), as_sequence(base.get(group)), strict=False):
            g, b = _num(g), _num(b)
            values.append(None if g is None or b is None else 100.0 * (g - b))
        out[group] = values
    return out
