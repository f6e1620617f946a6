"""The arena stage: under the arena's lock, play the pairs not yet played, then fit and write everything.

One writer: ``ARENA_DIR/.arena.lock`` (``core.locks``) is held for the whole call, so a
second arena on the same directory is refused in one line. Battles are appended as they
are decided, so an interrupted arena resumes where it stopped, and adding a run plays only
its new pairs. An arena keeps one way of deciding battles and one mode: a directory of
verdict battles is not mixed with judged ones, nor one judge or template with another, nor
all-pairs battles with a baseline's (or one baseline with another). Stored battles whose
runs changed since are played again or refused (``arena.replays``).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sysbench_gpu.arena.battles import BattleKey, BattleRecord, BattleStore, pairs, verdict_battles
from sysbench_gpu.arena.judged import dry_run, judge_questions, questions
from sysbench_gpu.arena.outputs import write_figures, write_tables
from sysbench_gpu.arena.prompt import ArenaTemplate
from sysbench_gpu.arena.ratings import outcomes, rate
from sysbench_gpu.arena.replays import Changed, Pair, changed_battles, unparsed_battles
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
    retry_unparsed: bool = False  # ask again the judged battles whose answer never parsed
    replay_changed: bool = False  # ask again the judged battles whose runs' conversations changed since

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
    _check_same_mode(out, section, request)


def _baseline_path(baseline: str | None) -> str | None:
    return str(Path(baseline).resolve()) if baseline is not None else None


def _check_same_mode(out: RunDir, section: Mapping[str, Any], request: ArenaRequest) -> None:
    """Refuse a mode (or baseline) other than the one the stored battles were played in."""
    store = BattleStore(out.path)
    if "mode" not in section or not store.path.is_file() or store.path.stat().st_size == 0:
        return  # nothing played yet: any mode may start here
    mode, baseline = section.get("mode"), section.get("baseline")
    stored_path = section.get("baseline_path") or _baseline_path(baseline)
    if mode == request.mode and stored_path == _baseline_path(request.baseline):
        return
    had = f"against the baseline {baseline}" if mode == "baseline" else str(mode)
    asks = f"against the baseline {request.baseline}" if request.baseline is not None else "all-pairs"
    again = f"--baseline {baseline}" if mode == "baseline" else "no --baseline"
    raise SysbenchError(
        f"{out.manifest_path}: field mode: the battles in {request.out} were played {had}; this call asks {asks}; "
        f"rerun with {again}, or use another --out"
    )


def _progress(total: int, desc: str, unit: str, shown: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not shown)


def _load(request: ArenaRequest) -> tuple[list[ArenaRun], ArenaRun | None]:
    given = _given(request)
    with _progress(len(given), "arena: runs", "run", request.show_progress) as bar:
        runs = load_runs(given, bar)
    return runs, (runs[0] if request.baseline is not None else None)


@dataclass(frozen=True)
class Plan:
    """What is stored, the pairs of this call, and the stored battles to take out and play again."""

    records: dict[BattleKey, BattleRecord]
    chosen: list[Pair]
    changed: Changed
    retry: set[BattleKey]

    @property
    def to_replace(self) -> set[BattleKey]:
        return self.changed.keys | self.retry


def _plan(request: ArenaRequest, runs: Sequence[ArenaRun], baseline: ArenaRun | None) -> Plan:
    """Checked before anything is written: a judged battle whose runs changed is refused without --replay-changed."""
    if request.by != "judge" and (request.retry_unparsed or request.replay_changed):
        raise SysbenchError(
            "--retry-unparsed and --replay-changed apply to --by judge (verdict battles are replayed by themselves)"
        )
    records = BattleStore(request.out).read()
    chosen = pairs(runs, baseline)
    changed = changed_battles(records, chosen, request.by)
    if changed.keys and request.by == "judge" and not request.replay_changed:
        raise SysbenchError(changed.refusal(str(request.out)))
    # An unparsed battle that is stale too is asked again as stale (its prompt is new, and so its cache key).
    retry = unparsed_battles(records, chosen) - changed.keys if request.retry_unparsed else set()
    return Plan(records, chosen, changed, retry)


def _judge_settings(request: ArenaRequest, out: RunDir, plan: Plan) -> JudgeSettings | None:
    """With battles to retry, a new retry round: new cache keys, so the replies that failed are not replayed."""
    if request.judge is None or not plan.retry:
        return request.judge
    previous = out.stage_section(STAGE).get("retry_rounds", 0) if out.manifest_path.is_file() else 0
    return replace(request.judge, retry_round=int(previous) + 1)


def plan_dry_run(request: ArenaRequest) -> dict[str, Any]:
    """Judged battles: what would be sent, without a lock, an engine or a request."""
    if request.judge is None or request.template is None:
        raise SysbenchError("--dry-run estimates a judge's cost: pass --by judge --judge ... --judge-model ...")
    runs, baseline = _load(request)
    plan = _plan(request, runs, baseline)
    settings = _judge_settings(request, RunDir(request.out), plan)
    assert settings is not None
    done = set(plan.records) - plan.to_replace
    report = dry_run(questions(plan.chosen, done), request.template, settings)
    return {
        "out": str(request.out),
        "judge": settings.backend,
        "judge_model": settings.model,
        "retried_unparsed": len(plan.retry),
        "replayed_changed": len(plan.changed.keys),
        **report,
    }


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
    plan = _plan(request, runs, baseline)
    if request.by == "judge" and (request.judge is None or request.template is None or engine_factory is None):
        raise SysbenchError("--by judge needs --judge {openai,vllm,hf} and --judge-model NAME")
    settings = _judge_settings(request, out, plan)
    store = BattleStore(request.out)
    # The mode and the runs go in the manifest before any battle: an interrupted arena still says what it played.
    out.update_manifest(stage=STAGE, status="running", **_manifest_fields(request, runs, started))
    store.set_aside(plan.to_replace)
    records = {key: record for key, record in plan.records.items() if key not in plan.to_replace}
    done = set(records)
    chosen = plan.chosen
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
        assert settings is not None and request.template is not None and engine_factory is not None
        pending = questions(chosen, done)
        judge_summary = judge_questions(
            pending, request.template, settings, engine_factory, request.out, store, request.show_progress
        )
        played = judge_summary.judged + judge_summary.unparsed
        records = store.read()
        if plan.retry:
            out.update_manifest(stage=STAGE, retry_rounds=settings.retry_round)
    pair_keys = {(a.key, b.key) for a, b in chosen}
    found, consistency = outcomes(records, pair_keys)
    unparsed = len(unparsed_battles(records, chosen))
    counts = {
        "battles_played_this_call": played,
        "battles_replayed_this_call": len(plan.changed.keys),
        "battles_retried_this_call": len(plan.retry),
        **_last_call(judge_summary),
    }
    if not found:
        out.update_manifest(stage=STAGE, status="no outcomes", finished=utc_now(), **counts)
        retry = "; rerun with --retry-unparsed to ask the judge again" if unparsed else ""
        raise SysbenchError(
            f"{request.out}: no battle has an outcome yet ({len(records)} battle records, {unparsed} unparsed; "
            f"a judged battle needs both orders parsed, a verdict battle a turn judged in both runs){retry}"
        )
    result = rate(
        runs,
        found,
        baseline=baseline,
        resamples=request.resamples,
        seed=request.seed,
        length_control=request.length_control,
        unrated=_unrated_reasons(runs, records, pair_keys, request.by, baseline),
    )
    result["fit"]["mode"] = request.mode
    result["fit"]["by"] = request.by
    if consistency is not None:
        result["position_consistency"] = consistency.summary()
    if request.by == "judge":
        result["unparsed_battle_records"] = unparsed
    title = f"Arena of {len(runs)} {runs[0].benchmark.title or runs[0].benchmark.name} runs ({request.by})"
    paths = write_tables(request.out, result, title)
    if request.figures:
        paths += write_figures(request.out, result, request.formats)
    fields = _manifest_fields(request, runs, started)
    fields.update(status="complete", finished=utc_now(), **counts)
    out.update_manifest(stage=STAGE, **fields)
    return {
        "result": result,
        "played": played,
        "replayed": len(plan.changed.keys),
        "retried": len(plan.retry),
        "unparsed": unparsed,
        "paths": [str(p) for p in paths],
        "out": str(request.out),
    }


def _unrated_reasons(
    runs: Sequence[ArenaRun],
    records: Mapping[BattleKey, BattleRecord],
    pair_keys: set[tuple[str, str]],
    by: str,
    baseline: ArenaRun | None,
) -> dict[str, str]:
    """Why a run without a battle has none: nothing to play, or (judged) no battle parsed in both orders."""
    stored: Counter[str] = Counter()
    unparsed: Counter[str] = Counter()
    for record in records.values():
        if (record.a, record.b) in pair_keys:
            for key in (record.a, record.b):
                stored[key] += 1
                unparsed[key] += int(record.status == "unparsed")
    opponent = "the baseline" if baseline is not None else "any other run"
    answered = "answered and judged" if by == "verdicts" else "answered"
    reasons = {}
    for run in runs:
        if not stored[run.key]:
            reasons[run.key] = f"no battles: no turn {answered} both in this run and in {opponent}"
        else:
            reasons[run.key] = (
                f"no battles: none of its {stored[run.key]} judged battle records has both orders parsed "
                f"({unparsed[run.key]} unparsed; --retry-unparsed asks the judge again)"
            )
    return reasons


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
        "baseline_path": _baseline_path(request.baseline),
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
