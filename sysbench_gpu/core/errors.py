"""One exception type for problems a user can fix; the CLI prints it as one line."""

from __future__ import annotations


class SysbenchError(Exception):
    """A user-facing error: bad input file, inconsistent run directory, missing data.

    The message names the file, session, turn and field where they are known. The
    CLI prints ``error: <message>`` and exits with status 2, without a traceback.
    """


def where(path: object = None, system_id: object = None, turn: object = None, field: str | None = None) -> str:
    """Format a location prefix such as ``sessions.json: session 12, turn 3, field 'criteria'``."""
    parts = []
    if system_id is not None:
        parts.append(f"session {system_id}")
    if turn is not None:
        parts.append(f"turn {turn}")
    if field is not None:
        parts.append(f"field {field!r}")
    location = ", ".join(parts)
    if path is not None:
        return f"{path}: {location}" if location else f"{path}"
    return location
