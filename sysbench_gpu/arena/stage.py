"""The arena stage: under the arena's lock, play the pairs not yet played, then fit and write everything.

One writer: ``ARENA_DIR/.arena.lock`` (``core.locks``) is held for the whole call, so a
second arena on the same directory is refused in one line. Battles are appended as they
are decided, so an interrupted arena resumes where it stopped, and adding a run plays only
its new pairs. An arena keeps one way of deciding battles: a directory of verdict battles
is not mixed with judged ones, nor one judge or template with another.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sysbench_gpu.arena.battles import BattleStore, pairs, verdict_battles
from sysbench_gpu.arena.judged import dry_run, judge_questions, questions
from sysbench_gpu.arena.outputs import write_figures, write_tables
from sysbench_gpu.arena.prompt import ArenaTemplate
from sysbench_gpu.arena.ratings import outcomes, rate
from sysbench_gpu.arena.runs import ArenaRun, load_runs
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.locks import prepare_directory, stage_lock
from sysbench_gpu.core.rundir import RunDir, utc_now
from sysbench_gpu.judging.rounds import JudgeSettings, JudgeSummary

STAGE = "arena"


@dataclass(frozen=True)
class ArenaRequest:
    runs: Sequence[str]
    out: Path
    by: str = "verdicts"  # verdicts | judge
    baseline: str | None = None
    resamples: int = 1000
    seed: int = 0
    length_control: bool = False
    formats: Sequence[str] = ("png",)
    figures: bool = True
    show_progress: bool = True
    judge: JudgeSettings | None = None
    template: ArenaTemplate | None = None

    @property
    def mode(self) -> str:
        return "baseline" if self.baseline is not None else "all-pairs"


def _given(request: ArenaRequest) -> list[str]:
    """The runs, with the baseline first among them (added if it was not listed)."""
    runs = list(request.runs)
    if request.baseline is not None:
        same = [r for r in runs if Path(r).resolve() == Path(request.baseline).resolve()]
        runs = [request.baseline] + [r for r in runs if r not in same]
    if len(runs) < 2:
        raise SysbenchError("arena needs at least two runs (or one run and --baseline RUN)")
    return runs


def _check_same_arena(out: RunDir, request: ArenaRequest) -> None:
    """Refuse to mix ways of deciding battles in one arena directory."""
    section = out.stage_section(STAGE) if out.manifest_path.is_file() else {}
    if not section:
        return
    if section.get("by") != request.by:
        raise SysbenchError(
            f"{out.manifest_path}: field by: this arena's battles were decided by {section.get('by')}; "
            f"this call asks --by {request.by}; use another --out"
        )
    if request.by == "judge" and request.judge is not None and request.template is not None:
        judge = section.get("judge") or {}
        if judge.get("model") != request.judge.model or section.get("template", {}).get("sha256") != (
            request.template.sha256
        ):
            raise SysbenchError(
                f"{out.manifest_path}: field judge: battles here were judged by {judge.get('model')!r} with template "
                f"{str(section.get('template', {}).get('sha256'))[:12]}; this call asks {request.judge.model!r} "
                f"with template {request.template.sha256[:12]}; use another --out"
            )


def _progress(total: int, desc: str, unit: str, shown: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not shown)


def _load(request: ArenaRequest) -> tuple[list[ArenaRun], ArenaRun | None]:
    given = _given(request)
    with _progress(len(given), "arena: runs", "run", request.show_progress) as bar:
        runs = load_runs(given, bar)
    return runs, (runs[0] if request.baseline is not None else None)


def plan_dry_run(request: ArenaRequest) -> dict[str, Any]:
    """Judged battles: what would be sent, without a lock, an engine or a request."""
    if request.judge is None or request.template is None:
        raise SysbenchError("--dry-run estimates a judge's cost: pass --by judge --judge ... --judge-model ...")
    runs, baseline = _load(request)
    done = set(BattleStore(request.out).read())
    report = dry_run(questions(pairs(runs, baseline), done), request.template, request.judge)
    return {"out": str(request.out), "judge": request.judge.backend, "judge_model": request.judge.model, **report}


def run_arena(request: ArenaRequest, engine_factory: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Play what is missing, then write ratings.json, the leaderboards, the figures and the manifest."""
    prepare_directory(request.out, "arena directory")
    with stage_lock(request.out, STAGE):
        return _run(request, engine_factory)


def _run(request: ArenaRequest, engine_factory: Callable[[], Any] | None) -> dict[str, Any]:
    out = RunDir(request.out)
    _check_same_arena(out, request)
    started = utc_now()
    runs, baseline = _load(request)
    store = BattleStore(request.out)
    records = store.read()
    done = set(records)
    chosen = pairs(runs, baseline)
    played = 0
    judge_summary = None
    if request.by == "verdicts":
        with _progress(len(chosen), "arena: pairs", "pair", request.show_progress) as bar:
            for a, b in chosen:
                new = verdict_battles(a, b, done)
                played += store.append(new)
                records.update((record.key, record) for record in new)
                bar.update(1)
    else:
        if request.judge is None or request.template is None or engine_factory is None:
            raise SysbenchError("--by judge needs --judge {openai,vllm,hf} and --judge-model NAME")
        pending = questions(chosen, done)
        fields = _manifest_fields(request, runs, started)
        out.update_manifest(stage=STAGE, status="running", **fields)
        judge_summary = judge_questions(
            pending, request.template, request.judge, engine_factory, request.out, store, request.show_progress
        )
        played = judge_summary.judged + judge_summary.unparsed
        records = store.read()
    found, consistency = outcomes(records, {run.key for run in runs})
    last_call = _last_call(judge_summary)
    if not found:
        unparsed = sum(1 for r in records.values() if r.status == "unparsed")
        out.update_manifest(stage=STAGE, status="no outcomes", finished=utc_now(), **last_call)
        raise SysbenchError(
            f"{request.out}: no battle has an outcome yet ({len(records)} battle records, {unparsed} unparsed; "
            "a judged battle needs both orders parsed, a verdict battle a turn judged in both runs)"
        )
    result = rate(
        runs,
        found,
        baseline=baseline,
        resamples=request.resamples,
        seed=request.seed,
        length_control=request.length_control,
    )
    result["fit"]["mode"] = request.mode
    result["fit"]["by"] = request.by
    if consistency is not None:
        result["position_consistency"] = consistency.summary()
    title = f"Arena of {len(runs)} {runs[0].benchmark.title or runs[0].benchmark.name} runs ({request.by})"
    paths = write_tables(request.out, result, title)
    if request.figures:
        paths += write_figures(request.out, result, request.formats)
    fields = _manifest_fields(request, runs, started)
    fields.update(status="complete", finished=utc_now(), battles_played_this_call=played, **last_call)
    out.update_manifest(stage=STAGE, **fields)
    return {"result": result, "played": played, "paths": [str(p) for p in paths], "out": str(request.out)}


def _last_call(summary: JudgeSummary | None) -> dict[str, Any]:
    if summary is None:
        return {}
    counts = ("judged", "unparsed", "requests", "cache_hits")
    return {"last_call": {name: getattr(summary, name) for name in counts}}


def _manifest_fields(request: ArenaRequest, runs: Sequence[ArenaRun], started: str) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "started": started,
        "runs": [{"run": run.given, "path": run.key, "model": run.name} for run in runs],
        "benchmark": runs[0].benchmark.name,
        "by": request.by,
        "mode": request.mode,
        "baseline": request.baseline,
        "seeds": {"bootstrap": request.seed, "judge": request.judge.seed if request.judge is not None else None},
        "resamples": request.resamples,
        "length_control": request.length_control,
    }
    if request.judge is not None and request.template is not None:
        fields["judge"] = {
            "backend": request.judge.backend,
            "model": request.judge.model,
            "max_retries": request.judge.max_retries,
            "max_tokens": request.judge.max_tokens,
            "guided_decoding": request.judge.guided_decoding,
            "cache_dir": str(request.judge.cache_dir) if request.judge.cache_dir is not None else None,
            "both_orders": True,
        }
        fields["template"] = {"source": request.template.source, "sha256": request.template.sha256}
    return fields
