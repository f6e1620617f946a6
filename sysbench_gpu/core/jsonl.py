"""Append-only JSONL files: whole lines under an exclusive lock, torn tails, keys seen so far.

A line is written with one ``write`` on a file opened with ``O_APPEND``, under an
exclusive ``flock``, then ``fsync``'ed; a crash leaves at most a torn last line
(no final newline). Readers skip a torn last line and the next append cuts it
off before writing. :class:`KeyIndex` keeps the keys of the lines already read,
reading only the bytes appended since, so that a writer can check every new key
against the file itself under the lock without re-reading the whole file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sysbench_gpu.core.errors import SysbenchError

_REOPENS = 5


def complete_lines(data: bytes, first_line: int = 1) -> Iterator[tuple[int, bytes]]:
    """(line number, line) for every newline-terminated, non-blank line; a torn last line is skipped."""
    lines = data.split(b"\n")
    # After the final newline split() leaves b""; without one, the last piece is torn.
    for offset, line in enumerate(lines[:-1]):
        if line.strip():
            yield first_line + offset, line


def _lock(fd: int) -> None:
    try:
        import fcntl
    except ImportError:  # not POSIX: a single writer per run directory is then the rule
        return
    fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd is closed


def same_file(fd: int, path: Path) -> bool:
    """Whether ``fd`` is still the file at ``path`` (not replaced or unlinked since it was opened)."""
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def open_locked(path: Path) -> int:
    """Open ``path`` for appending under an exclusive lock, its torn tail cut; the caller closes the fd."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(_REOPENS):
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as error:
            raise SysbenchError(f"{path}: cannot open for writing ({error.strerror or error})") from None
        _lock(fd)
        if same_file(fd, path):  # not replaced (e.g. by an atomic rewrite) while we waited
            _cut_torn_tail(fd)
            return fd
        os.close(fd)
    raise SysbenchError(f"{path}: the file keeps being replaced while we try to append to it")


def _cut_torn_tail(fd: int) -> None:
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    position, chunk = size, 1 << 16
    while position > 0:
        start = max(0, position - chunk)
        index = os.pread(fd, position - start, start).rfind(b"\n")
        if index >= 0:
            os.ftruncate(fd, start + index + 1)
            return
        position = start
    os.ftruncate(fd, 0)


def write_all(fd: int, data: bytes, path: Path) -> None:
    written = os.write(fd, data)
    if written != len(data):
        raise SysbenchError(f"{path}: short write ({written} of {len(data)} bytes); disk full?")


def append_lines(path: Path, lines: Iterable[bytes]) -> int:
    """Append whole lines (each ending in a newline) in one locked, fsync'ed write."""
    data = b"".join(lines)
    if not data:
        return 0
    fd = open_locked(path)
    try:
        write_all(fd, data, path)
        os.fsync(fd)
    finally:
        os.close(fd)
    return data.count(b"\n")


@dataclass
class KeyIndex:
    """The keys of the complete lines of one file, as far as it has been read."""

    key_of: Callable[[object], Hashable]  # a parsed line -> its key (raises ValueError/KeyError/TypeError)
    identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file read
    offset: int = 0
    lines: int = 0
    keys: set = field(default_factory=set)

    def refresh(self, fd: int, path: Path) -> set:
        """Read what was appended since the last call (all of it if the file was replaced or cut)."""
        status = os.fstat(fd)
        identity = (status.st_dev, status.st_ino)
        if identity != self.identity or status.st_size < self.offset:
            self.identity, self.offset, self.lines, self.keys = identity, 0, 0, set()
        if status.st_size > self.offset:
            data = os.pread(fd, status.st_size - self.offset, self.offset)
            end = data.rfind(b"\n") + 1  # the caller cut any torn tail; stop at the last newline regardless
            for number, line in complete_lines(data[:end], self.lines + 1):
                try:
                    self.keys.add(self.key_of(json.loads(line)))
                except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
                    raise SysbenchError(f"{path}: line {number} is not a valid record") from None
            self.lines += data[:end].count(b"\n")
            self.offset += end
        return self.keys

    def wrote(self, data: bytes, keys: Iterable[Hashable]) -> None:
        """Our own append (under the same lock) is known without reading it back."""
        self.offset += len(data)
        self.lines += data.count(b"\n")
        self.keys.update(keys)
