"""Turn-synchronous generation: the scheduler behind ``sysbench-gpu generate`` (docs/generation.md).

All selected sessions advance together: every engine call holds one turn of every
session that still has one (``generation.plan.GenerationPlan.calls``): with
``--history model`` call *t* holds turn *t* of every SysBench session (the *t*-th
answered turn of every MT-Eval dialogue), each conversation carrying the model's *own*
earlier replies; with ``--history reference`` or ``single-turn`` no turn depends on
another, so everything goes in one call. The records of a call are appended to
``generations.jsonl`` as soon as it returns, so a kill loses at most the call in flight,
and a rerun with the same ``--out`` continues mid-session from the stored replies.

The scheduler only talks to the ``Engine`` protocol; engines are built lazily through
``engines.get_engine`` (in ``generation.cli``) so that importing this module stays cheap.
The message helpers live in ``core.messages`` and the settings in ``generation.settings``;
both are re-exported here for existing callers.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from sysbench_gpu.benchmarks.registry import benchmark_of
from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError, where
from sysbench_gpu.core.messages import (
    SYSTEM_FOLD_SEPARATOR,
    conversation_for_turn,
    drop_oldest_turns,
    fit_to_context,
    fold_system_message,
)
from sysbench_gpu.core.progress import DEFAULT_LOG_EVERY, ProgressLog
from sysbench_gpu.core.records import GenerationRecord, Key
from sysbench_gpu.core.run_stats import read_stats
from sysbench_gpu.core.rundir import RunDir, utc_now, write_json_atomic
from sysbench_gpu.core.sessions import Session
from sysbench_gpu.engines.base import Completion, Engine, SamplingSpec, chat_sessions
from sysbench_gpu.generation.plan import (
    ALL_IN_ONE_CALL,
    HISTORY_MODES,
    GenerationPlan,
    missing_references,
    select_for_reference_history,
)
from sysbench_gpu.generation.settings import (
    STAGE,
    CallStats,
    GenerateSettings,
    GenerateSummary,
    check_compatible,
    replica_requests,
)

__all__ = [
    "GenerateSettings",
    "GenerateSummary",
    "TurnScheduler",
    "check_compatible",
    "conversation_for_turn",
    "fold_system_message",
    "drop_oldest_turns",
    "fit_to_context",
    "missing_references",
    "select_for_reference_history",
    "SYSTEM_FOLD_SEPARATOR",
    "HISTORY_MODES",
    "effective_max_tokens",
]

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """One conversation after the over-length policy: ready to send, or skipped."""

    session: Session
    turn: int
    messages: list[ChatMessage]
    prompt_tokens: int | None
    overflow: str | None = None  # None | "truncated-history:<n>" | "skipped"
    skip_reason: str | None = None

    @property
    def skipped(self) -> bool:
        return self.skip_reason is not None


# ------------------------------------------------------------------ run directory checks


# ------------------------------------------------------------------ the scheduler


class TurnScheduler:
    """Runs the engine over the selected sessions and writes records, stats and manifest as it goes."""

    def __init__(
        self,
        engine: Engine,
        run_dir: RunDir,
        settings: GenerateSettings,
        sessions: list[Session],
        progress: bool = True,
        plan: GenerationPlan | None = None,
        log_every: float = DEFAULT_LOG_EVERY,
    ) -> None:
        self.engine = engine
        self.run_dir = run_dir
        self.settings = settings
        self.sessions = sessions
        self.plan = plan or GenerationPlan(benchmark_of(sessions).name, settings.history)
        self.progress = progress
        self.log_every = log_every
        self.writes = bool(getattr(engine, "is_primary", True))
        self.fold_system = not engine.supports_system_role()
        self.context_length = engine.context_length()
        self.reserve = effective_max_tokens(engine, settings.sampling)
        self.records: dict[Key, GenerationRecord] = run_dir.generations.read()
        self.calls: list[CallStats] = []
        self.previous_calls: list[dict[str, Any]] = _read_stats_calls(run_dir)
        self.new_records = 0
        self.new_skipped = 0
        # This invocation's generation loop, first turn's preparation to last record written (stats.json).
        self.generation_loop: dict[str, Any] | None = None

    # -- public ---------------------------------------------------------------------
    def run(self) -> None:
        calls = self.plan.calls(self.sessions)
        pending = [key for _, keys in calls for key in keys if key not in self.records]
        if not pending:
            log.info("nothing to generate: all %d turns already have records", len(self.records))
            return
        log.info(
            "generating %d replies for %d sessions (history=%s%s)",
            len(pending),
            len(self.sessions),
            self.settings.history,
            f", {self.settings.distractor_turns} distractor turns" if self.settings.distractor_turns else "",
        )
        by_id = {s.system_id: s for s in self.sessions}
        loop_started, loop_clock = utc_now(), time.perf_counter()
        with ProgressLog(
            "generate",
            len(pending),
            "turn",
            log_every=self.log_every,
            enabled=self.progress and self.writes,
        ) as progress:
            for label, keys in calls:
                todo = [key for key in keys if key not in self.records]
                if not todo:
                    continue
                prepared = [self._prepare_turn(by_id[system_id], turn) for system_id, turn in todo]
                records = self._call_and_store(prepared, label=label)
                progress.update(len(prepared), tokens=sum(r.output_tokens or 0 for r in records))
        # Wall clock around the whole loop: unlike the calls' wall_s it holds each turn's chat-template
        # rendering and token counting and the record writes (what a head to head must time).
        self.generation_loop = {
            "started": loop_started,
            "wall_s": round(time.perf_counter() - loop_clock, 3),
            "calls": len(self.calls),
        }
        if self.writes:
            self.write_stats()

    # -- one turn's conversation --------------------------------------------------------
    def _prepare_turn(self, session: Session, turn: int) -> Prepared:
        earlier = {index: self.records.get((session.system_id, index)) for index in self.plan.depends_on(session, turn)}
        gap = [index for index, record in earlier.items() if record is None]
        if gap:
            raise SysbenchError(
                f"{where(self.run_dir.generations.path, session.system_id, turn)}: history turn {gap[0]} has no "
                "record (was the file edited?)"
            )
        skipped_before = [index for index, record in earlier.items() if record is not None and record.status != "ok"]
        if skipped_before:
            # Without that reply the history is incomplete: the rest of the session is skipped too.
            return Prepared(session, turn, [], None, None, f"history turn {skipped_before[0]} was skipped")
        replies = {index: record.response or "" for index, record in earlier.items() if record is not None}
        return self._prepare(session, turn, self.plan.messages(session, turn, replies))

    # -- shared steps ---------------------------------------------------------------------
    def _prepare(self, session: Session, turn: int, messages: list[ChatMessage]) -> Prepared:
        final, tokens, overflow, reason = fit_to_context(
            messages,
            count_tokens=self.engine.count_prompt_tokens,
            context_length=self.context_length,
            reserve=self.reserve,
            policy=self.settings.on_overflow,
            fold_system=self.fold_system,
            location=where(None, session.system_id, turn),
        )
        if overflow:
            log.warning("session %s, turn %s: %s", session.system_id, turn, overflow)
        return Prepared(session, turn, final, tokens, overflow, reason)

    def _call_and_store(self, prepared: list[Prepared], label: int | str) -> list[GenerationRecord]:
        to_send = [p for p in prepared if not p.skipped]
        started = utc_now()
        clock = time.perf_counter()
        completions: list[Completion] = []
        if to_send:
            # The session id keeps a session on one data-parallel replica (its prefix cache),
            # whatever folding or truncation did to its messages.
            completions = list(
                chat_sessions(
                    self.engine,
                    [p.messages for p in to_send],
                    self.settings.sampling,
                    [str(p.session.system_id) for p in to_send],
                )
            )
            if len(completions) != len(to_send):
                raise SysbenchError(
                    f"engine {self.settings.engine} returned {len(completions)} completions for {len(to_send)} "
                    f"conversations (turn {label})"
                )
        wall = time.perf_counter() - clock
        by_key = {(p.session.system_id, p.turn): c for p, c in zip(to_send, completions, strict=False)}
        records = [self._record(p, by_key.get((p.session.system_id, p.turn))) for p in prepared]
        if self.writes:
            self.run_dir.generations.append(records, existing=set(self.records))
        for record in records:
            self.records[record.key] = record
        self.new_records += len(records)
        self.new_skipped += sum(r.status != "ok" for r in records)
        self._add_stats(label, records, completions, wall, started)
        return records

    def _record(self, prepared: Prepared, completion: Completion | None) -> GenerationRecord:
        base = dict(
            system_id=prepared.session.system_id,
            turn=prepared.turn,
            user=prepared.session.turn(prepared.turn).user,
            history=self.settings.history,
            overflow=prepared.overflow,
            model=self.settings.model,
        )
        if completion is None:
            return GenerationRecord(
                response=None,
                status="skipped",
                prompt_tokens=prepared.prompt_tokens,
                extra={"skip_reason": prepared.skip_reason},
                **base,
            )
        return GenerationRecord(
            response=completion.text,
            status="ok",
            prompt_tokens=completion.prompt_tokens if completion.prompt_tokens is not None else prepared.prompt_tokens,
            output_tokens=completion.output_tokens,
            cached_prompt_tokens=completion.cached_prompt_tokens,
            finish_reason=completion.finish_reason,
            extra=dict(completion.extra),
            **base,
        )

    def _add_stats(
        self,
        label: int | str,
        records: list[GenerationRecord],
        completions: list[Completion],
        wall: float,
        started: str,
    ) -> None:
        cached = [c.cached_prompt_tokens for c in completions if c.cached_prompt_tokens is not None]
        stats = CallStats(
            turn=label,
            history=self.settings.history,
            requests=len(completions),
            wall_s=wall,
            prompt_tokens=sum(r.prompt_tokens or 0 for r in records if r.status == "ok"),
            cached_prompt_tokens=sum(cached) if cached else None,
            output_tokens=sum(c.output_tokens or 0 for c in completions),
            finish_reasons=dict(Counter(c.finish_reason or "unknown" for c in completions)),
            skipped=sum(r.status != "ok" for r in records),
            truncated=sum(bool(r.overflow and r.overflow.startswith("truncated")) for r in records),
            started=started,
            replica_requests=replica_requests(completions),
        )
        self.calls.append(stats)
        log.info(
            "%s %s: %d requests, %.2f s, %d prompt tokens%s, %d output tokens, %.1f output tok/s, finish %s%s",
            self.plan.protocol.call_unit if label != ALL_IN_ONE_CALL else "turn",
            label,
            stats.requests,
            stats.wall_s,
            stats.prompt_tokens,
            f" ({stats.cached_prompt_tokens} cached)" if stats.cached_prompt_tokens is not None else "",
            stats.output_tokens,
            stats.output_tokens_per_s,
            ", ".join(f"{k} {v}" for k, v in sorted(stats.finish_reasons.items())) or "-",
            f", {stats.skipped} skipped" if stats.skipped else "",
        )
        if self.writes:
            self.write_stats()

    def write_stats(self) -> None:
        calls = self.previous_calls + [c.to_json() for c in self.calls]
        wall = sum(c["wall_s"] for c in calls)
        output = sum(c["output_tokens"] for c in calls)
        cached = [c["cached_prompt_tokens"] for c in calls if c.get("cached_prompt_tokens") is not None]
        finish: Counter[str] = Counter()
        for c in calls:
            finish.update(c["finish_reasons"])
        write_json_atomic(
            self.run_dir.stats_path,
            {
                "stage": STAGE,
                "calls": calls,
                "totals": {
                    "calls": len(calls),
                    "requests": sum(c["requests"] for c in calls),
                    "wall_s": round(wall, 3),
                    "prompt_tokens": sum(c["prompt_tokens"] for c in calls),
                    "cached_prompt_tokens": sum(cached) if cached else None,
                    "output_tokens": output,
                    "output_tokens_per_s": round(output / wall, 2) if wall > 0 else 0.0,
                    "finish_reasons": dict(finish),
                    "skipped": sum(c["skipped"] for c in calls),
                    "truncated": sum(c["truncated"] for c in calls),
                },
                **({"generation_loop": self.generation_loop} if self.generation_loop else {}),
            },
        )


def effective_max_tokens(engine: Engine, sampling: SamplingSpec) -> int:
    """Output tokens to reserve in the context: the explicit flag, else the engine's default, else 0."""
    if sampling.max_tokens is not None:
        return sampling.max_tokens
    described = engine.describe()
    value = (described.get("defaults") or {}).get("max_tokens", described.get("max_tokens"))
    return int(value) if isinstance(value, int) else 0


def _read_stats_calls(run_dir: RunDir) -> list[dict[str, Any]]:
    if not run_dir.stats_path.exists():
        return []
    stats = read_stats(run_dir.stats_path)  # a damaged file: one error naming its field, before any work
    return list(stats["calls"]) if stats.get("stage") == STAGE else []
