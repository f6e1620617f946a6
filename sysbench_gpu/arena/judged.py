"""Battles decided by a judge model, asked through the judge stage's own machinery.

Each pair of replies is asked twice, once in each order. A question is a
``benchmarks.judge_tasks.JudgeTask`` with the arena's reply format, so the judge stage's
attempt loop, temperature schedule, retries, reply cache, ledger and batched local backends
(``judging.rounds``) do the asking; only where a finished answer goes differs: into
``battles.jsonl`` (:class:`BattleRecorder`) instead of a run's ``judgments.jsonl``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sysbench_gpu.arena.battles import BattleKey, BattleRecord, BattleStore, battle_turns
from sysbench_gpu.arena.fingerprint import conversation, of_judged
from sysbench_gpu.arena.prompt import SCORE_OF, ArenaReply, ArenaTemplate, render
from sysbench_gpu.arena.runs import ArenaRun
from sysbench_gpu.benchmarks.judge_tasks import JudgeTask
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.progress import DEFAULT_LOG_EVERY, ProgressLog, quiet_library_bars
from sysbench_gpu.core.records import JudgmentRecord
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.judging.cache import JudgeCache
from sysbench_gpu.judging.ledger import JudgeLedger, estimate_cost, estimate_tokens
from sysbench_gpu.judging.rounds import (
    JudgeSettings,
    JudgeSummary,
    Recorder,
    cache_lookup,
    judge_tasks_api,
    judge_tasks_batched,
)

SCORE_KIND = "arena"  # one guided-decoding schema for every pairwise task


@dataclass(frozen=True)
class ArenaTask(JudgeTask):
    """A pairwise question. ``system_id`` holds the question's index in this call (the judge's
    records carry only it back); ``what`` names the battle in the ledger and in errors."""

    what: str = ""

    @property
    def label(self) -> str:
        return self.what


@dataclass(frozen=True)
class Question:
    a: ArenaRun
    b: ArenaRun
    system_id: int
    turn: int
    order: str

    @property
    def key(self) -> BattleKey:
        return (self.a.key, self.b.key, self.system_id, self.turn, self.order)


def questions(pairs: Sequence[tuple[ArenaRun, ArenaRun]], done: set[BattleKey]) -> list[Question]:
    """Every (pair, turn, order) not yet in ``battles.jsonl``."""
    pending = []
    for a, b in pairs:
        for system_id, turn in battle_turns(a, b):
            for order in ("ab", "ba"):
                question = Question(a, b, system_id, turn, order)
                if question.key not in done:
                    pending.append(question)
    return pending


def tasks_for(pending: Sequence[Question], template: ArenaTemplate) -> list[ArenaTask]:
    tasks = []
    for index, q in enumerate(pending):
        session = q.a.session(q.system_id)
        first, second = conversation(q.a, q.system_id, q.turn), conversation(q.b, q.system_id, q.turn)
        if q.order == "ba":
            first, second = second, first
        tasks.append(
            ArenaTask(
                system_id=index,
                turn=q.turn,
                prompt=render(template, session.system_prompt, first, second),
                constraints=(),
                template_sha256=template.sha256,
                score_kind=SCORE_KIND,
                reply=ArenaReply(),
                what=f"{q.a.name} vs {q.b.name}, session {q.system_id}, turn {q.turn}, order {q.order}",
            )
        )
    return tasks


def battle_of(question: Question, record: JudgmentRecord) -> BattleRecord:
    """The judge's record, in runs: the choice by position turned into a winner a, b or tie."""
    answer = None
    winner = ""
    if record.parse_status == "ok" and record.score is not None:
        answer = {score: name for name, score in SCORE_OF.items()}[record.score]
        by_position = {"A": "a", "B": "b", "tie": "tie"}[answer]
        winner = by_position if question.order == "ab" or by_position == "tie" else {"a": "b", "b": "a"}[by_position]
    failures = record.extra.get("failures") if isinstance(record.extra, dict) else None
    return BattleRecord(
        a=question.a.key,
        b=question.b.key,
        system_id=question.system_id,
        turn=question.turn,
        order=question.order,
        winner=winner,
        by="judge",
        model_a=question.a.name,
        model_b=question.b.name,
        reason=record.reasoning if winner else "; ".join(failures or ["unparsed"]),
        answer=answer,
        status="ok" if winner else "unparsed",
        len_a=len(question.a.reply((question.system_id, question.turn)) or ""),
        len_b=len(question.b.reply((question.system_id, question.turn)) or ""),
        judge_model=record.judge_model,
        template_sha256=record.template_hash,
        raw_reply=record.raw_reply,
        attempts=record.attempts,
        fingerprint_a=of_judged(question.a, question.system_id, question.turn),
        fingerprint_b=of_judged(question.b, question.system_id, question.turn),
    )


class BattleRecorder(Recorder):
    """The judge's finished records go to ``battles.jsonl``; the ledger and cache work as for the judge stage."""

    def __init__(
        self,
        out: Path,
        ledger: JudgeLedger,
        summary: JudgeSummary,
        cache: JudgeCache | None,
        pending: Sequence[Question],
        store: BattleStore,
    ) -> None:
        super().__init__(RunDir(out), ledger, summary, cache, writes=True)
        self.pending = pending
        self.store = store

    def write(self, records: Iterable[JudgmentRecord]) -> None:
        battles = [battle_of(self.pending[r.system_id], r) for r in records]
        if not battles:
            return
        self.store.append(battles)
        for battle in battles:
            if battle.status == "ok":
                self.summary.judged += 1
            else:
                self.summary.unparsed += 1
        self.ledger.save()


def judge_questions(
    pending: Sequence[Question],
    template: ArenaTemplate,
    settings: JudgeSettings,
    engine_factory: Callable[[], Any],
    out: Path,
    store: BattleStore,
    show_progress: bool = True,
    log_every: float = DEFAULT_LOG_EVERY,
) -> JudgeSummary:
    """Ask every pending question; each answer is appended as it comes (an interrupted arena resumes).

    ``show_progress``: a bar on a terminal, else a line every ``log_every`` seconds (``core.progress``).
    """
    summary = JudgeSummary()
    if not pending:
        return summary
    tasks = tasks_for(pending, template)
    cache = JudgeCache(settings.cache_dir) if settings.cache_dir is not None else None
    if cache is not None:
        cache.check_writable()
    ledger = JudgeLedger.load(out, settings.model)
    recorder = BattleRecorder(out, ledger, summary, cache, pending, store)
    before = ledger.current()
    quiet_library_bars(force=not show_progress)
    engine = engine_factory()
    try:
        with ProgressLog("arena judge", len(tasks), "battle", log_every=log_every, enabled=show_progress) as progress:
            recorder.progress = progress  # prompts sent and cache hits, counted as replies arrive
            if settings.backend == "openai":
                judge_tasks_api(tasks, engine, settings, cache, recorder, progress)
            else:
                judge_tasks_batched(tasks, engine, settings, cache, recorder, progress)
    finally:
        engine.close()
    after = ledger.current()
    summary.requests = after.requests - before.requests
    summary.cache_hits = after.cache_hits - before.cache_hits
    ledger.save()
    if summary.api_errors:
        raise SysbenchError(
            f"{out}: the arena's judging stopped after an API error that outlived its retries "
            f"({summary.api_errors[0]}); finished battles are saved; rerun the same command to resume"
        )
    return summary


def dry_run(pending: Sequence[Question], template: ArenaTemplate, settings: JudgeSettings) -> dict[str, Any]:
    """What judging would send: requests (first attempts not in the cache), tokens and cost; nothing is sent."""
    tasks = tasks_for(pending, template)
    cache = JudgeCache(settings.cache_dir) if settings.cache_dir is not None else None
    to_send = [t for t in tasks if cache_lookup(cache, settings, t, settings.sampling(0, t), 0)[1] is None]
    prompt_tokens = sum(estimate_tokens(t.prompt) for t in to_send)
    completion_tokens = 60 * len(to_send)  # a short reason and the choice; a rough guess
    return {
        "questions": len(tasks),
        "answered_from_cache": len(tasks) - len(to_send),
        "requests": len(to_send),
        "estimated_prompt_tokens": prompt_tokens,
        "estimated_completion_tokens": completion_tokens,
        "estimated_cost_usd": estimate_cost(settings.model, prompt_tokens, completion_tokens)
        if settings.backend == "openai"
        else 0.0,
        "note": f"first attempts only; each parse failure adds a request (up to {settings.max_retries} per question)",
    }
