"""The benchmark registry, and data files and run directories read through it.

A benchmark class registers with :func:`register_benchmark` when its module is imported
(the built-ins in ``benchmarks/__init__.py``). A data file's benchmark is ``--benchmark
NAME`` or the first registered one whose ``claims`` accepts its text; a run directory's
``sessions.json`` is written by its benchmark's ``serialize`` and read back the same way.
Runs of different benchmarks given together are refused by :func:`one_benchmark`, here and
nowhere else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from sysbench_gpu.benchmarks.base import Benchmark, GenerationPreset
from sysbench_gpu.core import jsonio
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.records import set_scorers
from sysbench_gpu.core.rundir import SESSIONS, RunDir
from sysbench_gpu.core.sessions import Dataset, Session

DEMO_NAME = "demo"


@dataclass
class BenchmarkRegistry:
    """Benchmarks by name, in registration order (the order :meth:`detect` tries them)."""

    _by_name: dict[str, Benchmark] = field(default_factory=dict)

    def register(self, cls: type[Benchmark]) -> type[Benchmark]:
        if not cls.name:
            raise SysbenchError(f"benchmark class {cls.__name__} has no name")
        existing = self._by_name.get(cls.name)
        if existing is not None and type(existing) is not cls:
            raise SysbenchError(
                f"benchmark {cls.name!r} is registered twice ({type(existing).__name__}, {cls.__name__})"
            )
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
        raise SysbenchError(
            f"{source}: not a data file of any registered benchmark ({kinds}); pass --benchmark NAME to read it as one"
        )


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


def generation_presets() -> dict[str, tuple[Benchmark, GenerationPreset]]:
    """Every registered benchmark's ``generate --preset`` values, by name (first one wins)."""
    presets: dict[str, tuple[Benchmark, GenerationPreset]] = {}
    for benchmark in REGISTRY.all():
        for preset in benchmark.generation_presets():
            presets.setdefault(preset.name, (benchmark, preset))
    return presets


def judge_options() -> dict[str, tuple[tuple[str, ...], str]]:
    """The judge-stage options of every registered benchmark (``Benchmark.judge_options``), first one wins."""
    options: dict[str, tuple[tuple[str, ...], str]] = {}
    for benchmark in REGISTRY.all():
        for option, spec in benchmark.judge_options.items():
            options.setdefault(option, spec)
    return options


def one_benchmark(labelled: Sequence[tuple[str, Benchmark]], verb: str) -> Benchmark:
    """The one benchmark of runs given together; runs of different benchmarks are refused here, in one line."""
    first_label, first = labelled[0]
    for label, benchmark in labelled[1:]:
        if benchmark.name != first.name:
            raise SysbenchError(
                f"{verb}: cannot mix {first.title or first.name} runs with {benchmark.title or benchmark.name} "
                f"runs ({label} is one; {first_label} is not); give runs of one benchmark at a time"
            )
    return first


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


def load_dataset(
    path: str | Path, *, system_message: str | None = None, task: str | None = None, benchmark: str | None = None
) -> Dataset:
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
