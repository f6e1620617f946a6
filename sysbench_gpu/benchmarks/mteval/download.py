"""MT-Eval's task files fetched from the Hugging Face hub, each checked to load before it is written; offline, one line
says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from sysbench_gpu.benchmarks.mteval.data import parse_dialogues
from sysbench_gpu.benchmarks.mteval.tasks import (
    HF_CONFIGS,
    HF_DATASET,
)
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.rundir import write_bytes_atomic


def download_mteval(dest: Path, configs: Sequence[str] = HF_CONFIGS, revision: str | None = None) -> list[Path]:
    """Fetch ``<config>.jsonl`` of each config from the hub, check that it loads, write it atomically into ``dest``."""
    unknown = [c for c in configs if c not in HF_CONFIGS]
    if unknown:
        raise SysbenchError(f"unknown MT-Eval config(s) {', '.join(unknown)} (known: {', '.join(HF_CONFIGS)})")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise SysbenchError(
            "data download --benchmark mteval needs huggingface_hub (pip install huggingface_hub)"
        ) from None
    dest = Path(dest)
    written: list[Path] = []
    for config in configs:
        filename = f"{config}.jsonl"
        try:
            unreachable = _hub_unreachable()
            if unreachable:
                raise ConnectionError(unreachable)
            with _quiet_hub_logs():
                cached = hf_hub_download(HF_DATASET, filename, repo_type="dataset", revision=revision)
        except Exception as error:  # noqa: BLE001 - any hub failure means no file; say so in one line
            raise SysbenchError(
                f"could not download {filename} of the Hugging Face dataset {HF_DATASET}: {_hub_reason(error)}. "
                "Offline? Copy MT-Eval's task files from the dataset or the MT-Eval repository and pass one with "
                "--data."
            ) from None
        payload = Path(cached).read_bytes()
        parse_dialogues(payload.decode("utf-8"), source=f"{HF_DATASET}/{filename}")
        target = dest / filename
        write_bytes_atomic(target, payload)
        written.append(target)
    return written


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _hub_unreachable() -> str | None:
    """Why the hub cannot be reached, found with one TCP connect (the client would retry for half a minute).

    Skipped behind a proxy, and in offline mode (the client then answers from its cache).
    """
    if _hub_offline() or any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    endpoint = urlparse(constants.ENDPOINT)
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=10).close()
    except OSError as error:
        return f"cannot reach {host}:{port} ({getattr(error, 'strerror', None) or error})"
    return None


@contextlib.contextmanager
def _quiet_hub_logs() -> Iterator[None]:
    # The hub client logs every retry as a warning; the one-line error below says what matters.
    hub_logger = logging.getLogger("huggingface_hub")
    level = hub_logger.level
    hub_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hub_logger.setLevel(level)


def _hub_reason(error: BaseException) -> str:
    if _hub_offline():
        return "HF_HUB_OFFLINE is set and the file is not in the local hub cache"
    if isinstance(error, ConnectionError) and error.args:
        return str(error.args[0])
    text = " ".join(str(error).split()) or type(error).__name__
    return f"{type(error).__name__}: {text[:200]}"
