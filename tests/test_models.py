"""Model names and folders: one clear line for each mistake, and the embedded model converted once under concurrency."""

from __future__ import annotations

import json
import multiprocessing
import os
import struct
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.engines.models import (
    check_model_dir,
    check_safetensors_file,
    resolve_model,
)


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]], extra: bytes = b"") -> None:
    """A safetensors file written by hand (header JSON + raw bytes), so no torch is needed."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset, blobs = 0, []
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs) + extra)


def model_folder(root: Path, name: str = "model", *, tokenizer: bool = True, weights: bool = True) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}", encoding="utf-8")
    if weights:
        write_safetensors(folder / "model.safetensors", {"w": ("F32", [2, 3], bytes(24)), "b": ("BF16", [3], bytes(6))})
    return folder


def one_line(error: pytest.ExceptionInfo[SysbenchError]) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_a_good_folder_and_hub_ids_pass(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    check_model_dir(folder)
    assert resolve_model(str(folder)) == str(folder)
    # Not a folder here, but shaped like a hub id: the library resolves (or downloads) it.
    assert resolve_model("Qwen/Qwen2-7B-Instruct") == "Qwen/Qwen2-7B-Instruct"
    assert resolve_model("gpt2") == "gpt2"


@pytest.mark.parametrize("name", ["/no/such/model", "./models/missing", "~/nowhere/at/all", "a/b/c"])
def test_a_missing_path_is_one_line_not_a_repo_id_complaint(name: str) -> None:
    with pytest.raises(SysbenchError) as error:
        resolve_model(name)
    message = one_line(error)
    assert "no such folder" in message and name in message and "Repo id" not in message


def test_a_folder_without_tokenizer_config_or_weights_names_what_is_missing(tmp_path: Path) -> None:
    no_tokenizer = model_folder(tmp_path, "a", tokenizer=False)
    with pytest.raises(SysbenchError) as error:
        resolve_model(str(no_tokenizer))
    assert "no tokenizer files" in one_line(error) and "sentencepiece" not in str(error.value)

    no_weights = model_folder(tmp_path, "b", weights=False)
    with pytest.raises(SysbenchError, match="no weight files"):
        check_model_dir(no_weights)

    no_config = model_folder(tmp_path, "c")
    (no_config / "config.json").unlink()
    with pytest.raises(SysbenchError, match="no config.json"):
        check_model_dir(no_config)

    (no_config / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(SysbenchError, match="config.json: not valid JSON at line 1"):
        check_model_dir(no_config)

    (no_config / "config.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(SysbenchError, match="expected a JSON object of a model configuration, found an array"):
        check_model_dir(no_config)

    with pytest.raises(SysbenchError, match="not a folder"):
        check_model_dir(no_config / "config.json")


def test_a_sharded_index_must_name_existing_shards(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    index = {"weight_map": {"w": "model.safetensors", "x": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")
    with pytest.raises(SysbenchError, match="model-00002-of-00002.safetensors is named by .* but missing"):
        check_model_dir(folder)


def test_corrupt_safetensors_files_are_one_line(tmp_path: Path) -> None:
    good = tmp_path / "good.safetensors"
    write_safetensors(good, {"w": ("F32", [4], bytes(16))})
    check_safetensors_file(good)
    data = good.read_bytes()
    cases = {
        "garbage": (os.urandom(64), "header length"),
        "tiny": (b"\x01\x02", "shorter than the 8-byte header length"),
        "truncated": (data[:-5], "truncated"),
        "trailing": (data + b"xx", "trailing bytes"),
        "not-json": (struct.pack("<Q", 4) + b"\xff\xfe{}" + bytes(16), "header is not JSON"),
    }
    for name, (content, expected) in cases.items():
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(content)
        with pytest.raises(SysbenchError) as error:
            check_safetensors_file(path)
        message = one_line(error)
        assert expected in message and "corrupt safetensors file" in message and str(path) in message, name
    bad_shape = tmp_path / "shape.safetensors"
    write_safetensors(bad_shape, {"w": ("F32", [5], bytes(16))})  # 5 floats need 20 bytes
    with pytest.raises(SysbenchError, match="do not match its shape"):
        check_safetensors_file(bad_shape)


def test_the_real_embedded_model_folder_passes(smollm2_path: str) -> None:
    check_model_dir(smollm2_path)


@pytest.mark.slow
def test_hf_engine_reports_each_model_error_in_one_line(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from sysbench_gpu.engines.hf import HFEngine

    folder = model_folder(tmp_path, tokenizer=False)
    for name, expected in ((str(tmp_path / "absent"), "no such folder"), (str(folder), "no tokenizer files")):
        with pytest.raises(SysbenchError) as error:
            HFEngine(name)
        assert expected in one_line(error)
    # A folder that passes the checks but whose tokenizer cannot be built: still one line.
    (folder / "tokenizer.json").write_text("{}", encoding="utf-8")
    with pytest.raises(SysbenchError) as error:
        HFEngine(str(folder))
    assert one_line(error).startswith("hf engine could not load the tokenizer of")


# --- the embedded model under concurrent processes ---------------------------------


def _convert_and_load(cache: str, marker_dir: str) -> tuple[str, int]:
    """One 'rank': resolve the embedded model into an empty cache, then load it fully."""
    os.environ["SYSBENCH_GPU_CACHE"] = cache
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sysbench_gpu.engines import models

    torch.set_num_threads(1)
    convert = models.convert_gguf

    def counted(gguf_file: Path, target: Path) -> None:
        (Path(marker_dir) / str(os.getpid())).touch()
        convert(gguf_file, target)

    models.convert_gguf = counted  # type: ignore[assignment]
    path = models.resolve_model("smollm2")
    AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    return path, sum(p.numel() for p in model.parameters())


@pytest.mark.slow
def test_concurrent_processes_convert_the_embedded_model_once_and_all_load(tmp_path: Path, smollm2_path: str) -> None:
    """Three processes start together on an empty cache: one converts, the others wait, all load.

    Before the lock, each converted on its own and the last one removed the folder while
    the first was loading from it.
    """
    cache, markers = tmp_path / "cache", tmp_path / "markers"
    markers.mkdir()
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=3, mp_context=context) as pool:
        futures = [pool.submit(_convert_and_load, str(cache), str(markers)) for _ in range(3)]
        results = [future.result(timeout=600) for future in futures]
    assert len({path for path, _ in results}) == 1
    assert len({count for _, count in results}) == 1 and results[0][1] > 100_000_000
    assert len(list(markers.iterdir())) == 1  # converted exactly once
    models_dir = cache / "models"
    assert sorted(p.name for p in models_dir.iterdir() if not p.name.startswith(".")) == ["SmolLM2-135M-Instruct"]
    assert not [p for p in models_dir.iterdir() if p.name.startswith((".convert-", ".stale-"))]
