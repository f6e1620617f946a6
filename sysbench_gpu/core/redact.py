"""Keeping secrets out of logs, errors and run-directory files, without touching a user's own fields.

Two kinds of treatment, for two kinds of text:

- **Structure** (:func:`redact_settings`, :func:`redact_headers`, :func:`redact_environment`,
  :func:`redact_url_credentials`): where a secret sits is known from the shape of the data.
  A settings field whose name says key, token, secret or password; an ``Authorization``
  header; the userinfo and credential query parameters of a URL; a key-like environment
  variable. Only those places are rewritten. The model name, data and output paths,
  labels and every other setting are stored exactly as the user gave them, even when
  they happen to equal the key (a local server started with ``--api-key stub`` for a
  model called ``stub``).
- **Free text that a server or a model returns** (error messages, replies, judge
  reasoning, log lines): :class:`Secrets` holds the secret values that this command
  read (the ``--api-key-env`` variable, credentials in ``--base-url``, key-like
  environment variables) and replaces each one of at least :data:`MIN_HUNTED`
  characters, counting the hits in a :class:`RedactionTally` for the manifest. A
  shorter key would hit ordinary words, so it is never hunted for in free text; it is
  still never written as a key value, since no key value is ever written.

A :class:`Secrets` object is built once per command (by the CLI, or by an engine for a
library user) and passed down to whatever writes or logs; there is no process-wide
registry of secrets. What cannot be guaranteed: a short key echoed inside free text, or
a key that a model prints transformed (spelled out, split, encoded).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

REDACTED = "[REDACTED]"
MIN_HUNTED = 8  # shorter values would redact ordinary words in replies and errors
MIN_FROM_ENV = 12  # environment guesses: only long, key-like values
PLACEHOLDERS = frozenset({"EMPTY", "none", "None", "null", "dummy", "sk-no-key-required"})
LOGGERS = ("sysbench_gpu", "openai", "httpx", "httpx2", "httpcore")

# A field or variable name that says it holds a secret: ..._KEY, api-key, token, secret, password.
# "max_tokens", "api_key_env" and "num_key_value_heads" end in another word, so they are not secrets.
_SECRET_NAME = re.compile(
    r"(?:^|[_\-.])(?:api[_\-]?key|apikey|key|token|access[_\-]?token|secret|client[_\-]?secret|password|passwd|pwd|"
    r"authorization|auth|credentials?)$",
    re.IGNORECASE,
)
_SECRET_HEADER = re.compile(r"^(?:(?:proxy-)?authorization|api-key|x-api-key|cookie|set-cookie)$", re.IGNORECASE)

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


def is_secret_name(name: str) -> bool:
    """Whether a settings field, header or environment variable called ``name`` holds a secret."""
    return bool(_SECRET_NAME.search(name))


@dataclass(frozen=True)
class Secrets:
    """The secret values one command knows of; hunted for in free text when long enough."""

    values: frozenset[str] = frozenset()

    @classmethod
    def gather(
        cls,
        api_key_env: str | None = "OPENAI_API_KEY",
        base_url: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Secrets:
        """The key in ``api_key_env``, credentials in ``base_url`` and long key-like environment values."""
        environ = os.environ if environ is None else environ
        found = [environ.get(api_key_env) if api_key_env else None, *url_secrets(base_url)]
        for name, value in environ.items():
            if (
                is_secret_name(name)
                and len(value) >= MIN_FROM_ENV
                and not any(ch.isspace() for ch in value)
                and not value.startswith(("/", "."))
            ):
                found.append(value)
        return cls().adding(*found)

    def adding(self, *values: str | None) -> Secrets:
        """These secrets and ``values`` (empty values and placeholders such as ``EMPTY`` are not secrets)."""
        kept = {v for v in values if v and v not in PLACEHOLDERS}
        return self if kept <= self.values else Secrets(self.values | kept)

    def adding_url(self, url: str | None) -> Secrets:
        return self.adding(*url_secrets(url))

    def hunted(self) -> list[str]:
        """The values looked for in free text, with their URL-encoded forms, longest first."""
        forms: set[str] = set()
        for value in self.values:
            if len(value) >= MIN_HUNTED:
                forms.add(value)
                forms.add(quote(value, safe=""))
        return sorted(forms, key=len, reverse=True)

    def scrub_reply(self, text: str) -> tuple[str, int]:
        """A server's or model's reply with every hunted secret replaced, and the number of hits.

        Only known values are replaced: a reply may rightly hold URLs or the word "Bearer".
        """
        hits = 0
        if not text:
            return text, 0
        for secret in self.hunted():
            count = text.count(secret)
            if count:
                hits += count
                text = text.replace(secret, REDACTED)
        return text, hits

    def scrub_counted(self, text: str) -> tuple[str, int]:
        """Error or log text: hunted secrets, then credentials found by their shape; and the number of hits."""
        text, hits = self.scrub_reply(text)
        if not text:
            return text, hits
        text, shaped = scrub_shapes(text)
        return text, hits + shaped

    def scrub(self, text: str) -> str:
        return self.scrub_counted(text)[0]


def url_secrets(url: str | None) -> list[str]:
    """The password (or lone user name) and the query values of ``url``."""
    if not url:
        return []
    try:
        parts = urlsplit(url)
        password, username = parts.password, parts.username
    except ValueError:
        return []
    found = [unquote(password) if password else unquote(username) if username else ""]
    found += [value for _, value in parse_qsl(parts.query, keep_blank_values=False)]
    return [value for value in found if value]


def scrub_shapes(text: str) -> tuple[str, int]:
    """``text`` with URL userinfo, credential query values, auth headers, bearer and ``sk-`` keys replaced."""
    hits = 0

    def count(replacement: str) -> str:
        nonlocal hits
        hits += 1
        return replacement

    text = _URL_USERINFO.sub(
        lambda m: m.group(0) if m.group("userinfo") == REDACTED else count(f"{m.group('scheme')}{REDACTED}@"),
        text,
    )

    def keep_head(match: re.Match[str]) -> str:
        if match.group("value") == REDACTED:
            return match.group(0)
        return count(match.group("head") + REDACTED)

    text = _QUERY_SECRET.sub(keep_head, text)
    text = _AUTH_HEADER.sub(keep_head, text)
    text = _BEARER.sub(keep_head, text)
    text = _SK_KEY.sub(lambda m: count(REDACTED), text)
    return text, hits


def redact_url_credentials(url: str) -> str:
    """``url`` with its userinfo and credential query values replaced; the rest unchanged."""
    return scrub_shapes(url)[0] if "://" in url or "?" in url else url


def redact_url(url: str) -> str:
    """A URL for display: no userinfo, no query string, no fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}" if parts.scheme else redact_url_credentials(url)


def redact_settings(value: Any) -> Any:
    """A JSON-like value with secret-named fields and URL credentials replaced; nothing else is touched.

    Used on every manifest write and on both sides of every manifest comparison, so a
    rerun of the same command always matches what it stored.
    """
    if isinstance(value, dict):
        return {
            key: REDACTED
            if isinstance(key, str) and is_secret_name(key) and isinstance(item, str) and item
            else redact_settings(item)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact_settings(item) for item in value]
    if isinstance(value, str) and "://" in value:
        return redact_url_credentials(value)
    return value


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Request or response headers for a log or a file: credential headers replaced."""
    return {name: REDACTED if _SECRET_HEADER.match(name) else value for name, value in headers.items()}


def redact_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """An environment snapshot: values of secret-named variables replaced, URL credentials removed."""
    return {
        name: REDACTED if is_secret_name(name) and value else redact_url_credentials(value)
        for name, value in environ.items()
    }


@dataclass
class RedactionTally:
    """How many secrets were replaced, per kind of text; thread-safe, for the manifest."""

    counts: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, where: str, hits: int) -> None:
        if hits:
            with self._lock:
                self.counts[where] += hits

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(sorted(self.counts.items()))


class RedactingFilter(logging.Filter):
    """Rewrites a record's message (and its formatted traceback) through ``secrets.scrub``."""

    def __init__(self, secrets: Secrets) -> None:
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 (a malformed record: let logging report it as usual)
            return True
        cleaned = self.secrets.scrub(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = self.secrets.scrub(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = self.secrets.scrub(record.exc_text)
        return True


def install_log_redaction(secrets: Secrets, handlers: Iterable[logging.Handler] = ()) -> RedactingFilter:
    """One :class:`RedactingFilter` for ``secrets`` on the root handlers, ``handlers`` and the named loggers.

    An earlier filter of ours on the same target is replaced, so a second command in
    one process (tests, notebooks) redacts with its own secrets.
    """
    shared = RedactingFilter(secrets)
    targets: list[logging.Filterer] = [*logging.getLogger().handlers, *handlers]
    targets += [logging.getLogger(name) for name in LOGGERS]
    for target in targets:
        for old in [f for f in target.filters if isinstance(f, RedactingFilter)]:
            target.removeFilter(old)
        target.addFilter(shared)
    return shared
