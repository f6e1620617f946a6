"""Turn-synchronous generation: ``sysbench-gpu generate`` (see docs/generation.md).

With ``--history model`` all selected sessions advance together: turn t of every
session is one ``engine.chat`` call whose conversations hold the system message, the
earlier user turns with the model's *own* earlier replies, and user turn t. The records
of a turn are appended to ``generations.jsonl`` as soon as the call returns, so a kill
loses at most the turn in flight, and a rerun with the same ``--out`` continues
mid-session from the stored replies. With ``--history reference`` the history of every
turn is the reference replies, so every turn of every session goes in a single call.

The scheduler only talks to the ``Engine`` protocol; engines are built lazily through
``engines.get_engine`` so that importing this module stays cheap.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from sysbench_gpu.data import Dataset, Session, load_dataset, parse_session_ids
from sysbench_gpu.engines.base import ChatMessage, Completion, Engine, SamplingSpec, chat_sessions
from sysbench_gpu.errors import SysbenchError, where
from sysbench_gpu.locks import is_primary_rank, stage_lock
from sysbench_gpu.runstore import GENERATIONS, GenerationRecord, Key, RunDir, utc_now, write_json_atomic

log = logging.getLogger(__name__)

STAGE = "generate"
HISTORY_MODES = ("model", "reference")
OVERFLOW_POLICIES = ("error", "truncate-history", "skip")
# Templates without a system role get "<system message><separator><first user message>".
SYSTEM_FOLD_SEPARATOR = "\n\n"
# Manifest fields that must not change within one run directory.
LOCKED_FIELDS = ("model", "engine", "history", "sampling", "data_sha256")


@dataclass(frozen=True)
class GenerateSettings:
    """What decides the content of the records; everything here goes into the manifest."""

    model: str  # as the user named it (e.g. "smollm2"), not the resolved path
    engine: str
    history: str = "model"
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    on_overflow: str = "error"
    skip_missing_reference: bool = False

    def __post_init__(self) -> None:
        if self.history not in HISTORY_MODES:
            raise SysbenchError(f"--history must be one of {', '.join(HISTORY_MODES)}, got {self.history!r}")
        if self.on_overflow not in OVERFLOW_POLICIES:
            raise SysbenchError(f"--on-overflow must be one of {', '.join(OVERFLOW_POLICIES)}, got {self.on_overflow!r}")


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

    turn: int | str  # the turn number, or "all" for a reference-history call
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


# ------------------------------------------------------------------ conversations


def conversation_for_turn(session: Session, turn: int, history: Mapping[int, str]) -> list[ChatMessage]:
    """System message, then user turns 1..turn-1 each followed by ``history[i]``, then user turn ``turn``."""
    messages: list[ChatMessage] = [{"role": "system", "content": session.system_prompt}]
    for index in range(1, turn):
        messages.append({"role": "user", "content": session.turn(index).user})
        messages.append({"role": "assistant", "content": history[index]})
    messages.append({"role": "user", "content": session.turn(turn).user})
    return messages


def fold_system_message(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """Merge a leading system message into the first user message, for templates without a system role."""
    if not messages or messages[0]["role"] != "system":
        return list(messages)
    system, rest = messages[0], list(messages[1:])
    for position, message in enumerate(rest):
        if message["role"] == "user":
            rest[position] = {"role": "user", "content": system["content"] + SYSTEM_FOLD_SEPARATOR + message["content"]}
            return rest
    return [{"role": "user", "content": system["content"]}] + rest


def drop_oldest_turns(messages: Sequence[ChatMessage], count: int) -> list[ChatMessage]:
    """Remove the ``count`` oldest user+assistant pairs; the system message and the last user turn stay."""
    head = [m for m in messages[:1] if m["role"] == "system"]
    body = list(messages[len(head) :])
    return head + body[2 * count :]


def fit_to_context(
    messages: list[ChatMessage],
    *,
    count_tokens: Callable[[Sequence[ChatMessage]], int | None],
    context_length: int | None,
    reserve: int,
    policy: str,
    fold_system: bool,
    location: str,
) -> tuple[list[ChatMessage], int | None, str | None, str | None]:
    """Apply the over-length policy; returns (messages to send, prompt tokens, overflow, skip reason).

    ``reserve`` is the number of output tokens the reply may take (max tokens). Truncation
    drops whole oldest turns, never the system message; a prompt that still does not fit
    without any history is skipped.
    """
    shape = fold_system_message if fold_system else list
    final = shape(messages)
    tokens = count_tokens(final)
    if tokens is None or context_length is None or tokens + reserve <= context_length:
        return final, tokens, None, None
    if policy == "error":
        raise SysbenchError(
            f"{location}: prompt of {tokens} tokens + {reserve} max tokens exceeds the model's context length "
            f"{context_length}; pass --on-overflow truncate-history or --on-overflow skip, or lower --max-tokens"
        )
    if policy == "skip":
        return final, tokens, "skipped", f"prompt of {tokens} + {reserve} tokens exceeds context {context_length}"
    history_turns = (len(messages) - (1 if messages and messages[0]["role"] == "system" else 0) - 1) // 2
    for dropped in range(1, history_turns + 1):
        final = shape(drop_oldest_turns(messages, dropped))
        tokens = count_tokens(final)
        if tokens is None or tokens + reserve <= context_length:
            return final, tokens, f"truncated-history:{dropped}", None
    return final, tokens, "skipped", (
        f"prompt of {tokens} + {reserve} tokens exceeds context {context_length} even without history"
    )


def missing_references(sessions: Iterable[Session]) -> dict[int, list[int]]:
    """Sessions whose reference replies needed as history (turns 1..n-1) are null, with those turns."""
    missing: dict[int, list[int]] = {}
    for session in sessions:
        turns = [turn.index for turn in session.turns[:-1] if turn.reference is None]
        if turns:
            missing[session.system_id] = turns
    return missing


# ------------------------------------------------------------------ run directory checks


def _sampling_json(sampling: SamplingSpec) -> dict[str, Any]:
    return sampling.explicit()


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
    wanted = {
        "model": settings.model,
        "engine": settings.engine,
        "history": settings.history,
        "sampling": _sampling_json(settings.sampling),
        "data_sha256": dataset.sha256,
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


def select_for_reference_history(sessions: list[Session], skip_missing: bool) -> tuple[list[Session], list[int]]:
    """Sessions usable with reference history; the rest are an error or, when asked, skipped."""
    missing = missing_references(sessions)
    if not missing:
        return sessions, []
    listing = "; ".join(f"session {sid}: turns {', '.join(map(str, turns))}" for sid, turns in missing.items())
    if not skip_missing:
        raise SysbenchError(
            f"--history reference needs the reference replies of earlier turns, and {len(missing)} of "
            f"{len(sessions)} sessions have null ones ({listing}); pass --skip-missing-reference to leave them out, "
            "or use --history model"
        )
    kept = [s for s in sessions if s.system_id not in missing]
    if not kept:
        raise SysbenchError(
            f"--skip-missing-reference leaves no session: all {len(sessions)} selected sessions lack a reference "
            "reply needed as history (the shared file keeps references for turns 1-2 only)"
        )
    log.warning("skipping %d sessions without reference replies: %s", len(missing), ", ".join(map(str, missing)))
    return kept, sorted(missing)


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
    ) -> None:
        self.engine = engine
        self.run_dir = run_dir
        self.settings = settings
        self.sessions = sessions
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
        pending = [
            (s.system_id, turn.index) for s in self.sessions for turn in s.turns
            if (s.system_id, turn.index) not in self.records
        ]
        if not pending:
            log.info("nothing to generate: all %d turns already have records", len(self.records))
            return
        log.info("generating %d replies for %d sessions (history=%s)", len(pending), len(self.sessions), self.settings.history)
        from tqdm import tqdm

        with tqdm(total=len(pending), desc="generate", unit="reply", disable=not (self.progress and self.writes)) as bar:
            if self.settings.history == "model":
                self._run_model_history(bar)
            else:
                self._run_reference_history(bar)

    # -- model history: one call per turn --------------------------------------------
    def _run_model_history(self, bar: Any) -> None:
        max_turns = max(len(s.turns) for s in self.sessions)
        for turn in range(1, max_turns + 1):
            todo = [s for s in self.sessions if turn <= len(s.turns) and (s.system_id, turn) not in self.records]
            if not todo:
                continue
            prepared: list[Prepared] = []
            for session in todo:
                earlier = [self.records.get((session.system_id, i)) for i in range(1, turn)]
                gap = [i for i, record in enumerate(earlier, start=1) if record is None]
                if gap:
                    raise SysbenchError(
                        f"{where(self.run_dir.generations.path, session.system_id, turn)}: history turn {gap[0]} has no "
                        "record (was the file edited?)"
                    )
                skipped_before = [r.turn for r in earlier if r is not None and r.status != "ok"]
                if skipped_before:
                    # Without that reply the history is incomplete: the rest of the session is skipped too.
                    prepared.append(Prepared(session, turn, [], None, None, f"history turn {skipped_before[0]} was skipped"))
                    continue
                history = {r.turn: r.response or "" for r in earlier if r is not None}
                prepared.append(self._prepare(session, turn, conversation_for_turn(session, turn, history)))
            self._call_and_store(prepared, label=turn)
            bar.update(len(prepared))

    # -- reference history: one call for everything ------------------------------------
    def _run_reference_history(self, bar: Any) -> None:
        prepared: list[Prepared] = []
        for session in self.sessions:
            references = {t.index: t.reference or "" for t in session.turns}
            for turn in session.turns:
                if (session.system_id, turn.index) in self.records:
                    continue
                prepared.append(self._prepare(session, turn.index, conversation_for_turn(session, turn.index, references)))
        self._call_and_store(prepared, label="all")
        bar.update(len(prepared))

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
            "turn %s: %d requests, %.2f s, %d prompt tokens%s, %d output tokens, %.1f output tok/s, finish %s%s",
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
    skipped_sessions: list[int] = []
    if settings.history == "reference":
        sessions, skipped_sessions = select_for_reference_history(sessions, settings.skip_missing_reference)
    if not sessions:
        raise SysbenchError(f"{dataset.path}: no sessions selected")
    scheduler = TurnScheduler(engine, run_dir, settings, sessions, progress=progress)
    writes = scheduler.writes
    if writes:
        run_dir.path.mkdir(parents=True, exist_ok=True)
        run_dir.write_sessions(_merged_snapshot(run_dir, dataset, sessions), dataset)
        described = engine.describe()
        run_dir.update_manifest(
            STAGE,
            status="running",
            model=settings.model,
            engine=settings.engine,
            history=settings.history,
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
    wanted = {(s.system_id, t.index) for s in sessions for t in s.turns}
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


# ------------------------------------------------------------------ CLI

# CLI flag (argparse dest) -> engine keyword, per engine. A flag set for an engine that
# does not take it is an error rather than silently ignored.
ENGINE_FLAGS: dict[str, dict[str, str]] = {
    "hf": {"device": "device", "dtype": "dtype", "batch_size": "batch_size", "device_map": "device_map", "seed": "seed"},
    "vllm": {
        "tensor_parallel_size": "tensor_parallel_size",
        "pipeline_parallel_size": "pipeline_parallel_size",
        "data_parallel_size": "data_parallel_size",
        "no_prefix_caching": "enable_prefix_caching",
        "max_model_len": "max_model_len",
        "gpu_memory_utilization": "gpu_memory_utilization",
        "dtype": "dtype",
        "seed": "seed",
        "distributed_executor_backend": "distributed_executor_backend",
        "enforce_eager": "enforce_eager",
    },
    "openai": {
        "base_url": "base_url",
        "api_key_env": "api_key_env",
        "concurrency": "concurrency",
        "max_retries": "max_retries",
        "timeout": "timeout",
    },
}
_SHARED_FLAGS = {"seed"}  # a sampling flag that engines also take when they have it


def engine_options_from_args(engine: str, args: argparse.Namespace) -> dict[str, Any]:
    """The ``get_engine`` keyword arguments for the engine flags the user set."""
    mapping = ENGINE_FLAGS[engine]
    options: dict[str, Any] = {}
    for flags in ENGINE_FLAGS.values():
        for dest in flags:
            value = getattr(args, dest, None)
            if value is None or value is False:
                continue
            if dest not in mapping:
                if dest in _SHARED_FLAGS:
                    continue
                owners = [name for name, m in ENGINE_FLAGS.items() if dest in m]
                raise SysbenchError(
                    f"--{dest.replace('_', '-')} is a flag of the {'/'.join(owners)} engine; --engine {engine} does not take it"
                )
            options[mapping[dest]] = False if dest == "no_prefix_caching" else value
    return options


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="generate replies turn by turn, all sessions together (resumable)",
        description="Generate replies for SysBench sessions. With --history model all sessions advance together, "
        "one batched engine call per turn; records are appended after each turn and a rerun resumes.",
    )
    parser.add_argument("--data", required=True, help="data file or folder, or 'demo' for the packaged demo set")
    parser.add_argument("--model", required=True, help="model path or hub id; 'smollm2' is the embedded model")
    parser.add_argument("--engine", required=True, choices=("vllm", "hf", "openai"))
    parser.add_argument("--out", required=True, help="run directory (created; reused to resume)")
    parser.add_argument("--limit", type=int, help="first N selected sessions")
    parser.add_argument("--sessions", help="session ids, e.g. 1,2,5-9")
    parser.add_argument("--history", choices=HISTORY_MODES, default="model",
                        help="model: the model's own earlier replies (default); reference: the reference replies")
    parser.add_argument("--skip-missing-reference", action="store_true",
                        help="with --history reference, leave out sessions whose needed references are null")
    parser.add_argument("--on-overflow", choices=OVERFLOW_POLICIES, default="error",
                        help="when prompt + max tokens exceeds the context (default: error)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    sampling = parser.add_argument_group("sampling (default: the model's own generation config)")
    sampling.add_argument("--max-tokens", type=int)
    sampling.add_argument("--temperature", type=float)
    sampling.add_argument("--top-p", type=float)
    sampling.add_argument("--top-k", type=int)
    sampling.add_argument("--repetition-penalty", type=float)
    sampling.add_argument("--seed", type=int, help="sampling seed (also the engine seed for hf and vllm)")
    hf = parser.add_argument_group("hf engine")
    hf.add_argument("--batch-size", type=int, help="sequences per generate() batch (default 32)")
    hf.add_argument("--device", help="cuda, cuda:1, cpu (default: cuda when available)")
    hf.add_argument("--device-map", help="'auto' spreads a large model over the GPUs through accelerate")
    both = parser.add_argument_group("hf and vllm engines")
    both.add_argument("--dtype", help="bfloat16, float16, float32 or auto")
    vllm = parser.add_argument_group("vllm engine")
    vllm.add_argument("--tensor-parallel-size", type=int)
    vllm.add_argument("--pipeline-parallel-size", type=int)
    vllm.add_argument("--data-parallel-size", type=int)
    vllm.add_argument("--no-prefix-caching", action="store_true")
    vllm.add_argument("--max-model-len", type=int)
    vllm.add_argument("--gpu-memory-utilization", type=float)
    vllm.add_argument("--distributed-executor-backend", help="mp, ray or external_launcher (torchrun)")
    vllm.add_argument("--enforce-eager", action="store_true")
    openai = parser.add_argument_group("openai engine")
    openai.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1")
    openai.add_argument("--api-key-env", help="environment variable holding the API key (default OPENAI_API_KEY)")
    openai.add_argument("--concurrency", type=int)
    openai.add_argument("--max-retries", type=int)
    openai.add_argument("--timeout", type=float)
    parser.set_defaults(func=_cmd_generate)


def sampling_from_args(args: argparse.Namespace) -> SamplingSpec:
    for name in ("max_tokens", "top_k"):
        value = getattr(args, name)
        if value is not None and value < (1 if name == "max_tokens" else 0):
            raise SysbenchError(f"--{name.replace('_', '-')} must be positive, got {value}")
    return SamplingSpec(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
    )


def _cmd_generate(args: argparse.Namespace) -> int:
    settings = GenerateSettings(
        model=args.model,
        engine=args.engine,
        history=args.history,
        sampling=sampling_from_args(args),
        on_overflow=args.on_overflow,
        skip_missing_reference=args.skip_missing_reference,
    )
    options = engine_options_from_args(args.engine, args)
    dataset = load_dataset(args.data)
    ids = parse_session_ids(args.sessions)
    sessions = dataset.select(ids, args.limit)
    run_dir = RunDir(args.out)
    # One writer per run directory; taking the lock also checks --out before a model loads.
    with stage_lock(run_dir.path, STAGE, enabled=is_primary_rank(options)):
        return _generate_locked(args, settings, options, dataset, sessions, run_dir)


def _generate_locked(
    args: argparse.Namespace, settings: GenerateSettings, options: dict[str, Any], dataset: Dataset,
    sessions: list[Session], run_dir: RunDir,
) -> int:
    from sysbench_gpu.engines import get_engine

    run_dir.ensure_writable([GENERATIONS])
    # Fail on a mismatched run directory or missing references before loading a model.
    check_compatible(run_dir, settings, dataset)
    if settings.history == "reference" and not settings.skip_missing_reference:
        select_for_reference_history(sessions, skip_missing=False)
    model = args.model
    if args.engine in ("hf", "vllm"):
        from sysbench_gpu.models import resolve_model

        model = resolve_model(args.model)
    engine = get_engine(args.engine, model=model, **options)
    try:
        summary = run_generation(
            engine, dataset, sessions, run_dir, settings, engine_options=options, progress=not args.no_progress,
            lock=False,
        )
    finally:
        engine.close()
    if getattr(engine, "is_primary", True):
        print(
            f"{run_dir.generations.path}: {summary.total_records} records ({summary.new_records} new, "
            f"{summary.skipped_records} skipped); statistics in {run_dir.stats_path}"
        )
    return 0
