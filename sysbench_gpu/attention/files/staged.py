"""Outputs written all together or not at all (``attention-analyze``: heads, probe, decay and their figures).

A verb computes everything first and stages what it will write: JSON values are kept in memory,
figures are drawn into a private temporary folder. ``commit`` then writes every file to a
temporary file beside its target (fsync'ed) and, only when all of them are written, renames
each onto its target. A failure before the renames removes the temporary files and leaves the
targets as they were.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

from sysbench_gpu.core.errors import SysbenchError


class StagedOutputs:
    """Files to write at ``commit``; use as a context manager so the staging folder is removed."""

    def __init__(self) -> None:
        self._files: dict[Path, bytes | Path] = {}  # target -> its bytes, or the staged file holding them
        self._staging: Path | None = None

    def __enter__(self) -> StagedOutputs:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None

    @property
    def targets(self) -> list[Path]:
        return list(self._files)

    def json(self, path: Path, value: Any) -> None:
        """Stage ``value`` as ``path`` (indented JSON, as ``write_json_atomic`` writes it)."""
        self._files[Path(path)] = (json.dumps(value, ensure_ascii=False, indent=2) + "\n").encode("utf-8")

    def figure_base(self, base: Path) -> Path:
        """Where a figure function should draw ``base`` (``.png``, ``.pdf``); ``adopt`` stages what it drew."""
        if self._staging is None:
            self._staging = Path(tempfile.mkdtemp(prefix="sysbench-staged-"))
        return self._staging / str(len(list(self._staging.iterdir()))) / Path(base).name

    def adopt(self, drawn: list[Path], base: Path) -> list[Path]:
        """Stage the files a figure function drew (under ``figure_base(base)``) as the same names beside ``base``."""
        targets = [Path(base).parent / path.name for path in drawn]
        for path, target in zip(drawn, targets, strict=True):
            self._files[target] = path
        return targets

    def commit(self) -> list[Path]:
        """Write every staged file; all of them land, or none and one line naming the file that failed."""
        written: list[tuple[Path, Path]] = []  # (temporary, target)
        made: list[Path] = []  # folders made for the targets, removed again on failure
        try:
            for target, content in self._files.items():
                made += _make_parents(target.parent)
                data = content if isinstance(content, bytes) else content.read_bytes()
                written.append((_write_temporary(target, data), target))
        except OSError as error:
            for temporary, _ in written:
                with contextlib.suppress(OSError):
                    temporary.unlink()
            for folder in reversed(made):
                with contextlib.suppress(OSError):
                    folder.rmdir()
            where = getattr(error, "filename", None) or target
            raise SysbenchError(f"{where}: cannot write ({error.strerror or error}); nothing was written") from None
        for temporary, target in written:
            os.replace(temporary, target)
        self._files.clear()
        return [target for _, target in written]


def _make_parents(folder: Path) -> list[Path]:
    """Make ``folder`` and its missing parents; the ones made, outermost first."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        path.mkdir()
    return list(reversed(missing))


def _write_temporary(target: Path, data: bytes) -> Path:
    with tempfile.NamedTemporaryFile("wb", dir=target.parent, prefix=target.name, suffix=".tmp", delete=False) as f:
        temporary = Path(f.name)
        try:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        except OSError:
            temporary.unlink(missing_ok=True)
            raise
    os.chmod(temporary, 0o644)  # temporary files are created 0600; outputs are meant to be shared
    return temporary
