"""Retries with capped exponential backoff and jitter, for any remote call.

Pure Python and clock-injectable, so the policy is unit-tested with a fake clock
and reused by every stage that talks to a server (the openai engine, the judge).

The caller supplies ``classify(error)``: it returns a :class:`Retryable` for a
transient failure (429, 5xx, a dropped connection, a timeout) or None for one that
another try cannot fix (a bad request, a wrong key), which is raised at once.
"""

from __future__ import annotations

import email.utils
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.redact import RedactionTally, Secrets

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How many times to retry and how long to wait in between.

    The n-th retry (n = 1, 2, ...) waits ``base_delay_s * multiplier**(n-1)``,
    capped at ``max_delay_s``, then scaled by a random factor in
    ``[1 - jitter, 1]`` so that many clients hit by the same 429 spread out.
    A server's ``Retry-After`` is honoured: the wait is at least that long, up to
    ``max_retry_after_s`` (a server asking for an hour gets ``max_retry_after_s``).
    """

    max_retries: int = 6
    base_delay_s: float = 1.0
    multiplier: float = 2.0
    max_delay_s: float = 30.0
    jitter: float = 0.5
    max_retry_after_s: float = 120.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise SysbenchError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.base_delay_s < 0 or self.max_delay_s < 0 or self.max_retry_after_s < 0:
            raise SysbenchError("retry delays must be >= 0")
        if self.multiplier < 1:
            raise SysbenchError(f"retry multiplier must be >= 1, got {self.multiplier}")
        if not 0 <= self.jitter <= 1:
            raise SysbenchError(f"retry jitter must be within [0, 1], got {self.jitter}")

    def backoff_s(self, retry_number: int, rng: random.Random) -> float:
        """The jittered, capped wait before retry ``retry_number`` (1-based)."""
        raw = self.base_delay_s * self.multiplier ** max(retry_number - 1, 0)
        capped = min(raw, self.max_delay_s)
        return capped * (1.0 - self.jitter * rng.random())

    def delay_s(self, retry_number: int, retry_after_s: float | None, rng: random.Random) -> float:
        """The wait before retry ``retry_number``, honouring a server's Retry-After."""
        delay = self.backoff_s(retry_number, rng)
        if retry_after_s is not None and retry_after_s > 0:
            delay = max(delay, min(retry_after_s, self.max_retry_after_s))
        return delay


@dataclass(frozen=True)
class Retryable:
    """A transient failure: a short reason (``429``, ``500``, ``timeout``, ``connection``) and the server's wish."""

    reason: str
    retry_after_s: float | None = None


class Clock(Protocol):
    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class RetriesExhausted(SysbenchError):
    """Every try of one request failed; names the request and the last error."""

    def __init__(
        self,
        label: str,
        attempts: int,
        last_error: BaseException,
        reasons: list[str],
        secrets: Secrets | None = None,
        tally: RedactionTally | None = None,
    ) -> None:
        self.label = label
        self.attempts = attempts
        self.last_error = last_error
        self.reasons = reasons
        text = _error_text(last_error, secrets, tally)
        super().__init__(f"{label}: gave up after {attempts} attempts ({', '.join(reasons)}); last error: {text}")


class NotRetryable(SysbenchError):
    """A failure that retrying cannot fix (bad request, authentication, unknown model)."""

    def __init__(
        self,
        label: str,
        error: BaseException,
        secrets: Secrets | None = None,
        tally: RedactionTally | None = None,
    ) -> None:
        self.label = label
        self.error = error
        super().__init__(f"{label}: request failed without retry: {_error_text(error, secrets, tally)}")


@dataclass
class RetryCounter:
    """Thread-safe totals over many requests: requests, attempts, retries by reason, failures."""

    requests: int = 0
    attempts: int = 0
    retries: Counter = field(default_factory=Counter)
    failures: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, attempts: int, reasons: list[str], failed: bool) -> None:
        with self._lock:
            self.requests += 1
            self.attempts += attempts
            self.retries.update(reasons)
            self.failures += int(failed)

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            return {
                "requests": self.requests,
                "attempts": self.attempts,
                "retries": sum(self.retries.values()),
                "retries_by_reason": dict(sorted(self.retries.items())),
                "failures": self.failures,
            }


def call_with_retries(
    operation: Callable[[], T],
    *,
    policy: RetryPolicy,
    classify: Callable[[BaseException], Retryable | None],
    label: str,
    clock: Clock | None = None,
    rng: random.Random | None = None,
    counter: RetryCounter | None = None,
    secrets: Secrets | None = None,
    tally: RedactionTally | None = None,
) -> tuple[T, int, list[str]]:
    """Run ``operation`` until it succeeds, retrying transient failures.

    Returns ``(value, attempts, retry_reasons)``. Raises :class:`NotRetryable` at
    once for an error ``classify`` rejects, and :class:`RetriesExhausted` after
    ``policy.max_retries`` retries. Other exceptions (KeyboardInterrupt, bugs in
    ``operation``) are not caught unless ``classify`` accepts them. An error's text
    (a server may echo the key in it) is scrubbed with ``secrets``, hits counted in ``tally``.
    """
    clock = clock or SystemClock()
    rng = rng or random.Random()
    reasons: list[str] = []
    attempt = 0
    while True:
        attempt += 1
        try:
            value = operation()
        except Exception as error:  # noqa: BLE001 (classify decides)
            verdict = classify(error)
            if verdict is None:
                if counter is not None:
                    counter.record(attempt, reasons, failed=True)
                raise NotRetryable(label, error, secrets, tally) from error
            reasons.append(verdict.reason)
            if len(reasons) > policy.max_retries:
                if counter is not None:
                    counter.record(attempt, reasons[:-1], failed=True)
                raise RetriesExhausted(label, attempt, error, reasons, secrets, tally) from error
            delay = policy.delay_s(len(reasons), verdict.retry_after_s, rng)
            log.warning(
                "%s: %s (attempt %d of %d); retrying in %.2f s",
                label,
                verdict.reason,
                attempt,
                policy.max_retries + 1,
                delay,
            )
            clock.sleep(delay)
            continue
        if counter is not None:
            counter.record(attempt, reasons, failed=False)
        return value, attempt, reasons


def parse_retry_after(headers: Mapping[str, str] | None, now: Callable[[], float] = time.time) -> float | None:
    """Seconds a server asks us to wait: ``retry-after-ms``, or ``Retry-After`` as seconds or an HTTP date."""
    if not headers:
        return None
    lowered = {str(k).lower(): str(v) for k, v in headers.items()}
    millis = lowered.get("retry-after-ms")
    if millis is not None:
        try:
            return max(float(millis) / 1000.0, 0.0)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(when.timestamp() - now(), 0.0)


def _error_text(error: BaseException, secrets: Secrets | None, tally: RedactionTally | None) -> str:
    # A server's error body may echo the key.
    text, hits = (secrets or Secrets()).scrub_counted(str(error).strip())
    if tally is not None:
        tally.add("errors", hits)
    text = text or type(error).__name__
    if len(text) > 500:
        text = text[:500] + "..."
    return f"{type(error).__name__}: {text}"
