"""What the judge spent: paid replies, cache hits, tokens and an estimated cost, exactly once.

``RUN_DIR/judge_ledger.jsonl`` is the journal: one line per paid reply (model,
tokens, turn, attempt), appended and fsync'ed the moment the reply arrives and
*before* the reply goes into the cache, plus one line per batch of cache hits.
``RUN_DIR/judge_ledger.json`` is the summary per judge model, rebuilt from the
journal's totals after every record.

Why a journal: a reply that is in the cache has always been counted, so after a
kill it can only come back as what it is, a cache hit, never as a free reply that
was paid for. A reply whose line was not yet written when the process died was
not cached either: the rerun asks again and counts that reply.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.jsonio import read_json
from sysbench_gpu.core.jsonl import append_lines, complete_lines
from sysbench_gpu.core.rundir import utc_now, write_json_atomic

LEDGER = "judge_ledger.json"
LEDGER_JOURNAL = "judge_ledger.jsonl"
_EVENTS = ("paid", "cache_hit", "carried")

# USD per million tokens (input, output), list prices as published by OpenAI in 2024-25.
# Estimates only: check your provider. Longest matching prefix wins (gpt-4o-mini before gpt-4o).
PRICES_PER_MTOK: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4-turbo": (10.00, 30.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-3.5-turbo": (0.50, 1.50),
}


def price_for(model: str) -> tuple[float, float] | None:
    name = model.lower().rsplit("/", 1)[-1]
    best = None
    for prefix in PRICES_PER_MTOK:
        if name.startswith(prefix) and (best is None or len(prefix) > len(best)):
            best = prefix
    return PRICES_PER_MTOK[best] if best else None


def estimate_cost(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    price = price_for(model)
    if price is None:
        return None
    return round((prompt_tokens * price[0] + completion_tokens * price[1]) / 1e6, 6)


def estimate_tokens(text: str) -> int:
    """Rough token count without a tokenizer: one per CJK character, one per four others."""
    wide = sum(1 for ch in text if ord(ch) > 0x2E80)
    return wide + math.ceil((len(text) - wide) / 4)


@dataclass
class LedgerTotals:
    requests: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def summary(self, model: str) -> dict[str, Any]:
        price = price_for(model)
        return {
            **asdict(self),
            "price_usd_per_mtok": {"input": price[0], "output": price[1]} if price else None,
            "estimated_cost_usd": estimate_cost(model, self.prompt_tokens, self.completion_tokens),
        }


@dataclass(frozen=True)
class PaidReply:
    """One reply a server (or a local model) produced for us: what the journal records."""

    prompt_tokens: int | None
    completion_tokens: int | None
    turn: str  # "session 3, turn 2"
    attempt: int


class JudgeLedger:
    """The journal and totals of one run's judge; ``model`` is the judge this call counts for.

    Until :meth:`start_writing` (never, on a non-primary rank) totals are kept in memory only.
    """

    def __init__(self, run_path: Path, model: str) -> None:
        self.run_path = Path(run_path)
        self.model = model
        self.writes = False
        self.totals: dict[str, LedgerTotals] = {}
        self._carried: list[bytes] = []  # old summary totals, journaled when writing starts
        self._lock = threading.Lock()

    @property
    def journal_path(self) -> Path:
        return self.run_path / LEDGER_JOURNAL

    @property
    def summary_path(self) -> Path:
        return self.run_path / LEDGER

    @classmethod
    def load(cls, run_path: Path, model: str, writes: bool = True) -> JudgeLedger:
        """Read (and validate) the journal; ``writes``: start writing at once (see :meth:`start_writing`)."""
        ledger = cls(run_path, model)
        if ledger.journal_path.exists():
            for number, line in complete_lines(ledger.journal_path.read_bytes()):
                ledger._apply(_journal_entry(ledger.journal_path, number, line))
        elif ledger.summary_path.is_file():
            ledger._carry_over_summary()
        if writes:
            ledger.start_writing()
        return ledger

    def start_writing(self) -> None:
        """From now on every count is journaled (never on a non-primary rank)."""
        self.writes = True
        if self._carried:
            append_lines(self.journal_path, self._carried)
            self._carried = []

    def _carry_over_summary(self) -> None:
        """A run judged before the journal existed: its totals become one ``carried`` line per model."""
        obj = read_json(self.summary_path, expect=dict, what="judge models")
        models = obj.get("models", {})
        if not isinstance(models, dict):
            raise SysbenchError(f"{self.summary_path}: field 'models' should be an object")
        for model, entry in models.items():
            if not isinstance(entry, dict):
                raise SysbenchError(f"{self.summary_path}: field 'models.{model}' should be an object")
            counts = {k: entry.get(k, 0) for k in ("requests", "cache_hits", "prompt_tokens", "completion_tokens")}
            if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts.values()):
                raise SysbenchError(f"{self.summary_path}: the counts of model {model!r} are not non-negative integers")
            entry = {"event": "carried", "model": model, **counts, "time": utc_now()}
            self._apply(entry)
            self._carried.append(_line(entry))

    def _apply(self, entry: dict[str, Any]) -> None:
        totals = self.totals.setdefault(entry["model"], LedgerTotals())
        if entry["event"] == "paid":
            totals.requests += 1
            totals.prompt_tokens += entry.get("prompt_tokens") or 0
            totals.completion_tokens += entry.get("completion_tokens") or 0
        elif entry["event"] == "cache_hit":
            totals.cache_hits += entry["count"]
        else:
            for name in ("requests", "cache_hits", "prompt_tokens", "completion_tokens"):
                setattr(totals, name, getattr(totals, name) + entry[name])

    def paid(self, replies: Sequence[PaidReply]) -> None:
        """Count replies the moment they arrive; call this before caching them."""
        entries = [{"event": "paid", "model": self.model, **asdict(reply), "time": utc_now()} for reply in replies]
        self._record(entries)

    def cache_hits(self, count: int) -> None:
        if count:
            self._record([{"event": "cache_hit", "model": self.model, "count": count, "time": utc_now()}])

    def _record(self, entries: list[dict[str, Any]]) -> None:
        if not entries:
            return
        if self.writes:
            append_lines(self.journal_path, [_line(entry) for entry in entries])
        with self._lock:
            for entry in entries:
                self._apply(entry)

    def current(self) -> LedgerTotals:
        with self._lock:
            return LedgerTotals(**asdict(self.totals.get(self.model, LedgerTotals())))

    @property
    def requests(self) -> int:
        return self.current().requests

    def summary(self) -> dict[str, Any]:
        return self.current().summary(self.model)

    def save(self) -> None:
        """Rewrite the summary file from the totals of every judge model of this run."""
        if not self.writes:
            return
        with self._lock:
            models = {model: totals.summary(model) for model, totals in sorted(self.totals.items())}
        write_json_atomic(
            self.summary_path,
            {
                "models": models,
                "updated": utc_now(),
                "journal": LEDGER_JOURNAL,
                "note": "estimated_cost_usd uses list prices from sysbench_gpu.judging.ledger.PRICES_PER_MTOK; "
                "null = unknown model",
            },
        )


def _line(entry: dict[str, Any]) -> bytes:
    return (json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def _journal_entry(path: Path, number: int, line: bytes) -> dict[str, Any]:
    def bad(reason: str) -> SysbenchError:
        return SysbenchError(f"{path}: line {number} is not a ledger entry ({reason})")

    try:
        entry = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise bad("not JSON") from None
    if not isinstance(entry, dict) or entry.get("event") not in _EVENTS or not isinstance(entry.get("model"), str):
        raise bad("needs an 'event' of paid, cache_hit or carried and a 'model'")
    numbers = {
        "paid": ("prompt_tokens", "completion_tokens"),
        "cache_hit": ("count",),
        "carried": ("requests", "cache_hits", "prompt_tokens", "completion_tokens"),
    }[entry["event"]]
    for name in numbers:
        value = entry.get(name)
        optional = entry["event"] == "paid" and value is None
        if not optional and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise bad(f"field {name!r} should be a non-negative integer")
    return entry
