"""MT-Eval report rows: each run scored with its condition (multi, gold history, single, ablation), the runs of one
model side by side, and the leaderboard, task and turn tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.mteval.metrics import (
    TurnScore,
    compare_mteval,
    mteval_metrics,
)
from sysbench_gpu.benchmarks.mteval.run_metrics import run_kind, scored_turns
from sysbench_gpu.benchmarks.mteval.tables import (
    LEADERBOARD_COLUMNS,
    PUBLISHED_LEADERBOARD,
    leaderboard_row,
)
from sysbench_gpu.benchmarks.mteval.tasks import CATEGORIES, TASKS
from sysbench_gpu.benchmarks.runs import load_run as load_run_dir
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.tables import (
    Table,
)

CONDITIONS = ("multi", "gold history", "single", "ablation")


_TITLES = {
    "average": "Average",
    "recollection": "Recollection",
    "expansion": "Expansion",
    "refinement": "Refinement",
    "follow-up": "Follow-up",
}


@dataclass(frozen=True)
class MtevalRun:
    """One MT-Eval run directory as the report sees it."""

    path: Path
    label: str
    model: str
    history: str
    settings: tuple[str, ...]
    turns: tuple[TurnScore, ...]
    metrics: dict[str, Any]
    dialogues: Mapping[tuple[str, int], tuple[str | None, tuple[str, ...]]]  # (task, id) -> (dialogue id, user turns)

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(sorted({t.task for t in self.turns}))

    @property
    def condition(self) -> str:
        if "ablation" in self.settings:
            return "ablation"
        if "single" in self.settings:
            return "single"
        return "gold history" if self.history == "reference" else "multi"


@dataclass
class MtevalRow:
    """The runs of one model under one condition, scored together."""

    model: str
    condition: str
    runs: list[MtevalRun] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.model if self.condition == "multi" else f"{self.model} ({self.condition})"

    @property
    def turns(self) -> list[TurnScore]:
        return [t for run in self.runs for t in run.turns]

    def shared_turns(self, other: MtevalRow) -> tuple[list[TurnScore], list[TurnScore], list[str]]:
        """Both rows' turns of the tasks they share, and those tasks."""
        shared = sorted(set(self.tasks) & set(other.tasks))
        return ([t for t in self.turns if t.task in shared], [t for t in other.turns if t.task in shared], shared)

    @property
    def tasks(self) -> list[str]:
        return sorted({task for run in self.runs for task in run.tasks})

    def pairs_with(self, other: MtevalRow, tasks: Sequence[str]) -> bool:
        """Same dialogues and the same scored turns on ``tasks``: the rows can share bootstrap resamples."""

        def dialogues(row: MtevalRow) -> dict:
            return {k: v for run in row.runs for k, v in run.dialogues.items() if k[0] in tasks}

        def keys(row: MtevalRow) -> set:
            return {(t.task, t.system_id, t.turn) for t in row.turns if t.task in tasks}

        return dialogues(self) == dialogues(other) and keys(self) == keys(other)


def load_mteval_run(
    path: str | Path,
    label: str | None = None,
    *,
    allow_partial: bool = False,
    exclude_unparsed: bool = False,
    exclude_skipped: bool = False,
    resamples: int = 1000,
    seed: int = 0,
) -> MtevalRun:
    loaded = load_run_dir(path)
    if loaded.benchmark != "mteval":
        raise SysbenchError(f"{loaded.path}: a SysBench run; report MT-Eval and SysBench runs separately")
    try:
        turns, bookkeeping = scored_turns(
            loaded, allow_partial=allow_partial, exclude_unparsed=exclude_unparsed, exclude_skipped=exclude_skipped
        )
    except SysbenchError as error:
        raise SysbenchError(f"{loaded.path}: {error}") from None
    metrics = {
        **mteval_metrics(turns, resamples=resamples, seed=seed, label=label or loaded.label, model=loaded.model),
        **bookkeeping,
    }
    dialogues = {
        (s.task or "", s.system_id): (s.mteval.dialogue_id if s.mteval else None, tuple(t.user for t in s.turns))
        for s in loaded.sessions
    }
    return MtevalRun(
        path=Path(path),
        label=label or loaded.label,
        model=loaded.model or loaded.label,
        history=run_kind(loaded.manifest)["history"],
        settings=tuple(sorted({s.mteval.setting for s in loaded.sessions if s.mteval is not None})),
        turns=tuple(turns),
        metrics=metrics,
        dialogues=dialogues,
    )


def build_rows(runs: Sequence[MtevalRun], *, resamples: int = 1000, seed: int = 0) -> list[MtevalRow]:
    """Rows by (model, condition) in the order models first appear; one run per task in a row."""
    rows: dict[tuple[str, str], MtevalRow] = {}
    for run in runs:
        row = rows.setdefault((run.model, run.condition), MtevalRow(run.model, run.condition))
        for other in row.runs:
            shared = set(other.tasks) & set(run.tasks)
            if shared:
                raise SysbenchError(
                    f"{run.path} and {other.path} both score task {', '.join(sorted(shared))} for {row.label}; "
                    "a report row takes one run per task"
                )
        row.runs.append(run)
    models = list(dict.fromkeys(run.model for run in runs))
    ordered = sorted(rows.values(), key=lambda r: (models.index(r.model), CONDITIONS.index(r.condition)))
    for row in ordered:
        row.metrics = mteval_metrics(row.turns, resamples=resamples, seed=seed, label=row.label, model=row.model)
    return ordered


def side_by_side(rows: Sequence[MtevalRow], *, resamples: int = 1000, seed: int = 0) -> list[dict[str, Any]]:
    """Per model with more than one condition: each condition against the first (multi when there is one)."""
    out = []
    for model in dict.fromkeys(row.model for row in rows):
        mine = [row for row in rows if row.model == model]
        if len(mine) < 2:
            continue
        base, others = mine[0], mine[1:]
        comparisons = []
        for other in others:
            turns_a, turns_b, shared = base.shared_turns(other)
            if not shared:
                continue
            result = compare_mteval(
                turns_a, turns_b, resamples=resamples, seed=seed, paired=base.pairs_with(other, shared)
            )
            if set(base.tasks) != set(other.tasks):
                # A score over the shared tasks only is not the row's own score: leave out the average, and
                # the categories whose tasks the two rows do not share alike (recollection pools two tasks).
                result["metrics"].pop("overall", None)
                for category in {TASKS[t].category for t in base.tasks + other.tasks}:
                    if _tasks_of(base, category) != _tasks_of(other, category):
                        result["metrics"].pop(f"category.{category}", None)
            comparisons.append(
                {
                    "label": f"{other.condition} - {base.condition}",
                    "a": base.label,
                    "b": other.label,
                    "tasks": shared,
                    **result,
                }
            )
        out.append(
            {"model": model, "columns": [(row.condition, row.metrics) for row in mine], "comparisons": comparisons}
        )
    return out


def _tasks_of(row: MtevalRow, category: str) -> list[str]:
    return [t for t in row.tasks if TASKS[t].category == category]


def table_leaderboard(rows: Sequence[MtevalRow], published: bool = True) -> Table:
    table_rows, notes = [], []
    for row in rows:
        cells = leaderboard_row(row.metrics)
        table_rows.append((row.label, [cells[c][0] for c in LEADERBOARD_COLUMNS]))
        notes.append(
            [f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "" for _, ci in (cells[c] for c in LEADERBOARD_COLUMNS)]
        )
    if published:
        for label, values in PUBLISHED_LEADERBOARD.items():
            table_rows.append((label, [values[c] for c in LEADERBOARD_COLUMNS]))
            notes.append([""] * len(LEADERBOARD_COLUMNS))
    return Table(
        name="mteval_leaderboard",
        title="MT-Eval leaderboard layout",
        caption="Scores 0-10: the average of the four category means, then each category (recollection pools "
        "cls and global-inst turns); published rows from the MT-Eval paper for context.",
        groups=[("", [_TITLES[c] for c in LEADERBOARD_COLUMNS])],
        rows=table_rows,
        notes=notes,
        bold_best=False,
        decimals=2,
    )


def table_tasks(rows: Sequence[MtevalRow]) -> Table:
    tasks = [t for t in TASKS if any(t in row.metrics["tasks"] for row in rows)]
    return Table(
        name="mteval_tasks",
        title="MT-Eval scores per task",
        caption="Mean score (0-10) over each task's answered turns.",
        groups=[("", tasks)],
        rows=[(row.label, [(row.metrics["tasks"].get(t) or {}).get("score") for t in tasks]) for row in rows],
        bold_best=False,
        decimals=2,
    )


def tables_by_turn(rows: Sequence[MtevalRow]) -> list[Table]:
    tables = []
    categories = [c for c in CATEGORIES if any(c in row.metrics["categories"] for row in rows)]
    categories += sorted({c for row in rows for c in row.metrics["categories"]} - set(categories))
    for category in categories:
        width = max(len((row.metrics["categories"].get(category) or {}).get("by_turn") or []) for row in rows)
        body = []
        for row in rows:
            values = list((row.metrics["categories"].get(category) or {}).get("by_turn") or [])
            if values:
                body.append((row.label, values + [None] * (width - len(values))))
        tables.append(
            Table(
                name=f"mteval_by_turn_{category}",
                title=f"MT-Eval {category}: score by answered turn",
                caption=f"Mean score (0-10) of {category} at each answered-turn index (context turns not counted).",
                groups=[("", [str(k) for k in range(1, width + 1)])],
                rows=body,
                bold_best=False,
                decimals=2,
                first_header="Model",
            )
        )
    return tables
