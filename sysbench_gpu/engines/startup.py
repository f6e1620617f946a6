"""One line for an engine that fails to start: what failed, the root cause, what to change.

vLLM's engine-core process writes its traceback straight to the inherited stderr, and
its front end then raises a generic "Engine core initialization failed. See root cause
above." So the vLLM engine runs its start-up with file descriptors 1 and 2 pointed at a
log file (``capture_output``); on failure ``startup_failure`` reads the root-cause line
back from that log and names the flag or variable to change. The full traceback stays in
the log and in debug logging (``--verbose``, where nothing is redirected).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from sysbench_gpu.core.errors import SysbenchError

log = logging.getLogger(__name__)

# "ValueError: ...", "torch.OutOfMemoryError: ...", "safetensors_rust.SafetensorError: ..."
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)): (.+)$")
# vLLM's log prefixes: "(EngineCore pid=12) " and "ERROR 11-22 14:49:45 [core.py:1510] ".
_VLLM_PREFIX = re.compile(
    r"^(?:\([\w.:-]+ pid=\d+\)\s*)?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d "
    r"\d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\]\s?)?"
)
# Wrappers that only point elsewhere: never the root cause.
_WRAPPERS = (
    "Engine core initialization failed",
    "See root cause above",
    "See stack trace for root cause",
    "Worker failed with error",
    "WorkerProc initialization failed",
    "Frontend process failed",
)
# (pattern in the root cause, what to change); first match wins.
HINTS: tuple[tuple[str, str], ...] = (
    (
        r"Available memory on node|desired CPU memory utilization|requested memory for kv",
        "free memory held by other processes, or size the CPU KV cache yourself: VLLM_CPU_KVCACHE_SPACE=<GiB> "
        "(or --gpu-memory-utilization, a fraction of the NUMA node's memory on the CPU build)",
    ),
    (
        r"max seq len|max_model_len|larger than the maximum number of tokens|KV cache is needed",
        "lower --max-model-len, or give the KV cache more memory "
        "(--gpu-memory-utilization; VLLM_CPU_KVCACHE_SPACE on CPU)",
    ),
    (
        r"out of memory|OutOfMemory|No available memory for the cache blocks|Insufficient memory|Cannot allocate "
        r"memory",
        "lower --max-model-len or --gpu-memory-utilization, raise --tensor-parallel-size, or free the device",
    ),
    (
        r"Address already in use|EADDRINUSE|Could not find open port",
        "export a different VLLM_PORT (each data-parallel replica scans upward from its own range)",
    ),
    (
        r"No CUDA GPUs|CUDA driver|no NVIDIA driver|CUDA_VISIBLE_DEVICES|invalid device ordinal",
        "check CUDA_VISIBLE_DEVICES and nvidia-smi, or use a CPU build",
    ),
    (r"No module named", "install the missing package (pip install 'sysbench-gpu[gpu]' or '[cpu]')"),
    (
        r"couldn't connect to 'https://huggingface.co'|not a valid model identifier|Repository Not Found|"
        r"401 Client Error|gated repo",
        "give a local model folder, or a hub id that is in the Hugging Face cache (HF_HOME) or downloadable",
    ),
    (r"safetensors|SafetensorError|deserializing header", "download or convert the model again"),
    (r"not supported|Unsupported|unsupported", "choose a supported model/dtype, or another engine (--engine hf)"),
)
LOG_FILES_KEPT = 20


def root_cause_line(text: str) -> str | None:
    """The last exception line of ``text`` that is not a wrapper pointing at another one."""
    found: str | None = None
    for line in text.splitlines():
        match = _EXCEPTION_LINE.match(_VLLM_PREFIX.sub("", line.strip(), count=1).strip())
        if match and not any(wrapper in match.group(2) for wrapper in _WRAPPERS):
            found = f"{match.group(1)}: {match.group(2).strip()}"
    return found


def hint_for(cause: str) -> str | None:
    for pattern, hint in HINTS:
        if re.search(pattern, cause):
            return hint
    return None


def one_line(error: BaseException) -> str:
    """``Type: first line`` of an exception (its message may span lines)."""
    text = str(error).strip()
    first = text.splitlines()[0].strip() if text else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def startup_failure(what: str, error: BaseException, log_path: Path | None = None) -> SysbenchError:
    """A one-line ``SysbenchError``: ``what`` failed (e.g. "vllm engine for 'smollm2' failed to start").

    The root cause is looked up in the captured log first (vLLM's engine core writes it
    there), else it is the error itself. The full traceback goes to debug logging.
    """
    if isinstance(error, SysbenchError):
        return error
    log.debug("%s failed to start", what, exc_info=error)
    captured = ""
    if log_path is not None:
        try:
            captured = log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            captured = ""
    cause = root_cause_line(captured) or one_line(error)
    hint = hint_for(cause)
    message = f"{what}: {cause}"
    if hint:
        message += f"; to change: {hint}"
    if log_path is not None:
        message += f" (full output: {log_path})"
    elif not log.isEnabledFor(logging.DEBUG):
        message += " (rerun with --verbose for the traceback)"
    return SysbenchError(message)


def startup_log_path(log_dir: Path, label: str) -> Path:
    """A fresh log file name in ``log_dir``; the oldest beyond ``LOG_FILES_KEPT`` are removed."""
    log_dir.mkdir(parents=True, exist_ok=True)
    old = sorted(log_dir.glob(f"{label}-*.log"), key=lambda p: p.stat().st_mtime)
    for stale in old[: max(0, len(old) - LOG_FILES_KEPT + 1)]:
        with contextlib.suppress(OSError):
            stale.unlink()
    return log_dir / f"{label}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


@contextlib.contextmanager
def capture_output(path: Path | None) -> Iterator[None]:
    """Point file descriptors 1 and 2 at ``path`` while the block runs (None: change nothing).

    Child processes started inside the block keep writing to the file for their whole
    life, which is the point: vLLM's engine core logs there, not on the terminal.
    """
    if path is None:
        yield
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = [os.dup(1), os.dup(2)]
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)
