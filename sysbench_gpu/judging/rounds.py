"""Asking the judge: settings, the attempt loop of one turn, and where finished work goes.

Two ways to ask, one set of rules:

- ``judge_tasks_api`` (openai): one worker per turn, at most ``concurrency`` at once,
  each running its own attempt loop through ``engine.chat_one``;
- ``judge_tasks_batched`` (vllm, hf): every pending prompt in one ``engine.chat`` per
  round, grouped by guided-decoding schema (vllm and hf constrain the reply to it).

Both read each reply with the reply format the benchmark gave the task (a SysBench
checklist reply, an MT-Eval 1-10 score: ``benchmarks.judge_tasks.ReplyFormat``), retry a reply that
does not parse on upstream's temperature schedule, record ``unparsed`` when every attempt
fails, count every reply in the ledger's journal before caching it, and append each
record as soon as its turn is done.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.judge_tasks import JudgeTask
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.records import JUDGE_SCORER, JudgmentRecord
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.engines.base import Completion, SamplingSpec
from sysbench_gpu.judging.cache import (
    CachedReply,
    CacheEntryError,
    JudgeCache,
    cache_key,
)
from sysbench_gpu.judging.ledger import JudgeLedger, PaidReply

log = logging.getLogger(__name__)

DEFAULT_MAX_RETRIES = 10
DEFAULT_MAX_TOKENS = 1024
RETRY_TEMPERATURES = (0.0, 0.5)  # first half of the attempts, second half
GUIDED_BACKENDS = ("vllm", "hf")  # local judges whose engine holds the reply to its JSON schema


def temperature_for(attempt: int, max_retries: int) -> float:
    """Upstream's schedule: attempts (0-based) in the first half at 0, the rest at 0.5."""
    return RETRY_TEMPERATURES[0] if attempt < max_retries / 2 else RETRY_TEMPERATURES[1]


# ----------------------------------------------------------------------------- judging


@dataclass
class JudgeSettings:
    backend: str  # openai | vllm | hf
    model: str
    template: Any  # the benchmark's judge template from --template (SysBench's checklist); None if it has none
    max_retries: int = DEFAULT_MAX_RETRIES
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    seed: int | None = None
    max_reasoning_chars: int | None = 2000  # guided decoding (vllm, hf) only
    cache_dir: Path | None = None  # None: no cache
    concurrency: int = 8
    retry_round: int = 0  # > 0 after --retry-unparsed: new cache keys, so failed questions are asked anew
    # MT-Eval's 1-10 judge: template by kind (refinement, expansion, follow-up); empty: the built-in ones
    score_templates: Mapping[str, Any] = field(default_factory=dict)

    def template_hashes(self) -> set[str]:
        """The hashes of every template this judge may have used (records name theirs)."""
        return {t.sha256 for t in (self.template, *self.score_templates.values()) if t is not None}

    @property
    def guided_decoding(self) -> bool:
        """True when the judge's engine constrains each reply to the task's JSON schema."""
        return self.backend in GUIDED_BACKENDS

    def sampling(self, attempt: int, task: JudgeTask | None = None) -> SamplingSpec:
        """Sampling of ``attempt``; on vllm and hf with the JSON schema of ``task``'s reply (guided decoding)."""
        schema = None
        if self.guided_decoding and task is not None and task.reply is not None:
            schema = task.reply.schema(self.max_reasoning_chars)
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
        if self.task.reply is None:
            raise SysbenchError(f"{self.task.label}: the benchmark planned no reply format for this task")
        read = self.task.reply.read(reply.text)
        if read.ok:
            self.record = self._record(
                settings, "ok", dict(read.verdicts), read.reasoning, repaired=read.repaired, score=read.score
            )
            return True
        reason = read.error or "unparsable"
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

    def _record(
        self,
        settings: JudgeSettings,
        status: str,
        verdicts: dict,
        reasoning: str | None,
        repaired: bool = False,
        score: float | None = None,
    ) -> JudgmentRecord:
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
            template_hash=self.task.template_sha256,
            raw_reply=self.last_reply,
            attempts=self.attempts,
            extra=extra,
            score=score,
            scorer="judge" if self.task.score_kind is not None else None,
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
    scored_by_rule: int = 0  # turns scored by a benchmark's rule (no judge asked)
    api_errors: list[str] = field(default_factory=list)


class Recorder:
    """Where finished work goes: records, the ledger and the cache; nothing at all when ``writes`` is False.

    ``paid`` counts replies in the ledger's journal *before* caching them, so a
    cached reply has always been counted (see ``judging.ledger``). ``progress``: where the
    prompts sent and the cache hits are also counted for the progress lines (``core.progress``).
    """

    progress: Any = None

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
            if record.parse_status == "ok" and record.scorer not in (None, JUDGE_SCORER):  # a rule
                self.summary.scored_by_rule += 1
            elif record.parse_status == "ok":
                self.summary.judged += 1
            elif record.parse_status == "unparsed":
                self.summary.unparsed += 1
            elif record.parse_status == "skipped":
                self.summary.skipped += 1
        self.ledger.save()

    def paid(self, arrived: Sequence[tuple[JudgeTask, int, str | None, CachedReply]]) -> None:
        """Replies that just came back, as (task, attempt, cache key, reply): counted, then cached."""
        self.ledger.paid(
            [PaidReply(r.prompt_tokens, r.output_tokens, t.label, attempt) for t, attempt, _, r in arrived]
        )
        if self.writes and self.cache is not None:
            for _, _, key, reply in arrived:
                if key is not None:
                    self.cache.put(key, reply)
        if self.progress is not None:
            self.progress.update(0, prompts=len(arrived))

    def hits(self, count: int) -> None:
        self.ledger.cache_hits(count)
        if self.progress is not None and count:
            self.progress.update(0, cache_hits=count)


def cache_lookup(
    cache: JudgeCache | None, settings: JudgeSettings, task: JudgeTask, sampling: SamplingSpec, attempt: int
) -> tuple[str | None, CachedReply | None]:
    if cache is None:
        return None, None
    key = cache_key(
        settings.backend,
        settings.model,
        task.template_sha256,
        task.prompt,
        {
            **sampling.explicit(),
            "attempt": attempt,
            **({"retry_round": settings.retry_round} if settings.retry_round else {}),
        },
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
    recorder: Recorder,
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
            sampling = settings.sampling(attempt, task)
            key, cached = cache_lookup(cache, settings, task, sampling, attempt)
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
    recorder: Recorder,
    progress: Any = None,
) -> None:
    """Local judges: every pending prompt in one ``engine.chat`` per round (per schema under guided decoding)."""
    states = [_TaskState(task) for task in tasks]
    pending = _drop_overlong(states, engine, settings, recorder, progress)
    for attempt in range(settings.max_retries):
        if not pending:
            break
        replies: dict[int, tuple[CachedReply, bool]] = {}
        to_ask: dict[tuple[Any, ...] | None, list[tuple[int, str | None]]] = {}
        for index, state in enumerate(pending):
            sampling = settings.sampling(attempt, state.task)
            key, cached = cache_lookup(cache, settings, state.task, sampling, attempt)
            if cached is not None:
                replies[index] = (cached, True)
            else:
                # Guided decoding needs one schema per call: group by checklist numbers (or the score schema).
                group = state.task.schema_group if sampling.json_schema is not None else None
                to_ask.setdefault(group, []).append((index, key))
        for group, members in to_ask.items():
            # Every member of a group has the same schema: the first one stands for all.
            sampling = settings.sampling(attempt, pending[members[0][0]].task if group is not None else None)
            log.info("judge round %d: %d prompt(s) at temperature %s", attempt + 1, len(members), sampling.temperature)
            completions = engine.chat([pending[i].task.messages() for i, _ in members], sampling)
            if len(completions) != len(members):
                raise SysbenchError(
                    f"{settings.backend} engine returned {len(completions)} replies for {len(members)} prompts"
                )
            arrived = []
            for (index, key), completion in zip(members, completions, strict=False):
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


def _drop_overlong(
    states: list[_TaskState], engine: Any, settings: JudgeSettings, recorder: Recorder, progress: Any
) -> list[_TaskState]:
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
            state.give_up(
                settings, f"judge prompt of {tokens} tokens + max_tokens {room} exceeds the context of {context}"
            )
            too_long.append(state.record)
        else:
            keep.append(state)
    recorder.write(too_long)
    if progress is not None and too_long:
        progress.update(len(too_long))
    return keep
