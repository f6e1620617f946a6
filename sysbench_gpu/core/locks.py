"""One writer per run directory and stage: an exclusive lock held for the whole stage.

``with stage_lock(run_dir, "generate"):`` takes ``RUN_DIR/.generate.lock`` with
``flock(LOCK_EX | LOCK_NB)`` and writes the holder (pid, host, start time) into it as
JSON. A second process on the same directory and stage gets one
:class:`StageBusy` line naming the holder and writes nothing. The kernel drops a
``flock`` when its process dies, so a lock file left by a killed process is not
held: the next run takes it over (and says so). A held lock always means a live
holder; the JSON only names it.

Taking the lock is also the first write into the directory, so it doubles as the
early check of ``--out``: a path that is a file, or a folder that cannot be
written, is one clear error before a model loads or a request is paid for.

Under torchrun (``external_launcher``) only the primary rank writes, so only it
locks: pass ``enabled=is_primary_rank(...)``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.jsonl import same_file

log = logging.getLogger(__name__)

_ATTEMPTS = 5  # re-opens when a releasing holder unlinked the file under us
_HOLDER_READS, _HOLDER_PAUSE_S = 40, 0.05  # a busy lock's holder is named within 2 s of locking


@dataclass(frozen=True)
class LockHolder:
    pid: int
    host: str
    started: str
    stage: str

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}, since {self.started}"


class StageBusy(SysbenchError):
    """Another live process holds the stage lock of this directory."""

    def __init__(self, directory: Path, stage: str, holder: LockHolder | None) -> None:
        self.holder = holder
        who = holder.describe() if holder is not None else "a process that has not yet written its name"
        super().__init__(
            f"{directory}: another `{stage}` ({who}) is writing this run directory; "
            "wait for it to finish, or use another directory"
        )


def lock_path(directory: Path, stage: str) -> Path:
    return Path(directory) / f".{stage}.lock"


def is_primary_rank(options: Mapping[str, object] | None = None) -> bool:
    """False on the non-primary ranks of a torchrun (``external_launcher``) launch, which must not write."""
    if (options or {}).get("distributed_executor_backend") != "external_launcher":
        return True
    try:
        return int(os.environ.get("RANK", "0")) == 0
    except ValueError:
        raise SysbenchError(f"RANK={os.environ.get('RANK')!r} is not an integer") from None


def prepare_directory(directory: Path, what: str = "run directory") -> None:
    """Create ``directory`` (and parents); one clear error when it is a file or cannot be made."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise SysbenchError(f"{directory}: is a file, not a {what}; choose another path")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise SysbenchError(f"{directory}: a part of this path is a file, not a folder") from None
    except OSError as error:
        raise SysbenchError(f"{directory}: cannot create the {what} ({_reason(error)})") from None


def _reason(error: OSError) -> str:
    if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return "not writable: read-only or no permission"
    return error.strerror or str(error)


class StageLock:
    """The lock of one stage on one directory; use :func:`stage_lock`."""

    def __init__(self, directory: str | Path, stage: str, lock_file: Path | None = None) -> None:
        self.directory = Path(directory)
        self.stage = stage
        self.path = Path(lock_file) if lock_file is not None else lock_path(self.directory, stage)
        self._fd: int | None = None

    def acquire(self) -> StageLock:
        try:
            import fcntl
        except ImportError:  # not POSIX: one writer per directory is then the user's rule
            return self
        prepare_directory(self.path.parent)
        for _ in range(_ATTEMPTS):
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                busy = error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
                holder = _wait_for_holder(fd) if busy else None
                os.close(fd)
                if busy:
                    raise StageBusy(self.directory, self.stage, holder) from None
                raise SysbenchError(f"{self.path}: cannot lock ({_reason(error)})") from None
            if not same_file(fd, self.path):
                os.close(fd)  # the holder released and unlinked it between our open and lock: again
                continue
            stale = _read_holder(fd)
            if stale is not None and stale.pid != os.getpid():
                log.info(
                    "taking over the %s lock of %s left by %s (that process is gone)",
                    self.stage,
                    self.directory,
                    stale.describe(),
                )
            self._fd = fd
            _write_holder(fd, self.stage)
            return self
        raise SysbenchError(f"{self.path}: the lock file keeps being replaced; is another process removing it?")

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        # Unlink while still holding it; a process that opened the old file sees it gone and re-opens.
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(fd)

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as error:
            raise SysbenchError(f"{self.path.parent}: cannot write into this directory ({_reason(error)})") from None

    def __enter__(self) -> StageLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextmanager
def stage_lock(
    directory: str | Path, stage: str, *, enabled: bool = True, lock_file: Path | None = None
) -> Iterator[StageLock | None]:
    """Hold the ``stage`` lock of ``directory`` for the block; ``enabled=False`` (non-primary ranks) takes none.

    ``lock_file`` puts the lock elsewhere than ``directory/.<stage>.lock``: ``import-upstream``
    builds its run directory beside the final one and renames it, so it locks in the parent.
    """
    if not enabled:
        yield None
        return
    lock = StageLock(directory, stage, lock_file).acquire()
    try:
        yield lock
    finally:
        lock.release()


def _write_holder(fd: int, stage: str) -> None:
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    holder = LockHolder(pid=os.getpid(), host=socket.gethostname(), started=started, stage=stage)
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(asdict(holder)).encode("utf-8"), 0)


def _wait_for_holder(fd: int, attempts: int = _HOLDER_READS, pause_s: float = _HOLDER_PAUSE_S) -> LockHolder | None:
    """The holder of a busy lock; it writes its name just after locking, so an empty file is read again briefly."""
    for attempt in range(attempts):
        holder = _read_holder(fd)
        if holder is not None or attempt == attempts - 1:
            return holder
        time.sleep(pause_s)
    return None


def _read_holder(fd: int) -> LockHolder | None:
    try:
        data = os.pread(fd, 4096, 0)
        obj = json.loads(data.decode("utf-8"))
        return LockHolder(
            pid=int(obj["pid"]), host=str(obj["host"]), started=str(obj["started"]), stage=str(obj["stage"])
        )
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None  # empty (a holder between lock and write) or not ours: only the name is lost
