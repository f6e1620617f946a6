"""Turn-synchronous generation: the scheduler behind ``sysbench-gpu generate`` (docs/generation.md).

All selected sessions advance together: every engine call holds one turn of every
session that still has one (``generation_plan.GenerationPlan.calls``): with
``--history model`` call *t* holds turn *t* of every SysBench session (the *t*-th
answered turn of every MT-Eval dialogue), each conversation carrying the model's *own*
earlier replies; with ``--history reference`` or ``single-turn`` no turn depends on
another, so everything goes in one call. The records of a call are appended to
``generations.jsonl`` as soon as it returns, so a kill loses at most the call in flight,
and a rerun with the same ``--out`` continues mid-session from the stored replies.

The scheduler only talks to the ``Engine`` protocol; engines are built lazily through
``engines.get_engine`` (in ``generate_cli``) so that importing this module stays cheap.
The message helpers live in ``messages`` and are re-exported here for existing callers.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping

from sysbench_gpu.ablations import DISTRACTORS_FILE, ablation_settings, check_ablation_compatible, write_distractors
from sysbench_gpu.data import Dataset, Session
from sysbench_gpu.engines.base import ChatMessage, Completion, Engine, SamplingSpec, chat_sessions
from sysbench_gpu.errors import SysbenchError, where
from sysbench_gpu.generation_plan import (
    HISTORY_MODES,
    GenerationPlan,
    missing_references,
    select_for_reference_history,
)
from sysbench_gpu.locks import stage_lock
from sysbench_gpu.messages import (
    SYSTEM_FOLD_SEPARATOR,
    conversation_for_turn,
    drop_oldest_turns,
    fit_to_context,
    fold_system_message,
)
from sysbench_gpu.runstore import GenerationRecord, Key, RunDir, utc_now, write_json_atomic

__all__ = [
    "GenerateSettings", "GenerateSummary", "TurnScheduler", "run_generation", "check_compatible",
    "conversation_for_turn", "fold_system_message", "drop_oldest_turns", "fit_to_context", "missing_references",
    "select_for_reference_history", "SYSTEM_FOLD_SEPARATOR", "HISTORY_MODES", "effective_max_tokens",
]

log = logging.getLogger(__name__)

STAGE = "generate"
OVERFLOW_POLICIES = ("error", "truncate-history", "skip")
# Manifest fields that must not change within one run directory (besides the ablation fields,
# ablations.ABLATION_FIELDS, checked first).
LOCKED_FIELDS = ("model", "engine", "sampling", "data_sha256", "system_message")


@dataclass(frozen=True)
class GenerateSettings:
    """What decides the content of the records; everything here goes into the manifest."""

    model: str  # as the user named it (e.g. "smollm2"), not the resolved path
    engine: str
    history: str = "model"  # model | reference | single-turn
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    on_overflow: str = "error"
    skip_missing_reference: bool = False
    distractor_turns: int = 0  # unrelated exchanges before user turn 1 (SysBench ablation)
    distractor_seed: int = 0

    def __post_init__(self) -> None:
        if self.history not in HISTORY_MODES:
            raise SysbenchError(f"--history must be one of {', '.join(HISTORY_MODES)}, got {self.history!r}")
        if self.on_overflow not in OVERFLOW_POLICIES:
            raise SysbenchError(f"--on-overflow must be one of {', '.join(OVERFLOW_POLICIES)}, got {self.on_overflow!r}")
        if self.distractor_turns < 0:
            raise SysbenchError(f"--distractor-turns must be 0 or more, got {self.distractor_turns}")

    def ablation(self) -> dict[str, Any]:
        """The manifest's ablation fields: history, distractor_turns, distractor_seed (null without distractors)."""
        return ablation_settings(self.history, self.distractor_turns, self.distractor_seed)

    def plan(self, dataset: Dataset) -> GenerationPlan:
        return GenerationPlan.for_dataset(dataset, self.history, self.distractor_turns, self.distractor_seed)


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


@dataclass
class CallStats:
    """Statistics of one engine call (one turn in model-history mode)."""

    turn: int | str  # the turn number (MT-Eval: answered-turn index), or "all" for a run's single call
    history: str
    requests: int
    wall_s: float
    prompt_tokens: int
    cached_prompt_tokens: int | None
    output_tokens: int
    finish_reasons: dict[str, int]
    skipped: int
    truncated: int
    started: str

    @property
    def output_tokens_per_s(self) -> float:
        return round(self.output_tokens / self.wall_s, 2) if self.wall_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["wall_s"] = round(self.wall_s, 3)
        out["output_tokens_per_s"] = self.output_tokens_per_s
        return out


@dataclass
class GenerateSummary:
    new_records: int
    skipped_records: int
    total_records: int
    calls: list[CallStats]
    skipped_sessions: list[int]


# ------------------------------------------------------------------ run directory checks


def _sampling_json(sampling: SamplingSpec) -> dict[str, Any]:
    return sampling.explicit()


def system_message_of(sessions: list[Session]) -> str | list[str] | None:
    """MT-Eval: the system message the run sends ("" for none; a list if dialogues differ); SysBench: None."""
    if not sessions or sessions[0].benchmark != "mteval":
        return None
    messages = sorted({s.system_prompt for s in sessions})
    return messages[0] if len(messages) == 1 else messages


def check_compatible(run_dir: RunDir, settings: GenerateSettings, dataset: Dataset) -> None:
    """A rerun into an existing run directory must ask for the same records; name the field that differs."""
    stored = run_dir.generations.read()
    section = run_dir.read_manifest().get("stages", {}).get(STAGE)
    if section is None:
        if stored:
            raise SysbenchError(
                f"{run_dir.generations.path}: holds {len(stored)} records that `generate` did not make "
                f"(no '{STAGE}' stage in {run_dir.manifest_path.name}); use a new --out"
            )
        return
    # One ablation per run directory: history, distractor turns and seed first.
    check_ablation_compatible(section, settings.ablation(), str(run_dir.manifest_path))
    wanted = {
        "model": settings.model,
        "engine": settings.engine,
        "sampling": _sampling_json(settings.sampling),
        "data_sha256": dataset.sha256,
        "system_message": system_message_of(list(dataset.sessions)),
    }
    for name in LOCKED_FIELDS:
        old, new = section.get(name), wanted[name]
        if name == "sampling" and isinstance(old, dict):
            for key in sorted(set(old) | set(new)):
                if old.get(key) != new.get(key):
                    raise SysbenchError(
                        f"{run_dir.manifest_path}: field 'sampling.{key}' was {old.get(key)!r} in this run, "
                        f"this command asks for {new.get(key)!r}; rerun with the same flags or use a new --out"
                    )
        elif old != new:
            raise SysbenchError(
                f"{run_dir.manifest_path}: field '{name}' was {old!r} in this run, this command asks for {new!r}; "
                "rerun with the same settings or use a new --out"
            )


def _merged_snapshot(run_dir: RunDir, dataset: Dataset, selected: list[Session]) -> list[Session]:
    """The run's sessions: those of an earlier invocation plus the newly selected ones, in file order."""
    wanted = {s.system_id for s in selected}
    if run_dir.sessions_path.exists():
        wanted |= {s.system_id for s in run_dir.load_sessions()}
    return [s for s in dataset.sessions if s.system_id in wanted]


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
    ) -> None:
        self.engine = engine
        self.run_dir = run_dir
        self.settings = settings
        self.sessions = sessions
        self.plan = plan or GenerationPlan(sessions[0].benchmark if sessions else "sysbench", settings.history)
        self.progress = progress
        self.writes = bool(getattr(engine, "is_primary", True))
        self.fold_system = not engine.supports_system_role()
        self.context_length = engine.context_length()
        self.reserve = effective_max_tokens(engine, settings.sampling)
        self.records: dict[Key, GenerationRecord] = run_dir.generations.read()
        self.calls: list[CallStats] = []
        self.previous_calls: list[dict[str, Any]] = _read_stats_calls(run_dir)
        self.new_records = 0
        self.new_skipped = 0

    # -- public ---------------------------------------------------------------------
    def run(self) -> None:
        calls = self.plan.calls(self.sessions)
        pending = [key for _, keys in calls for key in keys if key not in self.records]
        if not pending:
            log.info("nothing to generate: all %d turns already have records", len(self.records))
            return
        log.info("generating %d replies for %d sessions (history=%s%s)", len(pending), len(self.sessions),
                 self.settings.history,
                 f", {self.settings.distractor_turns} distractor turns" if self.settings.distractor_turns else "")
        from tqdm import tqdm

        by_id = {s.system_id: s for s in self.sessions}
        with tqdm(total=len(pending), desc="generate", unit="reply", disable=not (self.progress and self.writes)) as bar:
            for label, keys in calls:
                todo = [key for key in keys if key not in self.records]
                if not todo:
                    continue
                prepared = [self._prepare_turn(by_id[system_id], turn) for system_id, turn in todo]
                self._call_and_store(prepared, label=label)
                bar.update(len(prepared))

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

    def _call_and_store(self, prepared: list[Prepared], label: int | str) -> None:
        to_send = [p for p in prepared if not p.skipped]
        started = utc_now()
        clock = time.perf_counter()
        completions: list[Completion] = []
        if to_send:
            # The session id keeps a session on one data-parallel replica (its prefix cache),
            # whatever folding or truncation did to its messages.
            completions = list(chat_sessions(
                self.engine, [p.messages for p in to_send], self.settings.sampling,
                [str(p.session.system_id) for p in to_send],
            ))
            if len(completions) != len(to_send):
                raise SysbenchError(
                    f"engine {self.settings.engine} returned {len(completions)} completions for {len(to_send)} "
                    f"conversations (turn {label})"
                )
        wall = time.perf_counter() - clock
        by_key = {(p.session.system_id, p.turn): c for p, c in zip(to_send, completions)}
        records = [self._record(p, by_key.get((p.session.system_id, p.turn))) for p in prepared]
        if self.writes:
            self.run_dir.generations.append(records, existing=set(self.records))
        for record in records:
            self.records[record.key] = record
        self.new_records += len(records)
        self.new_skipped += sum(r.status != "ok" for r in records)
        self._add_stats(label, records, completions, wall, started)

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
                response=None, status="skipped", prompt_tokens=prepared.prompt_tokens,
                extra={"skip_reason": prepared.skip_reason}, **base,
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

    def _add_stats(self, label: int | str, records: list[GenerationRecord], completions: list[Completion],
                   wall: float, started: str) -> None:
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
        )
        self.calls.append(stats)
        log.info(
            "%s %s: %d requests, %.2f s, %d prompt tokens%s, %d output tokens, %.1f output tok/s, finish %s%s",
            "answered turn" if self.plan.benchmark == "mteval" and label != "all" else "turn",
            label, stats.requests, stats.wall_s, stats.prompt_tokens,
            f" ({stats.cached_prompt_tokens} cached)" if stats.cached_prompt_tokens is not None else "",
            stats.output_tokens, stats.output_tokens_per_s,
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
            },
        )


def _read_stats_calls(run_dir: RunDir) -> list[dict[str, Any]]:
    from sysbench_gpu.jsonio import read_json

    if not run_dir.stats_path.exists():
        return []
    stats = read_json(run_dir.stats_path, expect=dict)
    return list(stats.get("calls", [])) if stats.get("stage") == STAGE else []


def effective_max_tokens(engine: Engine, sampling: SamplingSpec) -> int:
    """Output tokens to reserve in the context: the explicit flag, else the engine's default, else 0."""
    if sampling.max_tokens is not None:
        return sampling.max_tokens
    described = engine.describe()
    value = (described.get("defaults") or {}).get("max_tokens", described.get("max_tokens"))
    return int(value) if isinstance(value, int) else 0


def run_generation(
    engine: Engine,
    dataset: Dataset,
    sessions: list[Session],
    run_dir: RunDir | str,
    settings: GenerateSettings,
    *,
    engine_options: Mapping[str, Any] | None = None,
    progress: bool = True,
    lock: bool = True,
) -> GenerateSummary:
    """Generate every missing (session, turn) of ``sessions`` into ``run_dir``; resumable.

    ``lock``: hold the stage lock of ``run_dir`` (primary only) for the call; False when the caller holds it.
    """
    run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    with stage_lock(run_dir.path, STAGE, enabled=lock and bool(getattr(engine, "is_primary", True))):
        return _run_generation_locked(engine, dataset, sessions, run_dir, settings, engine_options, progress)


def _run_generation_locked(
    engine: Engine,
    dataset: Dataset,
    sessions: list[Session],
    run_dir: RunDir,
    settings: GenerateSettings,
    engine_options: Mapping[str, Any] | None,
    progress: bool,
) -> GenerateSummary:
    check_compatible(run_dir, settings, dataset)
    plan = settings.plan(dataset)
    skipped_sessions: list[int] = []
    if settings.history == "reference":
        sessions, skipped_sessions = select_for_reference_history(sessions, settings.skip_missing_reference)
    if not sessions:
        raise SysbenchError(f"{dataset.path}: no sessions selected")
    scheduler = TurnScheduler(engine, run_dir, settings, sessions, progress=progress, plan=plan)
    writes = scheduler.writes
    if writes:
        run_dir.path.mkdir(parents=True, exist_ok=True)
        snapshot = _merged_snapshot(run_dir, dataset, sessions)
        run_dir.write_sessions(snapshot, dataset)
        if settings.distractor_turns:
            write_distractors(run_dir.path / DISTRACTORS_FILE, {s.system_id: plan.distractors(s) for s in snapshot},
                              settings.distractor_turns, settings.distractor_seed)
        described = engine.describe()
        run_dir.update_manifest(
            STAGE,
            status="running",
            model=settings.model,
            engine=settings.engine,
            benchmark=dataset.benchmark,
            task=sessions[0].task if dataset.benchmark == "mteval" else None,
            system_message=system_message_of(list(dataset.sessions)),
            **settings.ablation(),
            distractors_file=DISTRACTORS_FILE if settings.distractor_turns else None,
            sampling=_sampling_json(settings.sampling),
            data_sha256=dataset.sha256,
            engine_options=dict(engine_options or {}),
            engine_describe=described,
            sampling_defaults=described.get("defaults"),
            max_tokens_reserved=scheduler.reserve,
            context_length=scheduler.context_length,
            on_overflow=settings.on_overflow,
            skip_missing_reference=settings.skip_missing_reference,
            skipped_sessions_missing_reference=skipped_sessions,
            system_folded=scheduler.fold_system,
            system_fold_separator=SYSTEM_FOLD_SEPARATOR if scheduler.fold_system else None,
            started=utc_now(),
        )
    scheduler.run()
    wanted = {(s.system_id, turn) for s in sessions for turn in plan.answered(s)}
    done = [r for k, r in scheduler.records.items() if k in wanted]
    summary = GenerateSummary(
        new_records=scheduler.new_records,
        skipped_records=sum(r.status != "ok" for r in done),
        total_records=len(done),
        calls=scheduler.calls,
        skipped_sessions=skipped_sessions,
    )
    if writes:
        if not run_dir.stats_path.exists():
            scheduler.write_stats()
        run_dir.update_manifest(
            STAGE,
            status="complete",
            finished=utc_now(),
            n_sessions=len(sessions),
            n_records=summary.total_records,
            n_skipped_records=summary.skipped_records,
        )
    return summary


