"""Progress that a terminal draws and a log file can read: one helper for every long stage (docs/generation.md).

On a terminal a stage draws a tqdm bar, as it always has. Where stderr is a file (SLURM, ``nohup``,
``torchrun``) a bar would fill it with carriage-return frames, so the stage instead logs one line
every ``log_every`` seconds and a closing line when it ends::

    generate: 120/500 turns (24%), 2.10 turns/s, 35.2 tokens/s, ETA 3m01s
    generate: done, 500/500 turns in 4m10s, 2.00 turns/s, 33.9 tokens/s

A line is due at the interval whether or not work finished since the last one (a background thread
keeps time), so a single engine call that runs for an hour still shows the job is alive. Rates are
averages since the stage started: the same clock for the count and for every measure.
``--no-progress`` silences bars and lines alike.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator
from types import TracebackType
from typing import Any, TextIO

from sysbench_gpu.core.arguments import check_finite

__all__ = [
    "DEFAULT_LOG_EVERY",
    "ProgressLog",
    "add_progress_flags",
    "format_duration",
    "quiet_library_bars",
    "stderr_is_terminal",
]

DEFAULT_LOG_EVERY = 60.0
# Measures shown per second; any other measure is shown as a running total (prompts, cache hits).
RATE_MEASURES = ("tokens",)

log = logging.getLogger("sysbench_gpu.progress")


def stderr_is_terminal(stream: Any = None) -> bool:
    """Whether ``stream`` (default ``sys.stderr``) can draw a bar: a terminal, or a notebook's output."""
    stream = sys.stderr if stream is None else stream
    if stream is None:  # pythonw and friends
        return False
    # A Jupyter kernel's stream is no tty, yet it redraws a bar in place like one.
    if type(stream).__module__.partition(".")[0] == "ipykernel":
        return True
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed file
        return False


def quiet_library_bars(force: bool = False) -> None:
    """Switch off the Hugging Face hub's and transformers' own bars where stderr cannot draw them.

    Those are the downloads and "Loading checkpoint shards"; ``force`` (``--no-progress``) switches them
    off on a terminal too. Called before a model loads; the setting lasts for the process.
    """
    if not force and stderr_is_terminal():
        return
    try:
        from huggingface_hub.utils import disable_progress_bars
    except ImportError:  # the openai-only install has no hub
        return
    disable_progress_bars()
    # transformers copies the hub's setting when it is imported; one imported already is told directly.
    transformers_logging = sys.modules.get("transformers.utils.logging")
    if transformers_logging is not None:
        transformers_logging.disable_progress_bar()


@contextlib.contextmanager
def library_bars_hidden() -> Iterator[None]:
    """Hide what a library draws on stderr with its own tqdm (not ours to switch off) when stderr is no terminal.

    For the GGUF conversion, whose bars come from ``tqdm.auto`` inside transformers with no setting to
    silence them. Log records still get out: the CLI's handler holds the real stream.
    """
    if stderr_is_terminal():
        yield
        return
    with contextlib.redirect_stderr(io.StringIO()):
        yield


def add_progress_flags(parser: argparse.ArgumentParser) -> None:
    """``--log-every SECONDS`` and, unless the verb has it already, ``--no-progress``.

    ``--log-every`` must be a finite number above 0: ``core.arguments.check_shared_flags`` checks it.
    """
    parser.add_argument(
        "--log-every",
        type=float,
        default=DEFAULT_LOG_EVERY,
        metavar="SECONDS",
        help="when stderr is not a terminal: a progress line (done/total, rate, ETA) every SECONDS "
        f"(default {DEFAULT_LOG_EVERY:g}) and a closing line",
    )
    if "--no-progress" not in parser._option_string_actions:
        parser.add_argument("--no-progress", action="store_true", help="no progress bars or progress lines")


def format_duration(seconds: float) -> str:
    """``12s``, ``3m01s``, ``2h05m`` (under 10 s with a tenth: ``0.4s``)."""
    if seconds < 10:
        return f"{max(seconds, 0.0):.1f}s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    minutes = round(seconds / 60)
    return f"{minutes // 60}h{minutes % 60:02d}m"


def _format_rate(rate: float) -> str:
    if rate >= 100:
        return f"{rate:.0f}"
    if rate >= 10:
        return f"{rate:.1f}"
    if rate >= 0.1 or rate == 0:
        return f"{rate:.2f}"
    return f"{rate:.3g}"  # slow stages (a 72B attention forward) keep three significant digits


def _format_count(value: float) -> str:
    return f"{int(value)}" if float(value).is_integer() else f"{value:.1f}"


def _plural(unit: str) -> str:
    if unit.endswith("y") and unit[-2:-1] not in ("a", "e", "i", "o", "u"):
        return unit[:-1] + "ies"
    return unit if unit.endswith("s") else unit + "s"


class ProgressLog:
    """On a terminal: a tqdm bar as today. Not on a terminal: one line every ``log_every`` seconds and a closing
    line; never a ``\\r`` frame.

    ``stage``: the line's prefix and the bar's label. ``total``: the work units expected (None: unknown, so no
    percentage or ETA). ``unit``: one work unit's name (``turn``, ``session``, ``battle``). ``update(n,
    **measures)``: ``n`` more units done; each measure (``tokens=120``, ``prompts=4``, ``cache_hits=3``) is
    added to its total. Measures named in ``rates`` are shown per second, the others as totals.
    ``enabled`` False: nothing at all (``--no-progress``, or a process that does not write). ``stream``: where
    the lines go (default: the ``logging`` module, at INFO, whose handler writes stderr with a timestamp;
    stderr itself where logging is not set up). ``terminal``: force a bar (True) or lines (False); default:
    ``stderr_is_terminal(stream)``. ``heartbeat``: lines come at the interval even while nothing finishes
    (a background thread); default: on with the real clock, off with a test's fake one.
    """

    def __init__(
        self,
        stage: str,
        total: int | None,
        unit: str,
        *,
        log_every: float = DEFAULT_LOG_EVERY,
        enabled: bool = True,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        terminal: bool | None = None,
        rates: Collection[str] = RATE_MEASURES,
        heartbeat: bool | None = None,
    ) -> None:
        check_finite(log_every, "--log-every", positive=True)
        self.stage = stage
        self.total = total
        self.unit = unit
        self.log_every = float(log_every)
        self.enabled = enabled
        self.stream = stream
        self.clock = clock
        self.terminal = stderr_is_terminal(stream) if terminal is None else terminal
        self.rates = frozenset(rates)
        self.done = 0
        self.measures: dict[str, float] = {}
        self._lock = threading.RLock()
        self._started = clock()
        self._last_line = self._started
        self._closed = False
        self._failed = False
        self._bar: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if not enabled:
            return
        if self.terminal:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=stage, unit=unit, file=stream if stream is not None else sys.stderr)
        elif heartbeat if heartbeat is not None else clock is time.monotonic:
            self._thread = threading.Thread(target=self._beat, name=f"progress {stage}", daemon=True)
            self._thread.start()

    # -- what a stage calls -----------------------------------------------------------------
    def update(self, n: int = 1, **measures: float) -> None:
        """``n`` more units done, and each measure added to its total; a line when one is due."""
        with self._lock:
            self.done += n
            for name, value in measures.items():
                self.measures[name] = self.measures.get(name, 0.0) + value
            if self._bar is not None:
                if n:
                    self._bar.update(n)
            elif self.enabled and not self._closed:
                self._line_if_due()

    def set_total(self, total: int | None) -> None:
        """The expected units, once known or changed (None: unknown)."""
        with self._lock:
            self.total = total
            if self._bar is not None:
                self._bar.total = total
                self._bar.refresh()

    def postfix(self, **fields: Any) -> None:
        """Fields shown after the bar on a terminal (the lines carry the measures instead)."""
        if self._bar is not None:
            self._bar.set_postfix(**fields)

    def close(self) -> None:
        """The closing line (not on a terminal), or closes the bar. A second call does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self._bar is not None:
                self._bar.close()
            elif self.enabled:
                self._emit(self.closing_line(self.clock()))

    def __enter__(self) -> ProgressLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._failed = exc_type is not None
        self.close()

    # -- the lines ------------------------------------------------------------------------
    def progress_line(self, now: float) -> str:
        """``stage: done/total units (pct%), rate, measures, ETA ...`` as of ``now``."""
        elapsed = now - self._started
        parts = [self._count()]
        parts += self._rates(elapsed)
        if self.total is not None:
            parts.append(f"ETA {self._eta(elapsed)}")
        return f"{self.stage}: " + ", ".join(parts)

    def closing_line(self, now: float) -> str:
        """``stage: done, done/total units in 4m10s, rate, measures`` (``stopped`` when it ended short)."""
        elapsed = now - self._started
        finished = not self._failed and (self.total is None or self.done >= self.total)
        count = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
        head = f"{'done' if finished else 'stopped'}, {count} {_plural(self.unit)} in {format_duration(elapsed)}"
        return f"{self.stage}: " + ", ".join([head, *self._rates(elapsed)])

    def _count(self) -> str:
        units = _plural(self.unit)
        if self.total is None:
            return f"{self.done} {units}"
        share = 100 if self.total <= 0 else math.floor(100 * self.done / self.total)
        return f"{self.done}/{self.total} {units} ({share}%)"

    def _rates(self, elapsed: float) -> list[str]:
        parts = []
        if elapsed > 0:
            parts.append(f"{_format_rate(self.done / elapsed)} {_plural(self.unit)}/s")
        for name, value in self.measures.items():
            label = name.replace("_", " ")
            if name in self.rates:
                if elapsed > 0:
                    parts.append(f"{_format_rate(value / elapsed)} {label}/s")
            else:
                parts.append(f"{_format_count(value)} {label}")
        return parts

    def _eta(self, elapsed: float) -> str:
        assert self.total is not None
        left = self.total - self.done
        if left <= 0:
            return "0s"
        if self.done <= 0 or elapsed <= 0:
            return "unknown"
        return format_duration(left * elapsed / self.done)

    def _line_if_due(self) -> None:
        now = self.clock()
        if now - self._last_line >= self.log_every:
            self._last_line = now
            self._emit(self.progress_line(now))

    def _beat(self) -> None:
        while True:
            with self._lock:
                wait = self._last_line + self.log_every - self.clock()
            if self._stop.wait(max(wait, 0.0)):
                return
            with self._lock:
                if not self._closed:
                    self._line_if_due()

    def _emit(self, line: str) -> None:
        if self.stream is not None:
            self.stream.write(line + "\n")
            self.stream.flush()
        elif log.isEnabledFor(logging.INFO) and log.hasHandlers():
            log.info("%s", line)
        else:
            # Logging is not set up (a library call): the line still reaches stderr.
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
