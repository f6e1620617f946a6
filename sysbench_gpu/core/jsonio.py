"""Reading JSON from files a user can hand us, with every failure as one clear line.

``json.loads`` raises ``RecursionError`` on deeply nested input (``[[[[...]]]]``)
and ``UnicodeDecodeError`` on bytes that are not UTF-8; both would otherwise reach
the user as a traceback. Every reader of data files and run-directory files goes
through :func:`loads` (or :func:`read_json`), which turns them into a
:class:`SysbenchError` naming the source.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sysbench_gpu.core.errors import SysbenchError


class JsonReadError(SysbenchError):
    """Text that is not JSON we can read; ``truncated`` when it looks cut off."""

    def __init__(self, message: str, truncated: bool = False) -> None:
        super().__init__(message)
        self.truncated = truncated


def decode_utf8(data: bytes, source: object) -> str:
    """UTF-8 text of a file's bytes; one :class:`JsonReadError` naming ``source`` otherwise."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.reason == "unexpected end of data":
            raise JsonReadError(
                f"{source}: not valid JSON: it ends inside a character at byte {error.start} (the file looks "
                "truncated)",
                truncated=True,
            ) from None
        raise JsonReadError(f"{source}: not UTF-8 text ({error.reason} at byte {error.start})") from None


def loads(data: bytes | str, source: object, **options: Any) -> Any:
    """``json.loads`` with every failure as one :class:`JsonReadError` naming ``source``."""
    text = decode_utf8(data, source) if isinstance(data, bytes) else data
    try:
        return json.loads(text, **options)
    except json.JSONDecodeError as error:
        truncated = error.pos >= len(text.rstrip()) - 1
        hint = " (the file looks truncated)" if truncated else ""
        raise JsonReadError(
            f"{source}: not valid JSON at line {error.lineno}, column {error.colno}: {error.msg}{hint}",
            truncated=truncated,
        ) from None
    except RecursionError:
        raise JsonReadError(
            f"{source}: JSON nested too deeply to read (a file of this kind never nests so deep)"
        ) from None


def read_json(path: str | Path, expect: type | None = None, what: str = "") -> Any:
    """Load a JSON file; ``expect`` (dict or list) checks the top-level type."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise SysbenchError(f"{path}: is a directory, expected a JSON file") from None
    except OSError as error:
        raise SysbenchError(f"{path}: cannot read ({error.strerror or error})") from None
    value = loads(data, path)
    if expect is not None and not isinstance(value, expect):
        kind = "a JSON object" if expect is dict else "a JSON array" if expect is list else expect.__name__
        raise SysbenchError(f"{path}: expected {kind}{' of ' + what if what else ''}, found {json_type(value)}")
    return value


def json_type(value: Any) -> str:
    """How a JSON value's type reads in an error message (``an array``, ``a string``, ...)."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"
