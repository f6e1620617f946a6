"""The arena stage: under the arena's lock, play the pairs not yet played, then fit and write everything.

One writer: ``ARENA_DIR/.arena.lock`` (``core.locks``) is held for the whole call, so a
second arena on the same directory is refused in one line. Everything a call can refuse
(its flags, its runs, its ``--out``, what that folder holds, whether any battle can have an
outcome) is checked before the folder is made; the arena's settings reach its manifest with its
first battle, so a call that stops before one (an engine that does not load) stores none of them.
Battles are appended as they are decided, so an interrupted arena resumes where it stopped, and
adding a run plays only its new pairs. An arena keeps one way of deciding battles and one
mode: a directory of verdict battles is not mixed with judged ones, nor one judge or template
with another, nor all-pairs battles with a baseline's (or one baseline with another). Stored
battles whose runs changed since are played again or refused (``arena.replays``).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from sysbench_gpu.arena.battles import (
    BATTLES,
    BattleKey,
    BattleRecord,
    BattleStore,
    pairs,
    verdict_battles,
)
from sysbench_gpu.arena.checks import check_arena_out, check_outcomes_possible, check_same_arena
from sysbench_gpu.arena.judged import dry_run, judge_questions, questions
from sysbench_gpu.arena.outputs import write_figures, write_tables
from sysbench_gpu.arena.ratings import outcomes, rate
from sysbench_gpu.arena.replays import changed_battles, unparsed_battles
from sysbench_gpu.arena.request import STAGE, ArenaRequest, Plan, baseline_path, given_runs
from sysbench_gpu.arena.runs import ArenaRun, load_runs
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.locks import prepare_directory, stage_lock
from sysbench_gpu.core.progress import stderr_is_terminal
from sysbench_gpu.core.rundir import RunDir, utc_now
from sysbench_gpu.judging.rounds import JudgeSettings, JudgeSummary


def _progress(total: int, desc: str, unit: str, shown: bool) -> Any:
    """A bar on a terminal for the quick steps (loading runs, verdict pairs); nothing in a log file."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not (shown and stderr_is_terminal()))


def _load(request: ArenaRequest) -> tuple[list[ArenaRun], ArenaRun | None]:
    given = given_runs(request)
    with _progress(len(given), "arena: runs", "run", request.show_progress) as bar:
        runs = load_runs(given, bar)
    return runs, (runs[0] if request.baseline is not None else None)


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
    check_arena_out(request)
    runs, baseline = _load(request)
    check_same_arena(RunDir(request.out), request)
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
    """Play what is missing, then write ratings.json, the leaderboards, the figures and the manifest.

    Every refusal comes before the folder is made: ``--out``, the runs, what the folder holds, and
    whether any battle can have an outcome. A folder this call made is removed again if the call
    stops before it stored anything there.
    """
    if request.by == "judge" and (request.judge is None or request.template is None or engine_factory is None):
        raise SysbenchError("--by judge needs --judge {openai,vllm,hf} and --judge-model NAME")
    started = utc_now()
    check_arena_out(request)
    runs, baseline = _load(request)
    check_same_arena(RunDir(request.out), request)
    check_outcomes_possible(request, runs, _plan(request, runs, baseline))
    made = not request.out.exists()
    prepare_directory(request.out, "folder for the arena")
    try:
        with stage_lock(request.out, STAGE):
            return _run(request, engine_factory, runs, baseline, started)
    except BaseException:
        if made:
            _remove_if_empty(request.out)
        raise


def _remove_if_empty(folder: Path) -> None:
    """A folder this call made, when it holds nothing (empty folders such as a reply cache never written to)."""
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink() and not any(entry.iterdir()):
            entry.rmdir()
    if not any(folder.iterdir()):
        folder.rmdir()


class _AnnouncedStore(BattleStore):
    """``battles.jsonl`` that runs ``announce`` once, just before this call's first battle is stored."""

    def __init__(self, out: Path, announce: Callable[[], None]) -> None:
        super().__init__(out)
        self._announce: Callable[[], None] | None = announce

    def announce(self) -> None:
        if self._announce is not None:
            announce, self._announce = self._announce, None
            announce()

    def append(self, records: Iterable[BattleRecord]) -> int:
        batch = list(records)
        if batch:
            self.announce()
        return super().append(batch)


def _run(
    request: ArenaRequest,
    engine_factory: Callable[[], Any] | None,
    runs: Sequence[ArenaRun],
    baseline: ArenaRun | None,
    started: str,
) -> dict[str, Any]:
    out = RunDir(request.out)
    # Checked again under the lock: another arena may have stored battles since the checks before it.
    check_same_arena(out, request)
    plan = _plan(request, runs, baseline)
    check_outcomes_possible(request, runs, plan)
    settings = _judge_settings(request, out, plan)

    def announce() -> None:
        # The mode and the runs go in the manifest before the first battle: an interrupted arena says what it
        # played; stored battles to be played again are set aside only now, when a new one is about to take over.
        out.update_manifest(stage=STAGE, status="running", **_manifest_fields(request, runs, started))
        store.set_aside(plan.to_replace)

    store = _AnnouncedStore(request.out, announce)
    records = {key: record for key, record in plan.records.items() if key not in plan.to_replace}
    done = set(records)
    chosen = plan.chosen
    played = 0
    judge_summary = None
    if request.by == "verdicts":
        store.announce()  # verdict battles cannot fail past the checks above; changed ones are replaced here
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
            pending,
            request.template,
            settings,
            engine_factory,
            request.out,
            store,
            request.show_progress,
            log_every=request.log_every,
        )
        played = judge_summary.judged + judge_summary.unparsed
        store.announce()  # nothing was asked (all stored): the manifest still records this call
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
            f"{request.out / BATTLES}: no battle has an outcome yet ({len(records)} battle records, "
            f"{unparsed} unparsed; a judged battle needs both orders parsed, a verdict battle a turn judged in both "
            f"runs){retry}"
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
        "baseline_path": baseline_path(request.baseline),
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
