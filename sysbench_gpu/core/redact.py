"""One redaction function for secrets: every log line, error text, manifest field and stored reply.

:func:`redact` removes

- the values of known secrets: those registered by the code that read them (the
  openai engine registers the API key it read from ``--api-key-env``, whatever the
  variable's name, and the credentials inside ``--base-url``), and the values of
  environment variables whose names end in ``KEY``, ``TOKEN``, ``SECRET``,
  ``PASSWORD`` (``OPENAI_API_KEY``, ``HF_TOKEN``, ...);
- the userinfo of URLs (``http://user:KEY@host`` -> ``http://[REDACTED]@host``) and
  the values of credential-like query parameters (``?api-key=KEY``, ``&token=...``);
- ``Authorization:`` header values, ``Bearer <token>`` strings and ``sk-...``-style
  keys, such as a server echoes in a 401 body.

The registry of known secrets is process-wide on purpose, like logging itself: a
log filter or an error printed by the CLI must see the secrets that an engine read
deep inside a stage. It only ever grows, and holds nothing else.

:func:`install_log_redaction` adds a filter to the root logger's handlers and to the
``sysbench_gpu``, ``openai``, ``httpx`` and ``httpcore`` loggers.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

REDACTED = "[REDACTED]"
PLACEHOLDERS = frozenset({"EMPTY", "none", "None", "null", "dummy", "sk-no-key-required"})
LOGGERS = ("sysbench_gpu", "openai", "httpx", "httpx2", "httpcore")
_MIN_REGISTERED = 4  # shorter values would redact ordinary words
_MIN_FROM_ENV = 12  # environment guesses: only long, key-like values
_SECRET_ENV_NAME = re.compile(r"(?:^|_)(?:API_?KEY|KEY|TOKEN|SECRET|PASSWORD|PASSWD|PWD)$", re.IGNORECASE)

_URL_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.\-]*://)(?P<userinfo>[^/\s@?#'\"<>]+)@")
_QUERY_SECRET = re.compile(
    r"(?P<head>[?&;](?:api[-_]?key|x[-_]api[-_]key|key|token|access[-_]?token|auth|secret|client[-_]secret|"
    r"password|passwd|pwd|sig|signature)=)(?P<value>[^&#\s'\"<>]+)",
    re.IGNORECASE,
)
_AUTH_HEADER = re.compile(
    r"(?P<head>\b(?:proxy-)?authorization['\"]?\s*[:=]\s*['\"]?(?:(?:bearer|basic|token)\s+)?)(?P<value>[^\s'\",}]+)",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(?P<head>\bbearer\s+)(?P<value>[A-Za-z0-9\-._~+/*]{6,}=*)", re.IGNORECASE)
_SK_KEY = re.compile(r"\bsk-[A-Za-z0-9_\-*.]{8,}")

_registered: set[str] = set()
_registry_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """Treat ``value`` as a secret from now on (too short or placeholder values are ignored)."""
    if not value or value in PLACEHOLDERS or len(value) < _MIN_REGISTERED:
        return
    with _registry_lock:
        _registered.add(value)
        encoded = quote(value, safe="")
        if encoded != value:
            _registered.add(encoded)


def register_secret_env(name: str | None) -> None:
    """Treat the value of environment variable ``name`` as a secret (the ``--api-key-env`` variable)."""
    if name:
        register_secret(os.environ.get(name))


def register_url_secrets(url: str | None) -> None:
    """The password (or lone user name) and the query values of a URL become secrets."""
    if not url:
        return
    try:
        parts = urlsplit(url)
        password, username = parts.password, parts.username
    except ValueError:
        return
    register_secret(unquote(password) if password else unquote(username) if username else None)
    for _, value in parse_qsl(parts.query, keep_blank_values=False):
        register_secret(value)


def known_secrets() -> list[str]:
    """Registered secrets and key-like environment values, longest first."""
    with _registry_lock:
        values = set(_registered)
    for name, value in os.environ.items():
        if (
            _SECRET_ENV_NAME.search(name)
            and len(value) >= _MIN_FROM_ENV
            and not any(ch.isspace() for ch in value)
            and not value.startswith(("/", "."))
            and value not in PLACEHOLDERS
        ):
            values.add(value)
    return sorted(values, key=len, reverse=True)


def redact(text: str) -> str:
    """``text`` with every secret this module knows of replaced by ``[REDACTED]``."""
    if not text:
        return text
    for secret in known_secrets():
        if secret in text:
            text = text.replace(secret, REDACTED)
    text = _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    text = _QUERY_SECRET.sub(lambda m: f"{m.group('head')}{REDACTED}", text)
    text = _AUTH_HEADER.sub(_keep_head, text)
    text = _BEARER.sub(_keep_head, text)
    return _SK_KEY.sub(REDACTED, text)


def _keep_head(match: re.Match[str]) -> str:
    return match.group("head") + (match.group("value") if match.group("value") == REDACTED else REDACTED)


def redact_obj(obj: Any) -> Any:
    """A JSON-like value with :func:`redact` applied to every string in it (keys included)."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {redact(k) if isinstance(k, str) else k: redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_obj(v) for v in obj]
    return obj


def redact_url(url: str) -> str:
    """A URL for display: no userinfo, no query string, no fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}" if parts.scheme else redact(url)


class RedactingFilter(logging.Filter):
    """Rewrites a record's message (and its formatted traceback) through :func:`redact`."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 (a malformed record: let logging report it as usual)
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def install_log_redaction(handlers: Iterable[logging.Handler] = ()) -> None:
    """Add one :class:`RedactingFilter` to the root handlers, ``handlers`` and the named loggers (idempotent)."""
    shared = RedactingFilter()
    targets: list[logging.Filterer] = [*logging.getLogger().handlers, *handlers]
    targets += [logging.getLogger(name) for name in LOGGERS]
    for target in targets:
        if not any(isinstance(f, RedactingFilter) for f in target.filters):
            target.addFilter(shared)
