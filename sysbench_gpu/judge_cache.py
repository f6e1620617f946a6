"""Content-addressed cache of judge replies, one small JSON file per question.

The key is the sha256 of a canonical JSON of (judge backend and model, template
hash, the full prompt, the sampling settings, the attempt number). The attempt
number is part of the key because retries at temperature 0 must be able to get a
different reply from an API; replaying a run from the cache then replays the same
sequence of replies, so a rerun or a resume never asks the same question twice.

Files live in ``ROOT/<first two hex digits>/<key>.json`` and are written to a
temporary file in the same folder, fsync'ed and renamed, so a crash never leaves
a half-written entry that a later run would trust.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

CACHE_DIRNAME = "judge_cache"


@dataclass(frozen=True)
class CachedReply:
    text: str
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None


def cache_key(judge: str, model: str, template_sha256: str, prompt: str, sampling: Mapping[str, Any]) -> str:
    payload = {
        "judge": judge,
        "model": model,
        "template": template_sha256,
        "prompt": prompt,
        "sampling": dict(sorted(sampling.items())),
    }
    canonical = json.dumps(payload, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class JudgeCache:
    """Replies by key under ``root``; safe for concurrent readers and writers."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path_for(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> CachedReply | None:
        path = self.path_for(key)
        try:
            obj = json.loads(path.read_text(encoding="utf-8"))
            return CachedReply(
                text=obj["text"],
                prompt_tokens=obj.get("prompt_tokens"),
                output_tokens=obj.get("output_tokens"),
                finish_reason=obj.get("finish_reason"),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return None  # an unreadable entry is a miss; the fresh reply overwrites it

    def put(self, key: str, reply: CachedReply) -> None:
        path = self.path_for(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=f".{key[:8]}-", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(asdict(reply), handle, ensure_ascii=False)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, path)
        except BaseException:
            if os.path.exists(temp):
                os.unlink(temp)
            raise

    def __len__(self) -> int:
        if not self.root.is_dir():
            return 0
        return sum(1 for _ in self.root.glob("??/*.json"))
