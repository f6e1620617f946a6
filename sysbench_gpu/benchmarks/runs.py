"""What ``metrics``, ``compare`` and ``report`` read from a run directory (never written here),
and the run-level metrics and comparison, each answered by the run's benchmark."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.registry import get_benchmark, load_run_sessions, one_benchmark
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.loaded_run import LoadedRun
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord, Key
from sysbench_gpu.core.rundir import RunDir


def load_run(run_dir: str | Path) -> LoadedRun:
    """Read what metrics need from a run directory; never writes."""
    run = RunDir(run_dir).require()
    manifest = run.read_manifest()
    sessions = load_run_sessions(run)
    if not run.generations.path.exists():
        raise SysbenchError(f"{run.path}: no {run.generations.path.name} (run generate or import-upstream first)")
    generations = run.generations.read()
    known = {(s.system_id, t.index) for s in sessions for t in s.turns}
    expected = set(generations) & known
    if not expected:
        raise SysbenchError(f"{run.path}: no generation record matches a turn of sessions.json")
    judgments = run.judgments.read()
    label, model = _label_and_model(manifest, generations.values(), run.path)
    unfinished = tuple(
        stage for stage, section in manifest.get("stages", {}).items() if section.get("status") == "running"
    )
    return LoadedRun(run.path, label, model, sessions, judgments, expected, unfinished, manifest)


def _label_and_model(manifest: Mapping[str, Any], generations: Any, path: Path) -> tuple[str, str | None]:
    stages = manifest.get("stages", {}) if isinstance(manifest.get("stages"), dict) else {}

    def find(key: str) -> Any:
        if manifest.get(key):
            return manifest[key]
        for section in stages.values():
            if isinstance(section, dict) and section.get(key):
                return section[key]
        return None

    model = find("model")
    if model is None:
        seen = Counter(g.model for g in generations if g.model)
        model = seen.most_common(1)[0][0] if seen else None
    label = find("label") or path.resolve().name
    return str(label), (str(model) if model is not None else None)


def run_metrics(
    run_dir: str | Path,
    *,
    allow_partial: bool = False,
    exclude_unparsed: bool = False,
    exclude_skipped: bool = False,
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Metrics of a run directory (sessions.json + generations + judgments + manifest), as its benchmark defines them.

    SysBench: CSR / ISR / SSR; MT-Eval: 0-10 scores per task, category, answered turn and
    overall; the same partial-run rules for every benchmark.
    """
    return metrics_of(
        load_run(run_dir),
        allow_partial=allow_partial,
        exclude_unparsed=exclude_unparsed,
        exclude_skipped=exclude_skipped,
        resamples=resamples,
        seed=seed,
    )


def metrics_of(loaded: LoadedRun, **options: Any) -> dict[str, Any]:
    """:func:`run_metrics` of a run already loaded; errors name the run directory."""
    try:
        return get_benchmark(loaded.benchmark).run_metrics(loaded, **options)
    except SysbenchError as error:
        raise SysbenchError(f"{loaded.path}: {error}") from None


def compare_loaded(
    runs: list[LoadedRun], *, resamples: int = 1000, seed: int = 0, allow_partial: bool = False
) -> dict[str, Any]:
    """Each later run against the first, paired by session where they share them, by their one benchmark."""
    benchmark = one_benchmark([(str(run.path), get_benchmark(run.benchmark)) for run in runs], "compare")
    if len(runs) > 2 and not benchmark.compares_many:
        raise SysbenchError(f"compare takes two {benchmark.title or benchmark.name} runs (RUN_A RUN_B)")
    return benchmark.compare(runs, resamples=resamples, seed=seed, allow_partial=allow_partial)


def compare_runs(
    run_a: str | Path, run_b: str | Path, *, resamples: int = 1000, seed: int = 0, allow_partial: bool = False
) -> dict[str, Any]:
    """Paired difference B - A per headline metric, with a paired session bootstrap CI.

    Both runs must be finished (every turn generated and judged) unless ``allow_partial``.
    """
    return compare_loaded(
        [load_run(run_a), load_run(run_b)], resamples=resamples, seed=seed, allow_partial=allow_partial
    )


def same_replies_judged(
    runs: tuple[RunDir, RunDir],
    generations: tuple[Mapping[Key, GenerationRecord], Mapping[Key, GenerationRecord]],
    judgments: tuple[Mapping[Key, JudgmentRecord], Mapping[Key, JudgmentRecord]],
    differs: Callable[[Key], bool] | None = None,
) -> list[Key]:
    """The (session, turn) keys both runs generated and judged, refused where a reply differs.

    Judge agreement compares two judges on the same replies; ``differs`` adds a benchmark's
    own reason for a turn not to count as the same (MT-Eval: another task).
    """
    (run_a, run_b), (gens_a, gens_b), (judg_a, judg_b) = runs, generations, judgments
    common = sorted(set(judg_a) & set(judg_b) & set(gens_a) & set(gens_b))
    if not common:
        raise SysbenchError(f"{run_a.path} and {run_b.path} have no judged turn in common")
    differ = [k for k in common if gens_a[k].response != gens_b[k].response or (differs is not None and differs(k))]
    if differ:
        shown = "; ".join(f"session {s}, turn {t}" for s, t in differ[:5])
        raise SysbenchError(
            f"{run_a.path} and {run_b.path} judge different responses ({len(differ)} of {len(common)} common turns "
            f"differ: {shown}{' …' if len(differ) > 5 else ''}); agreement needs the same responses "
            "(re-judge one run with `judge RUN --rejudge --out NEW`)"
        )
    return common
