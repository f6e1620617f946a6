"""Keeping secrets out of logs, errors and run-directory files, without touching a user's own fields.

Three kinds of treatment, for three kinds of text:

- **JSON settings** (:func:`redact_settings`: manifests, ``--extra-body``): a field is a
  secret only when its name is one of :data:`SECRET_FIELDS` (case-insensitive, ``-`` read
  as ``_``), or when it is a credential header inside a headers object. ``eos_token``,
  ``stop_token``, ``cache_key`` and ``max_tokens`` are ordinary settings. In any other
  string, credentials are guessed by their shape only inside a URL (``scheme://...``): its
  userinfo, its credential query values, an ``sk-`` key in it. The text around the URL (a
  system message that mentions ``Authorization: Bearer <token>``) is stored as given, and
  so are the model name, data and output paths and labels, even when they happen to equal
  the key (a local server started with ``--api-key stub`` for a model called ``stub``).
- **Names that say secret** (:func:`is_secret_name`: environment variables and request
  headers): a broad match, ``HF_TOKEN``, ``WANDB_API_KEY``, ``X-Goog-Api-Key``. An
  environment value or a header value is never a user's setting, so a wide net costs nothing.
- **Text that a server or a model returns** (error messages, replies, judge reasoning, log
  lines, the model name a server reports): :class:`Secrets` holds the secret values that
  this command read (the ``--api-key-env`` variable, credentials in ``--base-url``,
  key-like environment variables) and replaces each one of at least :data:`MIN_HUNTED`
  characters, counting the hits in a :class:`RedactionTally` for the manifest. A shorter
  key would hit ordinary words, so it is never hunted for in free text; it is still never
  written as a key value, since no key value is ever written. Error and log text also loses
  anything shaped like a credential (``Bearer ...``, ``sk-...``), anywhere in it.

A :class:`Secrets` object is built once per command (by the CLI, or by an engine for a
library user) and passed down to whatever writes or logs; there is no process-wide
registry of secrets. What cannot be guaranteed: a short key echoed inside free text, a key
that a model prints transformed (spelled out, split, encoded), or a secret a user stores
under a field name that is not in :data:`SECRET_FIELDS` and that this command does not know.
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

# Environment variables and headers: any name that says key, token, secret or password
# (HF_TOKEN, WANDB_API_KEY, X-Auth-Token). "max_tokens", "api_key_env" and "num_key_value_heads"
# end in another word, so they are not secrets.
_SECRET_NAME = re.compile(
    r"(?:^|[_\-.])(?:api[_\-]?key|apikey|key|token|access[_\-]?token|secret|client[_\-]?secret|password|passwd|pwd|"
    r"authorization|auth|credentials?)$",
    re.IGNORECASE,
)
_SECRET_HEADER = re.compile(r"^(?:(?:proxy-)?authorization|api-key|x-api-key|cookie|set-cookie)$", re.IGNORECASE)

# JSON settings: exactly these field names (lower case, "-" read as "_") hold secrets. A fixed
# list, not a suffix: "eos_token", "stop_token", "cache_key" are a user's own settings. The
# list: what OpenAI-compatible clients, Hugging Face Hub, W&B, AWS and HTTP auth call a credential.
SECRET_FIELDS = frozenset(
    (  # noqa: SIM905 (grouped words under comments read better than 37 quoted names)
        # API keys
        "api_key apikey x_api_key api_secret api_token openai_api_key anthropic_api_key wandb_api_key "
        # tokens that authenticate (a vocabulary token is "eos_token", "stop_token": not listed)
        "token access_token refresh_token id_token auth_token bearer_token session_token hf_token hub_token "
        "huggingface_token hugging_face_hub_token aws_session_token "
        # secrets and passwords
        "secret secret_key client_secret secret_access_key aws_secret_access_key private_key "
        "password passwd pwd passphrase "
        # HTTP authentication
        "auth authorization proxy_authorization credential credentials cookie set_cookie"
    ).split()
)

_URL_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.\-]*://)(?P<userinfo>[^/\s@?#'\"<>]+)@")
_QUERY_NAMES = (
    r"(?:api[-_]?key|x[-_]api[-_]key|key|token|access[-_]?token|auth|secret|client[-_]secret|"
    r"password|passwd|pwd|sig|signature)"
)
_QUERY_SECRET = re.compile(rf"(?P<head>[?&;]{_QUERY_NAMES}=)(?P<value>[^&#\s'\"<>]+)", re.IGNORECASE)
# Inside a URL token the value stops before a closing bracket and trailing punctuation, so
# "(see https://h/x?token=abc)." keeps its ")." as the user wrote it.
_URL_QUERY_SECRET = re.compile(rf"(?P<head>[?&;]{_QUERY_NAMES}=)(?P<value>[^&#)]*[^&#).,;:!?])", re.IGNORECASE)
_AUTH_HEADER = re.compile(
    r"(?P<head>\b(?:proxy-)?authorization['\"]?\s*[:=]\s*['\"]?(?:(?:bearer|basic|token)\s+)?)(?P<value>[^\s'\",}]+)",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(?P<head>\bbearer\s+)(?P<value>[A-Za-z0-9\-._~+/*]{6,}=*)", re.IGNORECASE)
_SK_KEY = re.compile(r"\bsk-[A-Za-z0-9_\-*.]{8,}")
# A URL inside a string: scheme, "://", then up to whitespace, a quote, a backtick or an angle bracket.
_URL_TOKEN = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s'\"<>`]+")


def is_secret_name(name: str) -> bool:
    """Whether an environment variable or a header called ``name`` holds a secret (a broad match)."""
    return bool(_SECRET_NAME.search(name))


def is_secret_field(name: str) -> bool:
    """Whether a JSON settings field called ``name`` holds a secret: one of :data:`SECRET_FIELDS`."""
    return name.strip().lower().replace("-", "_") in SECRET_FIELDS


def is_secret_header(name: str) -> bool:
    """Whether a request or response header called ``name`` carries a credential."""
    return bool(_SECRET_HEADER.match(name)) or is_secret_name(name)


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

    def scrub_value(self, text: str, tally: RedactionTally | None = None, where: str = "values") -> str:
        """A short string a server returned (the model name it reports): hunted secrets and URL credentials.

        Unlike error text, nothing outside a URL is guessed at by its shape; hits go to ``tally[where]``.
        """
        text, hits = self.scrub_reply(text)
        text, shaped = scrub_url_tokens(text)
        if tally is not None:
            tally.add(where, hits + shaped)
        return text


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


def scrub_url_tokens(text: str) -> tuple[str, int]:
    """``text`` with credentials replaced inside each URL in it, and the number of hits; the rest unchanged.

    Inside a URL: its userinfo, the values of its credential query parameters, an ``sk-``
    key. Outside a URL nothing is guessed at: a system message may rightly say
    "send ``Authorization: Bearer <token>``".
    """
    if "://" not in text:
        return text, 0
    hits = 0

    def count(replacement: str) -> str:
        nonlocal hits
        hits += 1
        return replacement

    def keep_head(match: re.Match[str]) -> str:
        return match.group(0) if match.group("value") == REDACTED else count(match.group("head") + REDACTED)

    def scrub_one(url: re.Match[str]) -> str:
        token = _URL_USERINFO.sub(
            lambda m: m.group(0) if m.group("userinfo") == REDACTED else count(f"{m.group('scheme')}{REDACTED}@"),
            url.group(0),
        )
        token = _URL_QUERY_SECRET.sub(keep_head, token)
        return _SK_KEY.sub(lambda m: count(REDACTED), token)

    return _URL_TOKEN.sub(scrub_one, text), hits


def redact_url_credentials(url: str) -> str:
    """``url`` (or any string) with credentials replaced inside each URL in it; the rest unchanged."""
    return scrub_url_tokens(url)[0]


def redact_url(url: str) -> str:
    """A URL for display: no userinfo, no query string, no fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    # Without a scheme the whole string is still the URL a user gave: credential shapes anywhere in it go.
    return f"{parts.scheme}://{host}{parts.path}" if parts.scheme else scrub_shapes(url)[0]


def redact_settings(value: Any, secrets: Secrets | None = None) -> Any:
    """A JSON-like value with secret fields and URL credentials replaced; nothing else is touched.

    A field is a secret when its name is in :data:`SECRET_FIELDS`, or when it is a credential
    header (:func:`is_secret_header`) inside an object whose name ends in ``headers``. Every
    other string keeps its text, apart from credentials inside a URL in it
    (:func:`scrub_url_tokens`) and, where ``secrets`` is given, the known secret values it
    holds literally. Used on every manifest write and on both sides of every manifest
    comparison, so a rerun of the same command always matches what it stored.
    """
    return _redact(value, secrets, in_headers=False)


def _redact(value: Any, secrets: Secrets | None, in_headers: bool) -> Any:
    if isinstance(value, dict):
        treated: dict[Any, Any] = {}
        for key, item in value.items():
            name = key if isinstance(key, str) else ""
            secret = is_secret_field(name) or (in_headers and is_secret_header(name))
            if secret and _holds_a_value(item):
                treated[key] = REDACTED
            else:
                headers = name.lower().replace("-", "_").endswith("headers")
                treated[key] = _redact(item, secrets, in_headers=headers)
        return treated
    if isinstance(value, (list, tuple)):
        return [_redact(item, secrets, in_headers=False) for item in value]
    if isinstance(value, str):
        text = secrets.scrub_reply(value)[0] if secrets is not None else value
        return scrub_url_tokens(text)[0]
    return value


def _holds_a_value(item: Any) -> bool:
    """A secret field's value worth hiding: not null, not a flag, not empty."""
    if item is None or isinstance(item, bool):
        return False
    if isinstance(item, (str, list, tuple, dict)):
        return len(item) > 0
    return True


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Request or response headers for a log or a file: credential headers replaced."""
    return {name: REDACTED if is_secret_header(name) else value for name, value in headers.items()}


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
