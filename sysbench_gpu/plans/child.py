"""One step as a child process: its output passed through, its one-line error kept, its processes gone after it.

Each step runs as ``python -m sysbench_gpu VERB ...`` (or under torchrun) in a process group of
its own. Its stdout and stderr are copied to ours as they come (so a log file gets every line)
and the last ``error: ...`` line it printed is kept, for the plan's error that names the model and
the step. When the step's main process has exited, the runner waits until every process of its
group has gone too (vLLM's and torchrun's workers): only then is the GPU memory they held free
for the next step. On Linux the child is killed if the runner dies (``kill -9`` included), so a
killed plan leaves no step running on its own; a rerun resumes it.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

ERROR_PREFIX = "error: "
GROUP_WAIT_S = 120.0  # how long the step's other processes get to exit after its main one
_TAIL_CHARS = 16_384


@dataclass(frozen=True)
class ChildResult:
    returncode: int
    error: str | None  # the last `error: ...` line the step printed (without the prefix)
    seconds: float


def _die_with(parent: int) -> Callable[[], None]:
    def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
        """Linux: SIGKILL this process when the process that started it dies."""
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        if os.getppid() != parent:  # the runner died before the prctl: no signal will come
            os._exit(1)

    return die_with_parent


def run_child(command: Sequence[str], env: Mapping[str, str], stdout: IO[str], stderr: IO[str]) -> ChildResult:
    """Run ``command``, copying its output to ``stdout``/``stderr``; returns its exit status and last error line."""
    started = time.monotonic()
    process = subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=dict(env),
        start_new_session=True,  # its own process group: waited for, and signalled, as one
        preexec_fn=_die_with(os.getpid()) if sys.platform.startswith("linux") else None,
    )
    tail = ""
    try:
        tail = _copy_output(process, stdout, stderr)
        returncode = process.wait()
    except BaseException:
        _stop_group(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _stop_group(process.pid, signal.SIGKILL)
            process.wait()
        raise
    finally:
        wait_for_group(process.pid)
    return ChildResult(returncode, last_error(tail), time.monotonic() - started)


def _copy_output(process: subprocess.Popen[bytes], stdout: IO[str], stderr: IO[str]) -> str:
    """Copy both pipes as data arrives; returns the end of stderr."""
    selector = selectors.DefaultSelector()
    targets = {}
    for pipe, target in ((process.stdout, stdout), (process.stderr, stderr)):
        assert pipe is not None
        os.set_blocking(pipe.fileno(), False)
        selector.register(pipe, selectors.EVENT_READ)
        targets[pipe.fileno()] = (target, codecs.getincrementaldecoder("utf-8")(errors="replace"))
    tail = ""
    assert process.stderr is not None
    err_fd = process.stderr.fileno()
    while selector.get_map():
        for key, _ in selector.select():
            chunk = os.read(key.fd, 65536)
            target, decoder = targets[key.fd]
            if not chunk:
                selector.unregister(key.fileobj)
                text = decoder.decode(b"", final=True)
            else:
                text = decoder.decode(chunk)
            if text:
                target.write(text)
                target.flush()
                if key.fd == err_fd:
                    tail = (tail + text)[-_TAIL_CHARS:]
    selector.close()
    return tail


def last_error(text: str) -> str | None:
    """The last ``error: ...`` line of a step's stderr (the CLI's one-line errors), without the prefix."""
    for line in reversed(text.replace("\r", "\n").splitlines()):
        if line.startswith(ERROR_PREFIX):
            return line[len(ERROR_PREFIX) :].strip()
    return None


def _stop_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def wait_for_group(pgid: int, timeout_s: float = GROUP_WAIT_S) -> None:
    """Until no process of the step's group is left (their GPU memory is then free); killed after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        except PermissionError:  # a member we cannot signal: not ours to wait for
            return
        time.sleep(0.2)
    print(
        f"warning: processes of the last step (group {pgid}) outlived it by {timeout_s:.0f} s; stopping them",
        file=sys.stderr,
    )
    _stop_group(pgid, signal.SIGKILL)
