"""The Benchmark protocol: one class per benchmark, holding everything that differs between benchmarks.

A benchmark is one folder under ``benchmarks/`` holding one :class:`Benchmark` subclass,
registered with ``registry.register_benchmark`` when its module is imported (the built-in
ones are imported by ``benchmarks/__init__.py``, the one place that lists them). A benchmark
owns everything that differs between benchmarks: reading and validating its data, the
conversation of each turn under each history mode it supports, what judging a turn means
and its prompt, scoring, metrics and tables, and how the explorer shows a turn. Shared
stages call these methods and never compare a benchmark's name; runs of different
benchmarks are refused together by ``registry.one_benchmark``, and nowhere else.

A data file's benchmark is chosen by ``--benchmark NAME`` or, without it, by the first
registered benchmark whose :meth:`Benchmark.claims` accepts the file's text. The
benchmark's name is stored in every session (``Session.benchmark``), so a run directory's
``sessions.json`` is read back by the same benchmark.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from sysbench_gpu.benchmarks.explorer import ExploreLayout, TurnView
from sysbench_gpu.benchmarks.judge_tasks import JudgePlan
from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.loaded_run import LoadedRun
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.core.sessions import Dataset, Session


@dataclass(frozen=True)
class ReportRequest:
    """What the ``report`` verb asks of a benchmark: its runs, labels and options, and the stage's extras.

    ``profile_lines``/``profile_entries`` (the throughput profile of runs with stats.json)
    and ``explorer`` (a site beside the report) are computed by the reporting stage and only
    placed by the benchmark.
    """

    runs: Sequence[str]
    labels: Sequence[str | None]
    out: Path
    formats: Sequence[str]
    figures: bool
    metric_options: Mapping[str, Any]
    arguments: Mapping[str, Any]
    gt_pairs: Sequence[tuple[Path, Path]] = ()
    sort: str = "given"
    data: str | None = None
    device_spec: str | None = None
    profile_lines: Sequence[str] = ()
    profile_entries: Sequence[Mapping[str, Any]] = ()
    explorer: str | None = None


@dataclass(frozen=True)
class ReportResult:
    out_dir: Path
    tables: Sequence[Path]
    figures: Sequence[Path]
    warnings: Sequence[str] = ()


@dataclass(frozen=True)
class GenerationPreset:
    """Decoding a benchmark's authors used, for ``generate --preset NAME``; None leaves a setting as given."""

    name: str
    description: str
    temperature: float | None = None  # 0: greedy
    max_tokens: int | None = None
    system_message: str | None = None
    repetition_penalty: float | None = None  # 1.0: none, whatever the model's generation config says


class Benchmark:
    """One benchmark behind one interface. Subclasses set ``name`` and override what they support."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    #: file names looked for when ``--data`` names a directory
    data_filenames: ClassVar[tuple[str, ...]] = ()
    #: --history values this benchmark's conversations support
    history_modes: ClassVar[tuple[str, ...]] = ("model", "reference")
    #: what one engine call of a model-history run holds, for the log ("turn", "answered turn")
    call_unit: ClassVar[str] = "turn"
    #: whether ``compare`` takes several runs against the first
    compares_many: ClassVar[bool] = False
    #: whether some of its turns are scored by rules, with no judge
    rule_scored: ClassVar[bool] = False
    #: who may score its turns besides the judge: the ``scorer`` its judgments name (its rules)
    scorers: ClassVar[tuple[str, ...]] = ()
    #: ``report --sort`` keys this benchmark's report orders rows by
    sort_keys: ClassVar[tuple[str, ...]] = ("given",)
    #: whether its report places the stage's extras (throughput profile, explorer link)
    report_extras: ClassVar[bool] = False
    #: options of the judge stage this benchmark takes: option (``judge_prompts``) -> (choices, help); the
    #: first choice is the default. The judge command adds one ``--flag`` per option of any registered benchmark.
    judge_options: ClassVar[Mapping[str, tuple[tuple[str, ...], str]]] = {}

    # -- data ------------------------------------------------------------------
    def claims(self, text: str) -> bool:
        """Whether a data file's text is this benchmark's (used when no --benchmark is given)."""
        return False

    def parse(
        self, text: str, source: Path, *, system_message: str | None = None, task: str | None = None
    ) -> list[Session]:
        raise NotImplementedError

    def serialize(self, sessions: Sequence[Session]) -> bytes:
        """The run directory's ``sessions.json`` for these sessions; :meth:`parse` reads it back."""
        raise NotImplementedError

    def is_official(self, dataset: Dataset) -> bool:
        """Whether the file is the benchmark's published one (by checksum)."""
        return False

    def stats(self, dataset: Dataset) -> dict[str, Any]:
        raise NotImplementedError

    def format_stats(self, dataset: Dataset, stats: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def describe_valid(self, dataset: Dataset) -> str:
        """``data validate``'s line for a valid file."""
        return f"{dataset.path}: {len(dataset.sessions)} sessions, valid (sha256 {dataset.sha256})"

    def download(self, out: Path, options: Mapping[str, Any]) -> list[str]:
        """Fetch the benchmark's data into ``out``; the lines to print."""
        raise SysbenchError(f"data download: {self.name} has no download; pass its file with --data")

    # -- generation ------------------------------------------------------------
    def check_generation(self, history: str, distractor_turns: int) -> None:
        """Refuse a --history or ablation this benchmark does not support, in one line."""
        if history not in self.history_modes:
            raise SysbenchError(
                f"--history {history} is not supported for {self.title or self.name} runs "
                f"(choose from {', '.join(self.history_modes)})"
            )
        if distractor_turns:
            raise SysbenchError(f"--distractor-turns is not supported for {self.title or self.name} runs")

    def distractor_pool(self, sessions: Sequence[Session]) -> Mapping[int, Sequence[Any]]:
        """Exchanges that distractor runs may draw from (none unless the benchmark has the ablation)."""
        return {}

    def choose_distractors(
        self, pool: Mapping[int, Sequence[Any]], session: Session, count: int, seed: int
    ) -> tuple[Any, ...]:
        """The ``count`` distractor exchanges ``session`` gets from ``pool`` under ``seed``."""
        return ()

    def history_replies(self, session: Session, turn: int, history: str, replies: Mapping[int, str]) -> dict[int, str]:
        """The assistant message after each earlier turn: the run's own replies or the references."""
        if history == "reference":
            return {t.index: t.reference or "" for t in session.turns[: turn - 1]}
        return {index: replies[index] for index in range(1, turn) if index in replies}

    def messages(
        self, session: Session, turn: int, history: str, replies: Mapping[int, str], distractors: Sequence[Any] = ()
    ) -> list[ChatMessage]:
        """The conversation ``turn`` is generated from."""
        raise NotImplementedError

    def generation_manifest(self, sessions: Sequence[Session]) -> dict[str, Any]:
        """Benchmark fields for the generate section of manifest.json."""
        return {}

    def generation_presets(self) -> tuple[GenerationPreset, ...]:
        """The ``generate --preset`` values this benchmark offers (its paper's decoding); none by default."""
        return ()

    def procedure_warning(self, manifest: Mapping[str, Any]) -> str | None:
        """One line naming how a run (its manifest) was made unlike the benchmark's published procedure; None if not."""
        return None

    # -- judging ---------------------------------------------------------------
    def judge_flag_error(self, *, template: bool, score_templates: bool) -> str | None:
        """One line when the judge's template flags do not apply to this benchmark."""
        return None

    def plan_judging(
        self,
        run: RunDir,
        sessions: Sequence[Session],
        generations: Mapping[Any, GenerationRecord],
        judged: set[tuple[int, int]],
        settings: Any,
        limit: int | None,
        system_ids: Any,
    ) -> JudgePlan:
        """The judge stage's work on a run: tasks to ask, records made without asking.

        ``settings`` is the judge stage's ``JudgeSettings`` (None when no judge was named).
        """
        raise NotImplementedError

    def judge_manifest(self, settings: Any, plan: JudgePlan, scorers: Mapping[str, int]) -> dict[str, Any]:
        """Benchmark fields for the judge section of manifest.json (templates and their hashes)."""
        return {}

    def judge_template(self, spec: str | None, language: str | None) -> Any:
        """The judge template chosen by ``--template`` and ``--template-lang`` (None where there is none)."""
        return None

    def judge_templates(self, pairs: Sequence[str]) -> dict[str, Any]:
        """The judge templates given as ``KIND=FILE`` flags (``--mteval-template``), by kind; {} for none."""
        return {}

    def describe_judge_templates(self, settings: Any) -> str:
        """How a dry run names the templates the judge will be given."""
        return f"{self.title or self.name} judge templates"

    def configured(self, options: Mapping[str, Any]) -> Benchmark:
        """This benchmark with the judge options given (not None) applied; an option it does not take is one line."""
        for option, value in options.items():
            if value is not None and option not in self.judge_options:
                flag = "--" + option.replace("_", "-")
                raise SysbenchError(f"{flag} does not apply to {self.title or self.name} runs")
        return self

    def judge_settings(self, settings: Any) -> Any:
        """``settings`` completed with what this benchmark's judging needs (its built-in templates)."""
        return settings

    def judge_agreement(self, run_a: Path, run_b: Path) -> dict[str, Any]:
        """How far two judges agree on the same replies (``judge agreement RUN_A RUN_B``)."""
        raise SysbenchError(f"judge agreement compares checklist verdicts; {self.title or self.name} runs have none")

    def format_agreement(self, report: Mapping[str, Any]) -> str:
        raise NotImplementedError

    # -- metrics and reports ---------------------------------------------------
    def run_metrics(self, loaded: LoadedRun, **options: Any) -> dict[str, Any]:
        raise NotImplementedError

    def format_metrics(self, result: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def compare(self, runs: Sequence[LoadedRun], **options: Any) -> dict[str, Any]:
        raise NotImplementedError

    def format_comparison(self, result: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def report(self, request: ReportRequest) -> ReportResult:
        raise NotImplementedError

    # -- explorer --------------------------------------------------------------
    def turn_view(self, session: Session, turn: int, judgment: JudgmentRecord | None) -> TurnView:
        """How the explorer shows one turn's verdicts or score (``judgment`` None: not judged)."""
        if judgment is None or judgment.parse_status in ("skipped", "unparsed") or judgment.score is None:
            return TurnView(judged=False)
        return TurnView(judged=True, score=judgment.score, note=judgment.reasoning, scorer=judgment.scorer)

    def arena_points(self, session: Session, turn: int, judgment: JudgmentRecord | None) -> float | None:
        """What a reply earned on its turn, for the arena's verdict battles (None: not judged).

        From :meth:`turn_view`, so a benchmark that shows its turns needs nothing more: a
        checklist's satisfied items (``yes``) or the turn's score.
        """
        view = self.turn_view(session, turn, judgment)
        if not view.judged:
            return None
        if view.score is not None:
            return float(view.score)
        return float(sum(1 for item in view.items if item.get("value") == "yes"))

    def session_facets(self, session: Session) -> dict[str, Any]:
        """Fields the explorer's session table shows and filters on (named by :meth:`explore_layout`)."""
        return {}

    def explore_layout(self, metrics: Mapping[str, Any] | None) -> ExploreLayout:
        """The explorer's layout, with one run's headline cells from its ``run_metrics`` (None: not scored)."""
        metrics = metrics or {}
        return ExploreLayout(
            cells=(
                {"label": "Sessions", "value": metrics.get("n_sessions"), "kind": "count"},
                {"label": "Turns", "value": metrics.get("n_turns"), "kind": "count"},
            )
        )


# ------------------------------------------------------------------ data files


# ------------------------------------------------------------------ run directories
