"""The judge stage: verify every generated turn against its checklist.

``sysbench-gpu judge RUN_DIR --judge {openai,vllm,hf} --judge-model NAME`` fills
``judgments.jsonl`` for every generated turn that has no judgment yet (the command
line is ``judge_cli.py``), and ``sysbench-gpu judge agreement RUN_A RUN_B`` compares
two runs' verdicts (see ``agreement.py``). docs/judge.md describes the prompt,
parsing and retry rules.

Guarantees:

- Session metadata (system prompt, checklist, types) comes from the run's own
  ``sessions.json``; the history shown to the judge is the run's own earlier turns
  (the model's replies, or the references when the run was generated with
  reference history).
- Every generated turn ends with exactly one record: ``ok`` verdicts, ``unparsed``
  (every attempt failed; the last reply and the failure reasons are kept) or
  ``skipped`` (the turn has no response, so it is never judged as a pass).
- Replies are parsed without eval (``judge_parse``). Attempt ``i`` of ``n`` runs at
  temperature 0 while ``i < n / 2`` and at 0.5 after (upstream's schedule).
- Records are appended as they complete, replies are cached by content
  (``judge_cache``), so an interrupted run resumes without asking twice; every
  reply is counted in the ledger's journal before it is cached (``judge_ledger``),
  so it is counted exactly once, kill or no kill.
- One writer: the call holds the run's judge lock (``locks``); under torchrun only
  the primary rank writes anything.
- An API error that survives the engine's bounded retries stops the run cleanly:
  finished judgments stay, and the error names the session and turn.
"""

from __future__ import annotations

import logging
import sys
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from sysbench_gpu.data import Constraint, Session, SessionIds, select_sessions
from sysbench_gpu.engines.base import ChatMessage, Completion, SamplingSpec
from sysbench_gpu.errors import SysbenchError
from sysbench_gpu.judge_cache import CacheEntryError, CachedReply, JudgeCache, cache_key
from sysbench_gpu.judge_ledger import LEDGER, LEDGER_JOURNAL, JudgeLedger, PaidReply, estimate_cost, estimate_tokens
from sysbench_gpu.judge_parse import parse_reply
from sysbench_gpu.judge_prompt import HistoryMessage, JudgeTemplate, render_prompt, verdict_schema
from sysbench_gpu.judge_rejudge import RETRIED, set_aside_unparsed, unparsed_keys
from sysbench_gpu.locks import stage_lock
from sysbench_gpu.runstore import JUDGMENTS, MANIFEST, GenerationRecord, JudgmentRecord, RunDir, utc_now

log = logging.getLogger(__name__)

JUDGE_BACKENDS = ("openai", "vllm", "hf")
STAGE = "judge"
DEFAULT_MAX_RETRIES = 10
DEFAULT_MAX_TOKENS = 1024
RETRY_TEMPERATURES = (0.0, 0.5)  # first half of the attempts, second half


# ----------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class JudgeTask:
    """One (session, turn) to judge, with its rendered prompt."""

    system_id: int
    turn: int
    prompt: str
    constraints: tuple[Constraint, ...]

    @property
    def key(self) -> tuple[int, int]:
        return (self.system_id, self.turn)

    @property
    def label(self) -> str:
        return f"session {self.system_id}, turn {self.turn}"

    @property
    def numbers(self) -> tuple[int, ...]:
        return tuple(c.id for c in self.constraints)

    def messages(self) -> list[ChatMessage]:
        return [{"role": "user", "content": self.prompt}]


@dataclass
class JudgePlan:
    tasks: list[JudgeTask]
    skipped: list[JudgmentRecord]  # turns without a response, recorded as such
    already_judged: int
    not_generated: int  # turns of the chosen sessions with no generation record yet


def build_history(
    session: Session, turn_index: int, generations: dict[tuple[int, int], GenerationRecord], mode: str
) -> list[HistoryMessage]:
    """The earlier rounds as the model saw them: its own replies, or references in ``reference`` mode."""
    history: list[HistoryMessage] = []
    for earlier in session.turns[: turn_index - 1]:
        history.append(HistoryMessage("user", earlier.user))
        record = generations.get((session.system_id, earlier.index))
        generated = record.response if record is not None else None
        if mode == "reference" and earlier.reference is not None:
            reply = earlier.reference
        else:
            # Model history, or a reference the data lacks: what the model itself said.
            reply = generated if generated is not None else ""
        history.append(HistoryMessage("assistant", reply))
    return history


def plan_judging(
    sessions: Sequence[Session],
    generations: dict[tuple[int, int], GenerationRecord],
    judged: set[tuple[int, int]],
    template: JudgeTemplate,
    limit: int | None = None,
    judge_model: str | None = None,
    imported_history: str = "model",
    system_ids: Sequence[int] | None = None,
) -> JudgePlan:
    """Tasks for the first ``limit`` sessions; ``imported_history`` is the history mode of imported turns."""
    chosen = select_sessions(sessions, system_ids, limit, source="sessions.json of this run")
    tasks: list[JudgeTask] = []
    skipped: list[JudgmentRecord] = []
    already = not_generated = 0
    for session in chosen:
        for turn in session.turns:
            key = (session.system_id, turn.index)
            if key in judged:
                already += 1
                continue
            record = generations.get(key)
            if record is None:
                not_generated += 1
                continue
            if record.response is None or record.status != "ok":
                skipped.append(
                    JudgmentRecord(
                        system_id=session.system_id,
                        turn=turn.index,
                        verdicts={},
                        parse_status="skipped",
                        judge_model=judge_model,
                        template_hash=template.sha256,
                        attempts=0,
                        extra={"reason": f"generation status {record.status!r}, overflow {record.overflow!r}"},
                    )
                )
                continue
            mode = imported_history if record.history == "upstream" else record.history
            history = build_history(session, turn.index, generations, mode)
            prompt = render_prompt(template, session, turn.index, history, record.response)
            tasks.append(JudgeTask(session.system_id, turn.index, prompt, turn.constraints))
    return JudgePlan(tasks=tasks, skipped=skipped, already_judged=already, not_generated=not_generated)


def imported_history_mode(run: RunDir) -> str:
    """How an imported run's model saw earlier turns (``import-upstream`` records it per run)."""
    section = run.read_manifest().get("stages", {}).get("import", {})
    mode = section.get("history")
    return mode if mode in ("model", "reference") else "model"


def temperature_for(attempt: int, max_retries: int) -> float:
    """Upstream's schedule: attempts (0-based) in the first half at 0, the rest at 0.5."""
    return RETRY_TEMPERATURES[0] if attempt < max_retries / 2 else RETRY_TEMPERATURES[1]


# ----------------------------------------------------------------------------- judging


@dataclass
class JudgeSettings:
    backend: str  # openai | vllm | hf
    model: str
    template: JudgeTemplate
    max_retries: int = DEFAULT_MAX_RETRIES
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    seed: int | None = None
    max_reasoning_chars: int | None = 2000  # guided decoding only
    cache_dir: Path | None = None  # None: no cache
    concurrency: int = 8
    retry_round: int = 0  # > 0 after --retry-unparsed: new cache keys, so failed questions are asked anew

    def sampling(self, attempt: int, numbers: Sequence[int] | None = None) -> SamplingSpec:
        schema = None
        if self.backend == "vllm" and numbers is not None:
            schema = verdict_schema(numbers, self.template.language, self.max_reasoning_chars)
        return SamplingSpec(
            max_tokens=self.max_tokens,
            temperature=temperature_for(attempt, self.max_retries),
            seed=self.seed,
            json_schema=schema,
        )


@dataclass
class _TaskState:
    """What the attempts of one task have produced so far."""

    task: JudgeTask
    attempts: int = 0
    failures: list[str] = field(default_factory=list)
    last_reply: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_replies: int = 0
    record: JudgmentRecord | None = None

    def take(self, reply: Completion | CachedReply, from_cache: bool, settings: JudgeSettings) -> bool:
        """Parse one reply; True when the task is done (a record was made)."""
        self.attempts += 1
        self.last_reply = reply.text
        self.prompt_tokens += reply.prompt_tokens or 0
        self.output_tokens += reply.output_tokens or 0
        self.cached_replies += int(from_cache)
        parsed = parse_reply(reply.text, self.task.constraints)
        if parsed.ok:
            self.record = self._record(settings, "ok", parsed.verdicts, parsed.reasoning, repaired=parsed.repaired)
            return True
        reason = parsed.error or "unparsable"
        if reply.finish_reason == "length":
            reason += " (reply cut at max_tokens)"
        self.failures.append(f"attempt {self.attempts}: {reason}")
        if self.attempts >= settings.max_retries:
            self.record = self._record(settings, "unparsed", {}, None)
            return True
        return False

    def give_up(self, settings: JudgeSettings, reason: str) -> None:
        self.failures.append(reason)
        self.record = self._record(settings, "unparsed", {}, None)

    def _record(self, settings: JudgeSettings, status: str, verdicts: dict, reasoning: str | None, repaired: bool = False) -> JudgmentRecord:
        extra: dict[str, Any] = {
            "judge": settings.backend,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
        }
        if self.failures:
            extra["failures"] = list(self.failures)
        if self.cached_replies:
            extra["cached_replies"] = self.cached_replies
        if repaired:
            extra["repaired_json"] = True
        return JudgmentRecord(
            system_id=self.task.system_id,
            turn=self.task.turn,
            verdicts=verdicts,
            parse_status=status,
            reasoning=reasoning,
            judge_model=settings.model,
            template_hash=settings.template.sha256,
            raw_reply=self.last_reply,
            attempts=self.attempts,
            extra=extra,
        )


@dataclass
class JudgeSummary:
    judged: int = 0
    unparsed: int = 0
    skipped: int = 0
    already_judged: int = 0
    not_generated: int = 0
    requests: int = 0
    cache_hits: int = 0
    retried_unparsed: int = 0  # unparsed records set aside by --retry-unparsed
    api_errors: list[str] = field(default_factory=list)


class _Recorder:
    """Where finished work goes: records, the ledger and the cache; nothing at all when ``writes`` is False.

    ``paid`` counts replies in the ledger's journal *before* caching them, so a
    cached reply has always been counted (see ``judge_ledger``).
    """

    def __init__(
        self, run: RunDir, ledger: JudgeLedger, summary: JudgeSummary, cache: JudgeCache | None, writes: bool
    ) -> None:
        self.run = run
        self.ledger = ledger
        self.summary = summary
        self.cache = cache
        self.writes = writes

    def write(self, records: Iterable[JudgmentRecord]) -> None:
        """Append finished records (main thread only)."""
        records = list(records)
        if not records:
            return
        if self.writes:
            self.run.judgments.append(records)
        for record in records:
            if record.parse_status == "ok":
                self.summary.judged += 1
            elif record.parse_status == "unparsed":
                self.summary.unparsed += 1
            elif record.parse_status == "skipped":
                self.summary.skipped += 1
        self.ledger.save()

    def paid(self, arrived: Sequence[tuple[JudgeTask, int, str | None, CachedReply]]) -> None:
        """Replies that just came back, as (task, attempt, cache key, reply): counted, then cached."""
        self.ledger.paid([PaidReply(r.prompt_tokens, r.output_tokens, t.label, attempt) for t, attempt, _, r in arrived])
        if self.writes and self.cache is not None:
            for _, _, key, reply in arrived:
                if key is not None:
                    self.cache.put(key, reply)

    def hits(self, count: int) -> None:
        self.ledger.cache_hits(count)


def _cache_lookup(cache: JudgeCache | None, settings: JudgeSettings, task: JudgeTask, sampling: SamplingSpec, attempt: int) -> tuple[str | None, CachedReply | None]:
    if cache is None:
        return None, None
    key = cache_key(
        settings.backend,
        settings.model,
        settings.template.sha256,
        task.prompt,
        {**sampling.explicit(), "attempt": attempt, **({"retry_round": settings.retry_round} if settings.retry_round else {})},
    )
    return key, cache.get(key)


def _to_cached(completion: Completion) -> CachedReply:
    return CachedReply(
        text=completion.text,
        prompt_tokens=completion.prompt_tokens,
        output_tokens=completion.output_tokens,
        finish_reason=completion.finish_reason,
    )


def judge_tasks_api(
    tasks: Sequence[JudgeTask],
    engine: Any,
    settings: JudgeSettings,
    cache: JudgeCache | None,
    recorder: _Recorder,
    progress: Any = None,
) -> None:
    """One task per worker thread (bounded), each running its own attempt loop via ``chat_one``."""

    def run_one(task: JudgeTask) -> tuple[_TaskState, SysbenchError | None]:
        state = _TaskState(task)
        try:
            _attempts(task, state)
        except CacheEntryError:
            raise  # not a request that failed: stop the run and name the file
        except SysbenchError as error:
            return state, error
        return state, None

    def _attempts(task: JudgeTask, state: _TaskState) -> None:
        while state.record is None:
            attempt = state.attempts
            sampling = settings.sampling(attempt, task.numbers)
            key, cached = _cache_lookup(cache, settings, task, sampling, attempt)
            if cached is None:
                completion = engine.chat_one(task.messages(), sampling, request_id=task.label)
                cached = _to_cached(completion)
                recorder.paid([(task, attempt, key, cached)])
                state.take(cached, False, settings)
            else:
                recorder.hits(1)
                state.take(cached, True, settings)

    queue = list(tasks)
    running: dict[Future, JudgeTask] = {}
    failed = False
    with ThreadPoolExecutor(max_workers=max(1, settings.concurrency), thread_name_prefix="judge") as pool:
        while queue or running:
            while queue and not failed and len(running) < settings.concurrency:
                task = queue.pop(0)
                running[pool.submit(run_one, task)] = task
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                task = running.pop(future)
                state, error = future.result()
                if error is not None:
                    # Bounded retries are spent: start nothing new, let running tasks finish.
                    # The turn gets no record, so a rerun asks again (earlier replies come from the cache).
                    recorder.summary.api_errors.append(f"{task.label}: {error}")
                    failed = True
                    recorder.ledger.save()
                    continue
                recorder.write([state.record])
                if progress is not None:
                    progress.update(1)
            if failed:
                queue.clear()


def judge_tasks_batched(
    tasks: Sequence[JudgeTask],
    engine: Any,
    settings: JudgeSettings,
    cache: JudgeCache | None,
    recorder: _Recorder,
    progress: Any = None,
) -> None:
    """Local judges: every pending prompt in one ``engine.chat`` per round (per schema on vllm)."""
    states = [_TaskState(task) for task in tasks]
    pending = _drop_overlong(states, engine, settings, recorder, progress)
    for attempt in range(settings.max_retries):
        if not pending:
            break
        replies: dict[int, tuple[CachedReply, bool]] = {}
        to_ask: dict[tuple[int, ...] | None, list[tuple[int, str | None]]] = {}
        for index, state in enumerate(pending):
            sampling = settings.sampling(attempt, state.task.numbers)
            key, cached = _cache_lookup(cache, settings, state.task, sampling, attempt)
            if cached is not None:
                replies[index] = (cached, True)
            else:
                # Guided decoding needs one schema per call: group by checklist numbers.
                group = state.task.numbers if sampling.json_schema is not None else None
                to_ask.setdefault(group, []).append((index, key))
        for group, members in to_ask.items():
            sampling = settings.sampling(attempt, group)
            log.info("judge round %d: %d prompt(s) at temperature %s", attempt + 1, len(members), sampling.temperature)
            completions = engine.chat([pending[i].task.messages() for i, _ in members], sampling)
            if len(completions) != len(members):
                raise SysbenchError(f"{settings.backend} engine returned {len(completions)} replies for {len(members)} prompts")
            arrived = []
            for (index, key), completion in zip(members, completions):
                reply = _to_cached(completion)
                replies[index] = (reply, False)
                arrived.append((pending[index].task, attempt, key, reply))
            recorder.paid(arrived)
        recorder.hits(sum(1 for _, from_cache in replies.values() if from_cache))
        still: list[_TaskState] = []
        finished: list[JudgmentRecord] = []
        for index, state in enumerate(pending):
            reply, from_cache = replies[index]
            if state.take(reply, from_cache, settings):
                finished.append(state.record)
            else:
                still.append(state)
        recorder.write(finished)
        if progress is not None:
            progress.update(len(finished))
        pending = still


def _drop_overlong(states: list[_TaskState], engine: Any, settings: JudgeSettings, recorder: _Recorder, progress: Any) -> list[_TaskState]:
    """Prompts that cannot fit the local judge's context are recorded unparsed, not truncated."""
    context = engine.context_length()
    if not context:
        return states
    room = settings.max_tokens or 0
    keep: list[_TaskState] = []
    too_long: list[JudgmentRecord] = []
    for state in states:
        tokens = engine.count_prompt_tokens(state.task.messages())
        if tokens is not None and tokens + room > context:
            state.give_up(settings, f"judge prompt of {tokens} tokens + max_tokens {room} exceeds the context of {context}")
            too_long.append(state.record)
        else:
            keep.append(state)
    recorder.write(too_long)
    if progress is not None and too_long:
        progress.update(len(too_long))
    return keep


def _check_consistent(existing: dict, settings: JudgeSettings, run: RunDir) -> None:
    """Refuse to mix judges or templates inside one run's judgments."""
    for record in existing.values():
        if record.parse_status in ("imported", "skipped") or record.judge_model is None:
            continue
        if record.judge_model != settings.model or (record.template_hash and record.template_hash != settings.template.sha256):
            raise SysbenchError(
                f"{run.judgments.path}: session {record.system_id}, turn {record.turn} was judged by "
                f"{record.judge_model!r} with template {str(record.template_hash)[:12]}; this run asks "
                f"{settings.model!r} with template {settings.template.sha256[:12]}. "
                "Use --rejudge --out NEW_RUN_DIR to judge with another judge."
            )


def judge_run(
    run: RunDir,
    settings: JudgeSettings,
    engine_factory: Callable[[], Any],
    limit: int | None = None,
    show_progress: bool = True,
    system_ids: SessionIds | Sequence[int] | None = None,
    retry_unparsed: bool = False,
    *,
    primary: bool = True,
    lock: bool = True,
) -> JudgeSummary:
    """Judge every pending turn of ``run``; the engine is built only when there is work.

    ``retry_unparsed`` first sets the chosen sessions' ``unparsed`` records aside
    (into ``judgments.retried.jsonl``) and asks those turns again under a new cache
    round, so the replies that failed are not replayed from the cache.

    Only a primary process writes (records, ledger, cache, manifest): ``primary``
    is False on the non-primary ranks of a torchrun launch, and an engine whose
    ``is_primary`` is False makes it so too. Nothing is written before the engine
    is built, so every rank plans from the same files. ``lock``: hold the judge's
    stage lock of ``run`` for the call (False when the caller holds it already).
    """
    run.require()
    with stage_lock(run.path, STAGE, enabled=lock and primary):
        return _judge_run(run, settings, engine_factory, limit, show_progress, system_ids, retry_unparsed, primary)


def _judge_run(
    run: RunDir,
    settings: JudgeSettings,
    engine_factory: Callable[[], Any],
    limit: int | None,
    show_progress: bool,
    system_ids: SessionIds | Sequence[int] | None,
    retry_unparsed: bool,
    primary: bool,
) -> JudgeSummary:
    sessions = run.load_sessions()
    generations = run.generations.read()
    existing = run.judgments.read()
    _check_consistent(existing, settings, run)
    retry: set[tuple[int, int]] = set()
    if retry_unparsed:
        chosen = {s.system_id for s in select_sessions(sessions, system_ids, limit, source=run.sessions_path)}
        retry = unparsed_keys(run, chosen)
        if retry:
            previous = run.stage_section(STAGE).get("retry_rounds", 0)
            settings = replace(settings, retry_round=int(previous) + 1)
            existing = {k: r for k, r in existing.items() if k not in retry}
    plan = plan_judging(
        sessions, generations, set(existing), settings.template, limit, settings.model, imported_history_mode(run), system_ids
    )
    cache = JudgeCache(settings.cache_dir) if settings.cache_dir is not None else None
    ledger = JudgeLedger.load(run.path, settings.model, writes=False)
    if primary:
        # Before a model loads or a request is paid for: can every file of this stage be written?
        run.ensure_writable([JUDGMENTS, LEDGER, LEDGER_JOURNAL, RETRIED, MANIFEST])
        if cache is not None:
            cache.check_writable()
    engine = engine_factory() if plan.tasks else None
    writes = primary and bool(getattr(engine, "is_primary", True))
    summary = JudgeSummary(already_judged=plan.already_judged, not_generated=plan.not_generated)
    if writes:
        summary.retried_unparsed = set_aside_unparsed(run, retry)
        ledger.start_writing()
    recorder = _Recorder(run, ledger, summary, cache, writes)
    started = utc_now()
    before = ledger.current()
    engine_info: dict[str, Any] = {}
    try:
        recorder.write(plan.skipped)
        if engine is not None:
            if writes:
                run.update_manifest(stage=STAGE, status="running", started=started)
            from tqdm import tqdm

            shown = show_progress and writes
            with tqdm(total=len(plan.tasks), desc="judge", unit="turn", file=sys.stderr, disable=not shown) as bar:
                if settings.backend == "openai":
                    judge_tasks_api(plan.tasks, engine, settings, cache, recorder, bar)
                else:
                    judge_tasks_batched(plan.tasks, engine, settings, cache, recorder, bar)
            engine_info = engine.describe()
    finally:
        if engine is not None:
            engine.close()
    after = ledger.current()
    summary.requests = after.requests - before.requests
    summary.cache_hits = after.cache_hits - before.cache_hits
    if writes:
        ledger.save()
        _write_manifest(run, settings, summary, engine_info, started, limit, system_ids, ledger)
        if retry:
            run.update_manifest(stage=STAGE, retry_rounds=settings.retry_round)
    if summary.api_errors:
        first = summary.api_errors[0]
        raise SysbenchError(
            f"{run.path}: judging stopped after an API error that outlived its retries ({first}); "
            f"{summary.judged + summary.unparsed} turn(s) finished in this call are saved; rerun the same command to resume"
        )
    return summary


def _write_manifest(
    run: RunDir,
    settings: JudgeSettings,
    summary: JudgeSummary,
    engine_info: dict,
    started: str,
    limit: int | None,
    system_ids: SessionIds | Sequence[int] | None,
    ledger: JudgeLedger,
) -> None:
    judgments = run.judgments.read()
    statuses: dict[str, int] = {}
    for record in judgments.values():
        statuses[record.parse_status] = statuses.get(record.parse_status, 0) + 1
    fields: dict[str, Any] = {
        "status": "stopped" if summary.api_errors else "complete",
        "backend": settings.backend,
        "judge_model": settings.model,
        "template": {
            "name": settings.template.name,
            "language": settings.template.language,
            "sha256": settings.template.sha256,
        },
        "max_retries": settings.max_retries,
        "temperature_schedule": f"attempt i of n at {RETRY_TEMPERATURES[0]} while i < n/2, else {RETRY_TEMPERATURES[1]}",
        "max_tokens": settings.max_tokens,
        "seed": settings.seed,
        "guided_decoding": settings.backend == "vllm",
        "max_reasoning_chars": settings.max_reasoning_chars if settings.backend == "vllm" else None,
        "cache_dir": str(settings.cache_dir) if settings.cache_dir is not None else None,
        "limit_sessions": limit,
        "system_ids": list(system_ids) if system_ids is not None else None,
        "last_call": {"started": started, "finished": utc_now(), **asdict(summary)},
        "judgments_by_status": statuses,
        "ledger": ledger.summary(),
    }
    if engine_info:
        fields["engine"] = engine_info
    run.update_manifest(stage=STAGE, **fields)


# ----------------------------------------------------------------------------- dry run


def dry_run_report(
    run: RunDir, settings: JudgeSettings, limit: int | None, fresh: bool = False, system_ids: SessionIds | Sequence[int] | None = None
) -> dict[str, Any]:
    """What judging would send, without building an engine or sending anything.

    ``fresh``: as for a ``--rejudge`` copy, which starts with no judgments.
    """
    run.require()
    sessions = run.load_sessions()
    generations = run.generations.read()
    existing = {} if fresh else run.judgments.read()
    plan = plan_judging(
        sessions, generations, set(existing), settings.template, limit, settings.model, imported_history_mode(run), system_ids
    )
    cache = JudgeCache(settings.cache_dir) if settings.cache_dir is not None else None
    to_send = [t for t in plan.tasks if _cache_lookup(cache, settings, t, settings.sampling(0, t.numbers), 0)[1] is None]
    prompt_tokens = sum(estimate_tokens(t.prompt) for t in to_send)
    # A reply: some reasoning per item plus the verdict map; a rough guess, said as such.
    completion_tokens = sum(80 + 60 * len(t.constraints) for t in to_send)
    return {
        "run": str(run.path),
        "judge": settings.backend,
        "judge_model": settings.model,
        "template_sha256": settings.template.sha256,
        "turns_to_judge": len(plan.tasks),
        "answered_from_cache": len(plan.tasks) - len(to_send),
        "requests": len(to_send),
        "turns_skipped_no_response": len(plan.skipped),
        "turns_already_judged": plan.already_judged,
        "turns_not_generated": plan.not_generated,
        "estimated_prompt_tokens": prompt_tokens,
        "estimated_completion_tokens": completion_tokens,
        "estimated_cost_usd": estimate_cost(settings.model, prompt_tokens, completion_tokens)
        if settings.backend == "openai"
        else 0.0,
        "note": f"first attempts only; each parse failure adds a request (up to {settings.max_retries} per turn)",
    }
