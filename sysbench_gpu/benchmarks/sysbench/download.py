"""The official SysBench file, fetched at the pinned commit; its sha256 is checked before anything is written."""

from __future__ import annotations

import hashlib
from pathlib import Path

from sysbench_gpu.benchmarks.sysbench.data import (
    OFFICIAL_COMMIT,
    OFFICIAL_FILENAME,
    OFFICIAL_PATH,
    OFFICIAL_REPO,
    OFFICIAL_SHA256,
    OFFICIAL_URL,
)
from sysbench_gpu.core.errors import SysbenchError


def download_official(dest: Path, url: str = OFFICIAL_URL, timeout: float = 60.0) -> Path:
    """Fetch the official file at the pinned commit and verify its sha256 before keeping it."""
    import urllib.error
    import urllib.request

    dest = Path(dest)
    target = dest / OFFICIAL_FILENAME if dest.is_dir() or not dest.suffix else dest
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (fixed https URL)
            payload = response.read()
    except (urllib.error.URLError, TimeoutError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise SysbenchError(
            f"could not download {url}: {reason}. Offline? Copy {OFFICIAL_PATH} from {OFFICIAL_REPO} "
            f"at commit {OFFICIAL_COMMIT} and pass its path with --data."
        ) from None
    digest = hashlib.sha256(payload).hexdigest()
    if digest != OFFICIAL_SHA256:
        raise SysbenchError(f"downloaded {url} but its sha256 is {digest}, expected {OFFICIAL_SHA256}; nothing written")
    partial = target.with_suffix(target.suffix + ".part")
    partial.write_bytes(payload)
    partial.replace(target)
    return target
