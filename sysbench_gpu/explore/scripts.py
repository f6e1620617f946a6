"""The explorer's data files: JSON values written as scripts, so the site opens from disk without a server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["js_assignment", "keyed_assignment", "read_data_file"]


def js_assignment(target: str, value: Any) -> bytes:
    """``target = <JSON>;`` as a script. JSON is valid JavaScript; ``</`` and U+2028/9 are escaped anyway."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    text = text.replace("</", "<\\/").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return f"{target} = {text};\n".encode()


def keyed_assignment(name: str, key: str, value: Any) -> bytes:
    """A data file that adds one entry to ``window[name]`` under its session's key."""
    head = f"window.{name} = window.{name} || {{}};\n".encode()
    return head + js_assignment(f"window.{name}[{json.dumps(str(key))}]", value)


def read_data_file(path: Path) -> Any:
    """The JSON value of a data file written by :func:`js_assignment` (for tests and checks)."""
    text = path.read_text(encoding="utf-8")
    body = text.rstrip().rsplit("\n", 1)[-1]
    value = body.split(" = ", 1)[1].rstrip(";")
    return json.loads(value)
