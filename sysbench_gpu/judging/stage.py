"""The judge stage: verify every generated turn against its checklist, or score it (MT-Eval).

``sysbench-gpu judge RUN_DIR --judge {openai,vllm,hf} --judge-model NAME`` fills
``judgments.jsonl`` for every generated turn that has no judgment yet (the command
line is ``judging.cli``), and ``sysbench-gpu judge agreement RUN_A RUN_B`` compares
two runs' verdicts (see ``benchmarks.sysbench.agreement``). docs/judge.md describes the prompt,
parsing and retry rules. The work is split by job: ``benchmarks.sysbench.judge_plan``
(what to ask), ``judging.rounds`` (asking: attempts, ledger, cache, records), this module
(the stage: lock, consistency, manifest, dry run). MT-Eval runs are planned by
``benchmarks.mteval.scoring``: 1-10 judge tasks go through the same rounds, rule-scored
turns need no judge at all (``judge RUN`` with no judge options scores them).

Guarantees:

- Session metadata (system prompt, checklist, types) comes from the run's own
  ``sessions.json``; the history shown to the judge is the run's own earlier turns
  (the model's replies, or the references when the run was generated with
  reference history; none for a single-turn run).
- Every generated turn ends with exactly one record: ``ok`` verdicts (or an MT-Eval
  score), ``unparsed`` (every attempt failed; the last reply and the failure reasons
  are kept) or ``skipped`` (the turn has no response, so it is never judged as a pass).
- Replies are parsed without eval (``benchmarks.sysbench.judge_parse``,
  ``benchmarks.mteval.judge_prompt``). Attempt ``i`` of ``n`` runs at temperature 0
  while ``i < n / 2`` and at 0.5 after (upstream's schedule).
- Records are appended as they complete, replies are cached by content
  (``judging.cache``), so an interrupted run resumes without asking twice; every
  reply is counted in the ledger's journal before it is cached (``judging.ledger``),
  so it is counted exactly once, kill or no kill.
- One writer: the call holds the run's judge lock (``core.locks``); under torchrun only
  the primary rank writes anything.
- An API error that survives the engine's bounded retries stops the run cleanly:
  finished judgments stay, and the error names the session and turn.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

from sysbench_gpu.benchmarks.judge_tasks import NEEDS_JUDGE, JudgePlan, JudgeTask
from sysbench_gpu.benchmarks.registry import benchmark_of, get_benchmark, load_run_sessions
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.locks import stage_lock
from sysbench_gpu.core.progress import DEFAULT_LOG_EVERY, ProgressLog, quiet_library_bars
from sysbench_gpu.core.rundir import JUDGMENTS, MANIFEST, RunDir, utc_now
from sysbench_gpu.core.sessions import Session, SessionIds, select_sessions
from sysbench_gpu.judging.cache import JudgeCache
from sysbench_gpu.judging.ledger import (
    LEDGER,
    LEDGER_JOURNAL,
    JudgeLedger,
    estimate_cost,
    estimate_tokens,
)
from sysbench_gpu.judging.rejudge import RETRIED, set_aside_unparsed, unparsed_keys
from sysbench_gpu.judging.rounds import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_MAX_TOKENS,
    RETRY_TEMPERATURES,
    JudgeSettings,
    JudgeSummary,
    Recorder,
    cache_lookup,
    judge_tasks_api,
    judge_tasks_batched,
    temperature_for,
)

__all__ = [
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_MAX_TOKENS",
    "JUDGE_BACKENDS",
    "LEDGER",
    "STAGE",
    "JudgePlan",
    "JudgeSettings",
    "JudgeSummary",
    "JudgeTask",
    "dry_run_report",
    "judge_run",
    "temperature_for",
]

JUDGE_BACKENDS = ("openai", "vllm", "hf")
STAGE = "judge"


def _check_consistent(existing: dict, settings: JudgeSettings, run: RunDir) -> None:
    """Refuse to mix judges or templates inside one run's judgments."""
    allowed = settings.template_hashes()
    for record in existing.values():
        if record.parse_status in ("imported", "skipped") or record.judge_model is None:
            continue
        if record.judge_model != settings.model or (record.template_hash and record.template_hash not in allowed):
            # An MT-Eval record was made by one of the 1-10 templates, a SysBench one by the checklist template.
            asked = (
                settings.template.sha256[:12]
                if record.scorer is None and settings.template
                else "/".join(sorted(t.sha256[:12] for t in settings.score_templates.values()))
            )
            raise SysbenchError(
                f"{run.judgments.path}: session {record.system_id}, turn {record.turn} was judged by "
                f"{record.judge_model!r} with template {str(record.template_hash)[:12]}; this run asks "
                f"{settings.model!r} with template {asked}. "
                "Use --rejudge --out NEW_RUN_DIR to judge with another judge."
            )


def plan_run(
    run: RunDir,
    sessions: Sequence[Session],
    judged: set[tuple[int, int]],
    settings: JudgeSettings | None,
    limit: int | None,
    system_ids: SessionIds | Sequence[int] | None,
    generations: dict | None = None,
    options: Mapping[str, Any] | None = None,
) -> JudgePlan:
    """The plan for this run's benchmark (SysBench checklists, MT-Eval scores by judge and rules).

    ``settings`` None (no judge options) is fine where every pending turn is rule-scored;
    otherwise the benchmark says in one line what needs the judge.
    """
    generations = run.generations.read() if generations is None else generations
    benchmark = benchmark_of(sessions).configured(options or {})
    return benchmark.plan_judging(run, sessions, generations, judged, settings, limit, system_ids)


def judge_run(
    run: RunDir,
    settings: JudgeSettings | None,
    engine_factory: Callable[[], Any] | None,
    limit: int | None = None,
    show_progress: bool = True,
    system_ids: SessionIds | Sequence[int] | None = None,
    retry_unparsed: bool = False,
    *,
    primary: bool = True,
    lock: bool = True,
    options: Mapping[str, Any] | None = None,
    log_every: float = DEFAULT_LOG_EVERY,
) -> JudgeSummary:
    """Judge every pending turn of ``run``; the engine is built only when there is work.

    ``settings`` and ``engine_factory`` None: no judge model, for MT-Eval runs whose
    turns are scored by rules (recollection); anything that needs a judge is refused.

    ``retry_unparsed`` first sets the chosen sessions' ``unparsed`` records aside
    (into ``judgments.retried.jsonl``) and asks those turns again under a new cache
    round, so the replies that failed are not replayed from the cache.

    Only a primary process writes (records, ledger, cache, manifest): ``primary``
    is False on the non-primary ranks of a torchrun launch, and an engine whose
    ``is_primary`` is False makes it so too. Nothing is written before the engine
    is built, so every rank plans from the same files. ``lock``: hold the judge's
    stage lock of ``run`` for the call (False when the caller holds it already). ``options``: the
    benchmark's judge options (``Benchmark.judge_options``), None where not given. ``show_progress``: a
    bar on a terminal, else a line every ``log_every`` seconds (``core.progress``).
    """
    run.require()
    with stage_lock(run.path, STAGE, enabled=lock and primary):
        return _judge_run(
            run,
            settings,
            engine_factory,
            limit,
            show_progress,
            system_ids,
            retry_unparsed,
            primary,
            options or {},
            log_every,
        )


def _judge_run(
    run: RunDir,
    settings: JudgeSettings | None,
    engine_factory: Callable[[], Any] | None,
    limit: int | None,
    show_progress: bool,
    system_ids: SessionIds | Sequence[int] | None,
    retry_unparsed: bool,
    primary: bool,
    options: Mapping[str, Any],
    log_every: float = DEFAULT_LOG_EVERY,
) -> JudgeSummary:
    sessions = load_run_sessions(run)
    settings = benchmark_of(sessions).configured(options).judge_settings(settings)
    generations = run.generations.read()
    existing = run.judgments.read()
    if settings is not None:
        _check_consistent(existing, settings, run)
    retry: set[tuple[int, int]] = set()
    if retry_unparsed:
        chosen = {s.system_id for s in select_sessions(sessions, system_ids, limit, source=run.sessions_path)}
        retry = unparsed_keys(run, chosen)
        if retry and settings is None:
            raise SysbenchError(f"--retry-unparsed asks the judge again: pass {NEEDS_JUDGE}")
        if retry and settings is not None:
            previous = run.stage_section(STAGE).get("retry_rounds", 0)
            settings = replace(settings, retry_round=int(previous) + 1)
            existing = {k: r for k, r in existing.items() if k not in retry}
    plan = plan_run(run, sessions, set(existing), settings, limit, system_ids, generations, options)
    cache = JudgeCache(settings.cache_dir) if settings is not None and settings.cache_dir is not None else None
    ledger = JudgeLedger.load(run.path, settings.model if settings is not None else "", writes=False)
    if primary:
        # Before a model loads or a request is paid for: can every file of this stage be written?
        run.ensure_writable([JUDGMENTS, LEDGER, LEDGER_JOURNAL, RETRIED, MANIFEST])
        if cache is not None:
            cache.check_writable()
    if plan.tasks and engine_factory is not None:
        quiet_library_bars(force=not show_progress)
    engine = engine_factory() if plan.tasks and engine_factory is not None else None
    writes = primary and bool(getattr(engine, "is_primary", True))
    summary = JudgeSummary(already_judged=plan.already_judged, not_generated=plan.not_generated)
    if writes:
        summary.retried_unparsed = set_aside_unparsed(run, retry)
        if settings is not None:
            ledger.start_writing()
    recorder = Recorder(run, ledger, summary, cache, writes)
    started = utc_now()
    before = ledger.current()
    engine_info: dict[str, Any] = {}
    try:
        recorder.write(plan.finished())
        if engine is not None and settings is not None:
            if writes:
                run.update_manifest(stage=STAGE, status="running", started=started)
            shown = show_progress and writes
            # Prompts sent and cache hits are counted by the recorder as replies arrive (core.progress).
            with ProgressLog("judge", len(plan.tasks), "turn", log_every=log_every, enabled=shown) as progress:
                recorder.progress = progress
                if settings.backend == "openai":
                    judge_tasks_api(plan.tasks, engine, settings, cache, recorder, progress)
                else:
                    judge_tasks_batched(plan.tasks, engine, settings, cache, recorder, progress)
            engine_info = engine.describe()
    finally:
        if engine is not None:
            engine.close()
    after = ledger.current()
    summary.requests = after.requests - before.requests
    summary.cache_hits = after.cache_hits - before.cache_hits
    if writes:
        ledger.save()
        if settings is not None:
            _write_manifest(run, settings, summary, engine_info, started, limit, system_ids, ledger, plan)
        else:
            _write_rules_manifest(run, summary, started, limit, system_ids, plan)
        if retry and settings is not None:
            run.update_manifest(stage=STAGE, retry_rounds=settings.retry_round)
    if summary.api_errors:
        first = summary.api_errors[0]
        raise SysbenchError(
            f"{run.path}: judging stopped after an API error that outlived its retries ({first}); "
            f"{summary.judged + summary.unparsed} turn(s) finished in this call are saved; rerun the same command to "
            "resume"
        )
    return summary


def _statuses(run: RunDir) -> tuple[dict[str, int], list[str]]:
    """Judgments by parse status, and the scorers of the run's scored records."""
    statuses: dict[str, int] = {}
    scorers: set[str] = set()
    for record in run.judgments.read().values():
        statuses[record.parse_status] = statuses.get(record.parse_status, 0) + 1
        if record.scorer is not None:
            scorers.add(record.scorer)
    return statuses, sorted(scorers)


def _write_manifest(
    run: RunDir,
    settings: JudgeSettings,
    summary: JudgeSummary,
    engine_info: dict,
    started: str,
    limit: int | None,
    system_ids: SessionIds | Sequence[int] | None,
    ledger: JudgeLedger,
    plan: JudgePlan,
) -> None:
    statuses, scorers = _statuses(run)
    fields: dict[str, Any] = {
        "status": "stopped" if summary.api_errors else "complete",
        "backend": settings.backend,
        "judge_model": settings.model,
    }
    fields.update(get_benchmark(plan.benchmark).judge_manifest(settings, plan, scorers))
    fields.update(
        {
            "max_retries": settings.max_retries,
            "temperature_schedule": (
                f"attempt i of n at {RETRY_TEMPERATURES[0]} while i < n/2, else {RETRY_TEMPERATURES[1]}"
            ),
            "max_tokens": settings.max_tokens,
            "seed": settings.seed,
            "guided_decoding": settings.guided_decoding,
            "max_reasoning_chars": settings.max_reasoning_chars if settings.guided_decoding else None,
            "cache_dir": str(settings.cache_dir) if settings.cache_dir is not None else None,
            "limit_sessions": limit,
            "system_ids": list(system_ids) if system_ids is not None else None,
            "last_call": {"started": started, "finished": utc_now(), **asdict(summary)},
            "judgments_by_status": statuses,
            "ledger": ledger.summary(),
        }
    )
    if engine_info:
        fields["engine"] = engine_info
    run.update_manifest(stage=STAGE, **fields)


def _write_rules_manifest(
    run: RunDir,
    summary: JudgeSummary,
    started: str,
    limit: int | None,
    system_ids: SessionIds | Sequence[int] | None,
    plan: JudgePlan,
) -> None:
    """An MT-Eval run scored by rules alone; an earlier judge's backend and model are left as they are."""
    statuses, scorers = _statuses(run)
    section = run.stage_section(STAGE)
    fields: dict[str, Any] = {
        "status": "complete",
        "scorers": scorers,
        "score_scale": "rule-scored turns 0 or 10",
        "limit_sessions": limit,
        "system_ids": list(system_ids) if system_ids is not None else None,
        "last_call": {"started": started, "finished": utc_now(), **asdict(summary)},
        "judgments_by_status": statuses,
        **plan.options,
    }
    if "backend" not in section:
        fields.update(backend="rules", judge_model=None)
    run.update_manifest(stage=STAGE, **fields)


# ----------------------------------------------------------------------------- dry run


def dry_run_report(
    run: RunDir,
    settings: JudgeSettings | None,
    limit: int | None,
    fresh: bool = False,
    system_ids: SessionIds | Sequence[int] | None = None,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What judging would send, without building an engine or sending anything.

    ``fresh``: as for a ``--rejudge`` copy, which starts with no judgments.
    """
    run.require()
    sessions = load_run_sessions(run)
    settings = benchmark_of(sessions).configured(options or {}).judge_settings(settings)
    existing = {} if fresh else run.judgments.read()
    plan = plan_run(run, sessions, set(existing), settings, limit, system_ids, options=options)
    cache = JudgeCache(settings.cache_dir) if settings is not None and settings.cache_dir is not None else None
    to_send = [
        t
        for t in plan.tasks
        if settings is not None and cache_lookup(cache, settings, t, settings.sampling(0, t), 0)[1] is None
    ]
    prompt_tokens = sum(estimate_tokens(t.prompt) for t in to_send)
    # A reply: some reasoning per item plus the verdict map (or a rationale and a score); a rough guess, said as such.
    completion_tokens = sum(150 if t.score_kind else 80 + 60 * len(t.constraints) for t in to_send)
    backend = settings.backend if settings is not None else "rules"
    model = settings.model if settings is not None else None
    return {
        "run": str(run.path),
        "judge": backend,
        "judge_model": model,
        "template_sha256": plan.template_sha256 if settings is not None else None,
        "turns_to_judge": len(plan.tasks),
        "turns_scored_by_rule": len(plan.ruled),
        "answered_from_cache": len(plan.tasks) - len(to_send),
        "requests": len(to_send),
        "turns_skipped_no_response": len(plan.skipped),
        "turns_already_judged": plan.already_judged,
        "turns_not_generated": plan.not_generated,
        "estimated_prompt_tokens": prompt_tokens,
        "estimated_completion_tokens": completion_tokens,
        "estimated_cost_usd": estimate_cost(model, prompt_tokens, completion_tokens)
        if backend == "openai" and model is not None
        else 0.0,
        "note": f"first attempts only; each parse failure adds a request (up to {settings.max_retries} per turn)"
        if settings is not None
        else "rule-scored turns need no judge and cost nothing",
    }
