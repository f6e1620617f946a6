"""The ``openai`` engine: any OpenAI-compatible chat-completions endpoint.

Closed models (OpenAI itself), a running ``vllm serve``, or any other server that
speaks ``/v1/chat/completions``. Requests run on a bounded thread pool; each one
retries transient failures (429, 5xx, dropped connections, timeouts) with capped
exponential backoff and jitter (``engines.retry``). The client's own retries are
switched off, so ours are the only ones and they are counted.

The API key is read from the environment variable named by ``api_key_env`` and joins
the command's :class:`~sysbench_gpu.core.redact.Secrets`, together with any credentials
in ``base_url``. Error texts and replies are scrubbed with them, in case a server echoes
the key, and the hits are counted under ``redactions`` in ``describe()`` (the manifest).
The model name and every other setting are recorded as given.

``repetition_penalty`` is not a field of OpenAI's API, which refuses it and applies no such
penalty; vLLM's server and most others take it. So it is sent unless the endpoint is OpenAI's
own (``api.openai.com``), where 1.0 (no penalty) is what the API does anyway and another value
is refused in one line. ``describe()`` records whether the server takes it and what was sent.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any
from urllib.parse import urlparse

from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.jsonio import json_type
from sysbench_gpu.core.redact import RedactionTally, Secrets, redact_settings, redact_url
from sysbench_gpu.engines.base import Completion, SamplingSpec
from sysbench_gpu.engines.retry import (
    Clock,
    NotRetryable,
    Retryable,
    RetryCounter,
    RetryPolicy,
    call_with_retries,
    parse_retry_after,
)

log = logging.getLogger(__name__)

# A local server (vllm serve, llama.cpp) accepts any key; the client library insists on one.
PLACEHOLDER_KEY = "EMPTY"
# Status codes worth another try: timeout, conflict/lock, too early, rate limit; 5xx below.
RETRY_STATUS = frozenset({408, 409, 425, 429})
# The endpoint the client library talks to when no base URL is given.
OPENAI_API_URL = "https://api.openai.com/v1"
# OpenAI's own API: no repetition_penalty field (see the module doc).
NO_REPETITION_PENALTY_HOSTS = frozenset({"api.openai.com"})


# Request fields the tool sets itself, each with what sets them instead. The client library merges
# ``extra_body`` over the body's own fields, so an ``--extra-body`` holding one of these would send
# what the run does not record (the manifest's model and sampling), or break how replies are read.
RESERVED_BODY_FIELDS: dict[str, str] = {
    "model": "use --model",
    "messages": "the messages come from --data and --history",
    "max_tokens": "use --max-tokens",
    "max_completion_tokens": "use --max-tokens",
    "temperature": "use --temperature",
    "top_p": "use --top-p",
    "top_k": "use --top-k",
    "seed": "use --seed",
    "repetition_penalty": "use --repetition-penalty",
    "ignore_eos": "use --ignore-eos",
    "stream": "the tool reads whole replies, not streams",
    "n": "the tool records one reply per request",
}


def check_extra_body(body: Any, flag: str = "--extra-body") -> dict[str, Any]:
    """``body`` as a request's extra fields: a JSON object holding none of the fields the tool sets itself."""
    if not isinstance(body, Mapping):
        raise SysbenchError(f"{flag}: expected a JSON object, found {json_type(body)}")
    for name in body:
        if name in RESERVED_BODY_FIELDS:
            raise SysbenchError(f"{flag}: field {name!r} is one the tool sets itself; {RESERVED_BODY_FIELDS[name]}")
    return dict(body)


def server_takes_repetition_penalty(base_url: str | None) -> bool:
    """Whether the endpoint at ``base_url`` (None: OpenAI's API) takes a ``repetition_penalty`` field."""
    host = (urlparse(base_url or OPENAI_API_URL).hostname or "").lower()
    return host not in NO_REPETITION_PENALTY_HOSTS


def check_repetition_penalty(base_url: str | None, penalty: float | None) -> None:
    """Refuse a penalty the endpoint cannot apply; 1.0 (none) is what OpenAI's API does anyway.

    Called by ``generate`` before its run directory is touched, and again for every request.
    """
    if penalty is None or penalty == 1.0 or server_takes_repetition_penalty(base_url):
        return
    host = urlparse(base_url or OPENAI_API_URL).hostname
    raise SysbenchError(
        f"openai engine: {host} takes no repetition_penalty (OpenAI's API applies none); "
        f"drop --repetition-penalty {penalty:g}, or point --base-url at a server that takes it (vLLM's)"
    )


class OpenAIEngine:
    """Chat completions over HTTP with bounded concurrency and counted retries."""

    name = "openai"

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        concurrency: int = 8,
        max_retries: int = 6,
        timeout: float = 60.0,
        *,
        context_length: int | None = None,
        backoff_base_s: float = 1.0,
        backoff_max_s: float = 30.0,
        clock: Clock | None = None,
        rng_seed: int | None = None,
        secrets: Secrets | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        import openai  # lazy: the CLI must start without it

        if concurrency < 1:
            raise SysbenchError(f"openai engine: concurrency must be >= 1, got {concurrency}")
        if timeout <= 0:
            raise SysbenchError(f"openai engine: timeout must be > 0 seconds, got {timeout}")
        self.model = model
        self.is_primary = True
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        self.api_key_env = api_key_env
        self.concurrency = concurrency
        self.timeout = timeout
        self._context_length = context_length
        # Server-specific request fields sent with every request (vLLM's min_tokens, transformers
        # serve's generation_config); none of the fields the tool sets itself (RESERVED_BODY_FIELDS).
        self.extra_body = check_extra_body(extra_body or {})
        self.policy = RetryPolicy(max_retries=max_retries, base_delay_s=backoff_base_s, max_delay_s=backoff_max_s)
        self.retries = RetryCounter()
        self._clock = clock
        self._rng = random.Random(rng_seed)
        self._rng_lock = threading.Lock()
        self._seed_accepted: bool | None = None  # unknown until a seeded request comes back
        self.takes_repetition_penalty = server_takes_repetition_penalty(self.base_url)
        self._repetition_penalty_sent: float | None = None  # as the last request carried it

        api_key = os.environ.get(api_key_env) if api_key_env else None
        self.secrets = (secrets or Secrets()).adding(api_key).adding_url(self.base_url)
        self.redactions = RedactionTally()
        if not api_key:
            if self.base_url is None:
                raise SysbenchError(
                    f"openai engine: environment variable {api_key_env} is not set "
                    "(set it, or point --base-url at a local server that needs no key)"
                )
            api_key = PLACEHOLDER_KEY
        self._openai = openai
        self._client = openai.OpenAI(api_key=api_key, base_url=self.base_url, max_retries=0, timeout=timeout)

    # --- Engine protocol -------------------------------------------------

    def chat(
        self,
        conversations: Sequence[Sequence[ChatMessage]],
        sampling: SamplingSpec,
        request_ids: Sequence[str] | None = None,
    ) -> list[Completion]:
        """Send every conversation (at most ``concurrency`` at once); results in input order.

        ``request_ids`` (e.g. ``"session 12, turn 3"``) name requests in errors and logs.
        On the first request that fails for good, requests not yet started are
        cancelled and a :class:`SysbenchError` naming it is raised.
        """
        if request_ids is not None and len(request_ids) != len(conversations):
            raise SysbenchError(f"openai engine: {len(request_ids)} request ids for {len(conversations)} conversations")
        labels = (
            list(request_ids)
            if request_ids is not None
            else [f"request {i + 1} of {len(conversations)}" for i in range(len(conversations))]
        )
        if not conversations:
            return []
        results: list[Completion | None] = [None] * len(conversations)
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="openai") as pool:
            futures: dict[Future[Completion], int] = {
                pool.submit(self.chat_one, conversation, sampling, labels[i]): i
                for i, conversation in enumerate(conversations)
            }
            done, pending = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in done if f.exception() is not None]
            if failed:
                for future in pending:
                    future.cancel()
                # Report the earliest failed request in input order.
                first = min(failed, key=lambda f: futures[f])
                raise first.exception()  # type: ignore[misc]
            for future, index in futures.items():
                results[index] = future.result()
        return [r for r in results if r is not None]

    def chat_one(
        self, messages: Sequence[ChatMessage], sampling: SamplingSpec, request_id: str | None = None
    ) -> Completion:
        """One request with the same retries as ``chat`` (the judge calls this)."""
        label = f"{self.name} {self.model}: {request_id or 'request'}"
        payload = [{"role": m["role"], "content": m["content"]} for m in messages]
        kwargs = self._request_kwargs(sampling)

        def send() -> Any:
            try:
                return self._client.chat.completions.create(model=self.model, messages=payload, **kwargs)
            except self._openai.BadRequestError as error:
                if "seed" in kwargs and _mentions_seed(error):
                    # The server refuses per-request seeds: go on without, and say so once.
                    if self._seed_accepted is not False:
                        log.warning("%s: server rejected the 'seed' parameter; sending requests without it", label)
                    self._seed_accepted = False
                    kwargs.pop("seed", None)
                    return self._client.chat.completions.create(model=self.model, messages=payload, **kwargs)
                raise

        with self._rng_lock:
            rng = random.Random(self._rng.random())
        response, attempts, reasons = call_with_retries(
            send,
            policy=self.policy,
            classify=self._classify,
            label=label,
            clock=self._clock,
            rng=rng,
            counter=self.retries,
            secrets=self.secrets,
            tally=self.redactions,
        )
        if "seed" in kwargs and self._seed_accepted is None:
            self._seed_accepted = True
        return self._completion(response, label, attempts, reasons)

    def count_prompt_tokens(self, conversation: Sequence[ChatMessage]) -> int | None:
        return None  # the server applies its own template; we cannot tell before sending

    def supports_system_role(self) -> bool:
        return True  # chat-completions servers accept a system message

    def context_length(self) -> int | None:
        return self._context_length

    def describe(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "model": self.model,
            "base_url": redact_url(self.base_url) if self.base_url else "https://api.openai.com/v1",
            "api_key_env": self.api_key_env,  # the variable's name, never its value
            "concurrency": self.concurrency,
            "timeout_s": self.timeout,
            "retry_policy": {
                "max_retries": self.policy.max_retries,
                "base_delay_s": self.policy.base_delay_s,
                "max_delay_s": self.policy.max_delay_s,
                "multiplier": self.policy.multiplier,
                "jitter": self.policy.jitter,
            },
            "retries": self.retries.snapshot(),
            "redactions": self.redactions.snapshot(),  # secrets replaced in replies and error texts
            "seed_accepted": self._seed_accepted,
            "takes_repetition_penalty": self.takes_repetition_penalty,
            "repetition_penalty_sent": self._repetition_penalty_sent,
            "context_length": self._context_length,
            "extra_body": redact_settings(self.extra_body, self.secrets),
            "openai_version": getattr(self._openai, "__version__", None),
        }

    def close(self) -> None:
        self._client.close()

    # --- helpers -----------------------------------------------------------

    def _request_kwargs(self, sampling: SamplingSpec) -> dict[str, Any]:
        """Only the parameters the user set; the rest stays the server's default."""
        kwargs: dict[str, Any] = {}
        if sampling.max_tokens is not None:
            kwargs["max_tokens"] = sampling.max_tokens
        if sampling.temperature is not None:
            kwargs["temperature"] = sampling.temperature
        if sampling.top_p is not None:
            kwargs["top_p"] = sampling.top_p
        if sampling.seed is not None and self._seed_accepted is not False:
            kwargs["seed"] = sampling.seed
        # Not in OpenAI's API; vLLM's server (and others) read them from the body.
        extra_body: dict[str, Any] = dict(self.extra_body)
        if sampling.ignore_eos:
            extra_body["ignore_eos"] = True  # vLLM's server field; other servers: --extra-body
        if sampling.top_k is not None:
            extra_body["top_k"] = sampling.top_k
        penalty = sampling.repetition_penalty
        check_repetition_penalty(self.base_url, penalty)
        if penalty is not None and self.takes_repetition_penalty:
            extra_body["repetition_penalty"] = penalty
        # 1.0 to OpenAI's API is left out: no penalty is what it applies.
        self._repetition_penalty_sent = extra_body.get("repetition_penalty")
        if extra_body:
            kwargs["extra_body"] = extra_body
        if sampling.json_schema is not None:
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "response", "schema": sampling.json_schema, "strict": True},
            }
        return kwargs

    def _classify(self, error: BaseException) -> Retryable | None:
        openai = self._openai
        if isinstance(error, openai.APITimeoutError):
            return Retryable("timeout")
        if isinstance(error, openai.APIConnectionError):
            return Retryable("connection")
        if isinstance(error, openai.APIStatusError):
            status = error.status_code
            if status in RETRY_STATUS or status >= 500:
                return Retryable(str(status), parse_retry_after(dict(error.response.headers)))
        return None

    def _completion(self, response: Any, label: str, attempts: int, reasons: list[str]) -> Completion:
        choices = getattr(response, "choices", None) or []
        if not choices:
            raise NotRetryable(label, SysbenchError("the server answered with no choices"), self.secrets)
        choice = choices[0]
        message = getattr(choice, "message", None)
        text = getattr(message, "content", None) or ""
        usage = getattr(response, "usage", None)
        details = getattr(usage, "prompt_tokens_details", None) if usage is not None else None
        extra: dict[str, Any] = {"attempts": attempts}
        if reasons:
            extra["retry_reasons"] = list(reasons)
        served_model = getattr(response, "model", None)
        if served_model and served_model != self.model:
            extra["served_model"] = self.secrets.scrub_value(served_model, self.redactions, "served_model")
        text, hits = self.secrets.scrub_reply(text)
        self.redactions.add("replies", hits)
        return Completion(
            text=text,
            prompt_tokens=getattr(usage, "prompt_tokens", None) if usage is not None else None,
            output_tokens=getattr(usage, "completion_tokens", None) if usage is not None else None,
            cached_prompt_tokens=getattr(details, "cached_tokens", None) if details is not None else None,
            finish_reason=getattr(choice, "finish_reason", None),
            extra=extra,
        )


def _mentions_seed(error: BaseException) -> bool:
    return "seed" in str(error).lower()
