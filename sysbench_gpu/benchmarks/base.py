"""The Benchmark protocol, its registry, and loading data and run sessions through it.

A benchmark is one folder under ``benchmarks/`` holding one :class:`Benchmark` subclass,
registered with :func:`register_benchmark` when its module is imported (the built-in ones
are imported by ``benchmarks/__init__.py``, the one place that lists them). A benchmark
owns everything that differs between benchmarks: reading and validating its data, the
conversation of each turn under each history mode it supports, what judging a turn means
and its prompt, scoring, metrics and tables, and how the explorer shows a turn. Shared
stages call these methods and never compare a benchmark's name; runs of different
benchmarks are refused together by :func:`one_benchmark`, here and nowhere else.

A data file's benchmark is chosen by ``--benchmark NAME`` or, without it, by the first
registered benchmark whose :meth:`Benchmark.claims` accepts the file's text. The
benchmark's name is stored in every session (``Session.benchmark``), so a run directory's
``sessions.json`` is read back by the same benchmark.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from sysbench_gpu.benchmarks.explorer import ExploreLayout, TurnView
from sysbench_gpu.benchmarks.judge_tasks import JudgePlan
from sysbench_gpu.core import jsonio
from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.loaded_run import LoadedRun
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord, set_scorers
from sysbench_gpu.core.rundir import SESSIONS, RunDir
from sysbench_gpu.core.sessions import Dataset, Session

DEMO_NAME = "demo"


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

    # -- data ------------------------------------------------------------------
    def claims(self, text: str) -> bool:
        """Whether a data file's text is this benchmark's (used when no --benchmark is given)."""
        return False

    def parse(self, text: str, source: Path, *, system_message: str | None = None,
              task: str | None = None) -> list[Session]:
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
            raise SysbenchError(f"--history {history} is not supported for {self.title or self.name} runs "
                                f"(choose from {', '.join(self.history_modes)})")
        if distractor_turns:
            raise SysbenchError(f"--distractor-turns is not supported for {self.title or self.name} runs")

    def distractor_pool(self, sessions: Sequence[Session]) -> Mapping[int, Sequence[Any]]:
        """Exchanges that distractor runs may draw from (none unless the benchmark has the ablation)."""
        return {}

    def choose_distractors(self, pool: Mapping[int, Sequence[Any]], session: Session, count: int,
                           seed: int) -> tuple[Any, ...]:
        """The ``count`` distractor exchanges ``session`` gets from ``pool`` under ``seed``."""
        return ()

    def history_replies(self, session: Session, turn: int, history: str, replies: Mapping[int, str]) -> dict[int, str]:
        """The assistant message after each earlier turn: the run's own replies or the references."""
        if history == "reference":
            return {t.index: t.reference or "" for t in session.turns[: turn - 1]}
        return {index: replies[index] for index in range(1, turn) if index in replies}

    def messages(self, session: Session, turn: int, history: str, replies: Mapping[int, str],
                 distractors: Sequence[Any] = ()) -> list[ChatMessage]:
        """The conversation ``turn`` is generated from."""
        raise NotImplementedError

    def generation_manifest(self, sessions: Sequence[Session]) -> dict[str, Any]:
        """Benchmark fields for the generate section of manifest.json."""
        return {}

    # -- judging ---------------------------------------------------------------
    def judge_flag_error(self, *, template: bool, score_templates: bool) -> str | None:
        """One line when the judge's template flags do not apply to this benchmark."""
        return None

    def plan_judging(self, run: RunDir, sessions: Sequence[Session], generations: Mapping[Any, GenerationRecord],
                     judged: set[tuple[int, int]], settings: Any, limit: int | None,
                     system_ids: Any) -> JudgePlan:
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

    def session_facets(self, session: Session) -> dict[str, Any]:
        """Fields the explorer's session table shows and filters on (named by :meth:`explore_layout`)."""
        return {}

    def explore_layout(self, metrics: Mapping[str, Any] | None) -> ExploreLayout:
        """The explorer's layout, with one run's headline cells from its ``run_metrics`` (None: not scored)."""
        metrics = metrics or {}
        return ExploreLayout(cells=(
            {"label": "Sessions", "value": metrics.get("n_sessions"), "kind": "count"},
            {"label": "Turns", "value": metrics.get("n_turns"), "kind": "count"},
        ))


@dataclass
class BenchmarkRegistry:
    """Benchmarks by name, in registration order (the order :meth:`detect` tries them)."""

    _by_name: dict[str, Benchmark] = field(default_factory=dict)

    def register(self, cls: type[Benchmark]) -> type[Benchmark]:
        if not cls.name:
            raise SysbenchError(f"benchmark class {cls.__name__} has no name")
        existing = self._by_name.get(cls.name)
        if existing is not None and type(existing) is not cls:
            raise SysbenchError(f"benchmark {cls.name!r} is registered twice ({type(existing).__name__}, {cls.__name__})")
        self._by_name[cls.name] = cls()
        self._known_scorers()
        return cls

    def unregister(self, name: str) -> None:
        self._by_name.pop(name, None)
        self._known_scorers()

    def _known_scorers(self) -> None:
        """A judgments file may name the scorers of the registered benchmarks (``core.records.SCORERS``)."""
        set_scorers(scorer for benchmark in self._by_name.values() for scorer in benchmark.scorers)

    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    def all(self) -> tuple[Benchmark, ...]:
        return tuple(self._by_name.values())

    def get(self, name: str) -> Benchmark:
        try:
            return self._by_name[name]
        except KeyError:
            raise SysbenchError(f"unknown benchmark {name!r} (registered: {', '.join(self._by_name)})") from None

    def detect(self, text: str, source: Path) -> Benchmark:
        for benchmark in self.all():
            if benchmark.claims(text):
                return benchmark
        kinds = "; ".join(f"{b.name}" for b in self._by_name.values())
        raise SysbenchError(f"{source}: not a data file of any registered benchmark ({kinds}); "
                            "pass --benchmark NAME to read it as one")


#: The process's benchmarks: filled once at import by ``register_benchmark`` decorators.
REGISTRY = BenchmarkRegistry()


def register_benchmark(cls: type[Benchmark]) -> type[Benchmark]:
    """Class decorator: make ``cls`` selectable by its ``name`` (``--benchmark NAME``) and by content."""
    return REGISTRY.register(cls)


@contextlib.contextmanager
def registered(cls: type[Benchmark]) -> Iterator[Benchmark]:
    """Register ``cls`` for the duration of a block (tests, plug-ins tried out), then remove it."""
    REGISTRY.register(cls)
    try:
        yield REGISTRY.get(cls.name)
    finally:
        REGISTRY.unregister(cls.name)


def get_benchmark(name: str) -> Benchmark:
    return REGISTRY.get(name)


def benchmark_names() -> tuple[str, ...]:
    return REGISTRY.names()


def benchmark_of(sessions: Sequence[Session]) -> Benchmark:
    """The benchmark of a run's sessions (every session of a run belongs to one)."""
    names = {session.benchmark for session in sessions}
    if len(names) > 1:
        raise SysbenchError(f"sessions of several benchmarks together: {', '.join(sorted(names))}")
    return REGISTRY.get(names.pop() if names else REGISTRY.names()[0])


def one_benchmark(labelled: Sequence[tuple[str, Benchmark]], verb: str) -> Benchmark:
    """The one benchmark of runs given together; runs of different benchmarks are refused here, in one line."""
    first_label, first = labelled[0]
    for label, benchmark in labelled[1:]:
        if benchmark.name != first.name:
            raise SysbenchError(
                f"{verb}: cannot {verb} {first.title or first.name} runs with {benchmark.title or benchmark.name} "
                f"runs ({label} is one; {first_label} is not); give runs of one benchmark at a time"
            )
    return first


# ------------------------------------------------------------------ data files


def demo_data_path() -> Path:
    """The packaged demo set: 5 English sessions in upstream's schema, written for this project."""
    return Path(str(resources.files("sysbench_gpu").joinpath("demo", "demo_sessions.json")))


def resolve_data_path(path: str | Path) -> Path:
    """Accept a data file or a directory holding one (a benchmark's file name, ``sessions.json`` or a lone ``*.json``).

    The name ``demo`` (when no such file or folder exists) is the small English demo set
    packaged with sysbench-gpu.
    """
    if str(path) == DEMO_NAME and not Path(path).exists():
        return demo_data_path()
    path = Path(path)
    if path.is_dir():
        known = [name for benchmark in REGISTRY.all() for name in benchmark.data_filenames]
        for name in (*known, SESSIONS):
            if (path / name).is_file():
                return path / name
        candidates = sorted(path.glob("*.json"))
        if len(candidates) == 1:
            return candidates[0]
        raise SysbenchError(
            f"{path}: directory holds no {' or '.join((*known, SESSIONS))}"
            + (f" and {len(candidates)} other .json files" if candidates else "")
        )
    if not path.exists():
        raise SysbenchError(f"{path}: no such data file (download it with `sysbench-gpu data download`)")
    return path


def load_dataset(path: str | Path, *, system_message: str | None = None, task: str | None = None,
                 benchmark: str | None = None) -> Dataset:
    """Load and validate a data file of ``benchmark`` (by default: the benchmark whose format it is).

    ``system_message`` and ``task`` are options of benchmarks that take them (MT-Eval);
    the others refuse them in one line.
    """
    resolved = resolve_data_path(path)
    raw_bytes = resolved.read_bytes()
    text = jsonio.decode_utf8(raw_bytes, resolved)
    sha256 = hashlib.sha256(raw_bytes).hexdigest()
    chosen = REGISTRY.get(benchmark) if benchmark else REGISTRY.detect(text, resolved)
    sessions = tuple(chosen.parse(text, resolved, system_message=system_message, task=task))
    dataset = Dataset(path=resolved, sha256=sha256, sessions=sessions)
    return dataclasses.replace(dataset, is_official=chosen.is_official(dataset))


def dataset_benchmark(dataset: Dataset) -> Benchmark:
    return benchmark_of(dataset.sessions)


# ------------------------------------------------------------------ run directories


def save_run_sessions(run: RunDir, sessions: Sequence[Session], dataset: Dataset | None = None) -> None:
    """Snapshot the sessions into the run's ``sessions.json`` in their benchmark's own schema; record the dataset."""
    sessions = list(sessions)
    benchmark = benchmark_of(sessions)
    run.write_sessions_bytes(benchmark.serialize(sessions))
    if dataset is not None:
        run.update_manifest(
            dataset={
                "path": str(dataset.path),
                "sha256": dataset.sha256,
                "official": dataset.is_official,
                "n_sessions": len(sessions),
            }
        )


def load_run_sessions(run: RunDir) -> list[Session]:
    """The sessions of a run directory, read back by their benchmark."""
    if not run.sessions_path.exists():
        raise SysbenchError(f"{run.path}: no {SESSIONS} (run generate or import-upstream first)")
    return list(load_dataset(run.sessions_path).sessions)


def run_benchmark(run: RunDir | str | Path) -> Benchmark:
    """The benchmark of a run directory; one without sessions yet is the default benchmark's to describe."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    run.require()
    if not run.sessions_path.is_file():
        return REGISTRY.all()[0]
    return benchmark_of(load_run_sessions(run))
