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
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.jsonio import json_type

CACHE_DIRNAME = "judge_cache"


class CacheEntryError(SysbenchError):
    """A cache entry of the wrong shape: the run stops and names the file (it is not a request failure)."""


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
        """The cached reply, or None; an entry that is JSON of the wrong shape is an error naming it.

        Entries are written atomically, so an entry that does not parse at all was
        damaged outside this program: it is a miss, and the fresh reply replaces it.
        """
        path = self.path_for(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            raise CacheEntryError(f"{path}: cannot read this judge cache entry ({error.strerror or error})") from None
        try:
            obj = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None
        except RecursionError:
            raise CacheEntryError(
                f"{path}: judge cache entry nested too deeply; delete the file to ask again"
            ) from None
        return _entry_from_json(obj, path)

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

    def check_writable(self) -> None:
        """One clear error before any request when the cache folder cannot be written (nothing is left behind).

        A folder that does not exist yet is judged by its nearest existing parent.
        """
        folder = self.root
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir():
            raise SysbenchError(f"{self.root}: cannot be the judge cache folder ({folder} is a file)")
        try:
            fd, probe = tempfile.mkstemp(prefix=".probe-", suffix=".tmp", dir=folder)
        except OSError as error:
            raise SysbenchError(f"{self.root}: judge cache folder not writable ({error.strerror or error})") from None
        os.close(fd)
        os.unlink(probe)

    def __len__(self) -> int:
        if not self.root.is_dir():
            return 0
        return sum(1 for _ in self.root.glob("??/*.json"))


_TOKEN_FIELDS = ("prompt_tokens", "output_tokens")


def _entry_from_json(obj: Any, path: Path) -> CachedReply:
    def wrong(name: str, wanted: str, value: Any) -> CacheEntryError:
        return CacheEntryError(
            f"{path}: judge cache entry field {name!r} should be {wanted}, found {json_type(value)}; "
            "delete the file to ask that question again"
        )

    if not isinstance(obj, dict):
        raise CacheEntryError(
            f"{path}: judge cache entry should be a JSON object, found {json_type(obj)}; "
            "delete the file to ask that question again"
        )
    text = obj.get("text")
    if not isinstance(text, str):
        raise wrong("text", "a string", text)
    for name in _TOKEN_FIELDS:
        value = obj.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise wrong(name, "an integer or null", value)
    finish = obj.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise wrong("finish_reason", "a string or null", finish)
    return CachedReply(
        text=text, prompt_tokens=obj.get("prompt_tokens"), output_tokens=obj.get("output_tokens"), finish_reason=finish
    )
