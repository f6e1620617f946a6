"""Where the attention stage puts the model: processes, devices, and the collectives between ranks.

Layouts (chosen by ``plan_load`` from the command line and torchrun's environment):

* ``single``: one process, the whole model on one device (``--device``).
* ``data-parallel``: torchrun with one rank per GPU; rank r loads the whole model
  straight onto ``cuda:LOCAL_RANK`` (``torch.cuda.set_device`` first, then
  ``device_map={"": device}``, so no rank builds a host copy nor touches GPU 0) and
  takes every WORLD_SIZE-th session.
* ``device-map``: one process, layers spread over all visible GPUs (``--device-map auto``).
* ``tensor-parallel``: torchrun with ``--tensor-parallel``; transformers shards every
  layer's heads over the ranks (its ``tp_plan``). Every rank runs every session and
  captures the heads it holds; ``gather_head_shares`` reduces them across ranks, and
  only rank 0 writes.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sysbench_gpu.attention.capture.hooks import LayerShares
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.engines.models import resolve_model
from sysbench_gpu.engines.startup import startup_failure

log = logging.getLogger(__name__)

TORCH_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}


@dataclass(frozen=True)
class Distributed:
    """This process's place among torchrun's ranks (rank 0 of 1 without torchrun)."""

    rank: int
    world: int
    local_rank: int

    @classmethod
    def from_env(cls) -> Distributed:
        try:
            rank = int(os.environ.get("RANK", "0"))
            world = int(os.environ.get("WORLD_SIZE", "1"))
            local = int(os.environ.get("LOCAL_RANK", str(rank)))
        except ValueError:
            raise SysbenchError("RANK, WORLD_SIZE and LOCAL_RANK must be integers") from None
        if world < 1 or not 0 <= rank < world:
            raise SysbenchError(f"RANK={rank} is not within WORLD_SIZE={world}")
        return cls(rank, world, local)

    @property
    def tag(self) -> str:
        return f"rank{self.rank}-of-{self.world}"


# ----------------------------------------------------------------- load plan


@dataclass(frozen=True)
class LoadPlan:
    """How ``from_pretrained`` is called: pure data, so the choice is testable without a GPU."""

    layout: str  # single | data-parallel | device-map | tensor-parallel
    device_map: Any = None  # passed to from_pretrained (None: transformers' default placement)
    cuda_device: int | None = None  # torch.cuda.set_device(this) before anything is allocated
    tensor_parallel_size: int | None = None

    @property
    def splits_sessions(self) -> bool:
        """Whether each rank takes its own share of the sessions (otherwise every rank runs every session)."""
        return self.layout == "data-parallel"


def plan_load(
    device: str, device_map: str | None, tensor_parallel: bool, dist: Distributed, cuda_available: bool
) -> LoadPlan:
    if tensor_parallel:
        if device_map:
            raise SysbenchError("--tensor-parallel and --device-map are two ways to split one model; choose one")
        if device != "auto":
            raise SysbenchError(
                "--tensor-parallel puts rank r on cuda:LOCAL_RANK (the CPU without GPUs); leave --device at auto"
            )
        if dist.world < 2:
            raise SysbenchError(
                "--tensor-parallel needs several processes: torchrun --nproc-per-node N -m sysbench_gpu attention ..."
            )
        return LoadPlan(
            "tensor-parallel", cuda_device=dist.local_rank if cuda_available else None, tensor_parallel_size=dist.world
        )
    if device_map:
        if dist.world > 1:
            raise SysbenchError(
                "--device-map spreads one model over all GPUs in one process; do not combine it with torchrun ranks "
                "(use --tensor-parallel to split one model over torchrun's ranks)"
            )
        return LoadPlan("device-map", device_map=device_map)
    if device == "auto":
        device = "cuda" if cuda_available else "cpu"
    if device == "cuda":
        device = f"cuda:{dist.local_rank}"
    cuda_device = None
    if device.startswith("cuda:"):
        try:
            cuda_device = int(device.split(":", 1)[1])
        except ValueError:
            raise SysbenchError(f"--device: {device!r} is not cpu, cuda or cuda:N") from None
        if not cuda_available:
            raise SysbenchError(f"--device {device}: no CUDA device is available")
    layout = "data-parallel" if dist.world > 1 else "single"
    return LoadPlan(layout, device_map={"": device}, cuda_device=cuda_device)


def check_tensor_parallel_heads(config: Any, world: int, model_name: str) -> None:
    """One clear line when the heads cannot be split evenly over ``world`` ranks (transformers would mis-shard them)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    if not isinstance(heads, int) or not isinstance(kv_heads, int):
        raise SysbenchError(f"{model_name}: config has no num_attention_heads; cannot split it by tensor parallelism")
    if heads % world or kv_heads % world:
        common = math.gcd(heads, kv_heads)
        sizes = [n for n in range(2, common + 1) if common % n == 0]
        hint = (
            f"use --nproc-per-node in {sizes}"
            if sizes
            else "no tensor-parallel size divides both; use --device-map auto"
        )
        raise SysbenchError(
            f"--tensor-parallel over {world} ranks: {model_name} has {heads} attention heads "
            f"and {kv_heads} key/value heads, "
            f"and both must divide by {world} ({hint})"
        )
    if not getattr(text, "base_model_tp_plan", None):
        raise SysbenchError(
            f"{model_name}: transformers has no tensor-parallel plan for model type "
            f"{getattr(text, 'model_type', '?')!r}; "
            "use --device-map auto or one process per GPU"
        )


def load_model(name: str, dtype: str, plan: LoadPlan) -> tuple[Any, Any, str]:
    """Tokenizer and model placed as ``plan`` says; returns (model, tokenizer, resolved path)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if dtype != "auto" and dtype not in TORCH_DTYPES:
        raise SysbenchError(f"--dtype: unknown dtype {dtype!r} (auto, float32, bfloat16, float16)")
    path = resolve_model(name)
    if plan.cuda_device is not None:
        # Before any CUDA allocation: otherwise every rank's context and caches land on GPU 0.
        torch.cuda.set_device(plan.cuda_device)
    kwargs: dict[str, Any] = {"dtype": "auto" if dtype == "auto" else getattr(torch, TORCH_DTYPES[dtype])}
    if plan.device_map is not None:
        kwargs["device_map"] = plan.device_map
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        if plan.tensor_parallel_size:
            check_tensor_parallel_heads(AutoConfig.from_pretrained(path), plan.tensor_parallel_size, name)
            kwargs.update(_tensor_parallel_kwargs(plan.tensor_parallel_size))
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except Exception as error:  # noqa: BLE001 (any load failure is one line; the traceback goes to --verbose)
        raise startup_failure(f"attention could not load model {name!r} from {path}", error) from None
    model.eval()
    if not getattr(tokenizer, "chat_template", None):
        raise SysbenchError(f"{path}: the tokenizer has no chat template")
    return model, tokenizer, path


def _tensor_parallel_kwargs(size: int) -> dict[str, Any]:
    try:
        from transformers.distributed import DistributedConfig
    except ImportError:  # transformers before DistributedConfig: the older keyword
        return {"tp_plan": "auto", "tp_size": size}
    return {"distributed_config": DistributedConfig(tp_plan="auto", tp_size=size)}


def input_device(model: Any) -> Any:
    return model.get_input_embeddings().weight.device


def heads_of(model: Any) -> int:
    return int(model.config.get_text_config().num_attention_heads)


# ----------------------------------------------------------------- tensor-parallel collectives


def gather_head_shares(results: dict[int, Any], total_heads: int, world: int, device: Any) -> dict[int, Any]:
    """Whole-model shares from each rank's local heads: the head mean by all_reduce, per-head values by all_gather.

    Rank r holds heads [r * H / N, (r + 1) * H / N) (transformers shards q/k/v column-wise in head order),
    so concatenating the gathered per-head blocks in rank order gives the model's head order.
    Every rank must call this with the same layers; all get the same result.
    """
    import torch
    import torch.distributed as torch_dist

    local_heads = total_heads // world
    reduced: dict[int, Any] = {}
    for layer in sorted(results):
        local = results[layer]
        head_sum = (local.mean.to(device=device, dtype=torch.float32) * local_heads).contiguous()
        torch_dist.all_reduce(head_sum, op=torch_dist.ReduceOp.SUM)
        per_head = None
        if local.per_head is not None:
            block = local.per_head.to(device=device, dtype=torch.float32).contiguous()
            parts = [torch.empty_like(block) for _ in range(world)]
            torch_dist.all_gather(parts, block)
            per_head = torch.cat(parts, dim=1).cpu()
        reduced[layer] = LayerShares(mean=(head_sum / total_heads).cpu(), per_head=per_head)
    return reduced


def broadcast_ints(values: Sequence[int], device: Any) -> list[int]:
    """Rank 0's list of integers on every rank (so every rank runs exactly the same sessions in the same order)."""
    import torch
    import torch.distributed as torch_dist

    length = torch.tensor([len(values)], dtype=torch.int64, device=device)
    torch_dist.broadcast(length, src=0)
    data = torch.zeros(int(length.item()), dtype=torch.int64, device=device)
    if torch_dist.get_rank() == 0:
        data.copy_(torch.tensor(list(values), dtype=torch.int64))
    torch_dist.broadcast(data, src=0)
    return [int(v) for v in data.cpu().tolist()]


def end_process_group() -> None:
    import torch.distributed as torch_dist

    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.barrier()
        torch_dist.destroy_process_group()


# ----------------------------------------------------------------- data-parallel completion markers


def launch_id() -> str:
    """Identifies one torchrun launch (shared by its ranks), so stale done markers of an earlier launch are ignored."""
    return os.environ.get("TORCHELASTIC_RUN_ID", "")


def done_marker(out: Path, rank: int, world: int) -> Path:
    return out / "shards" / f"rank{rank}-of-{world}.done"


def mark_done(out: Path, dist: Distributed) -> None:
    mark = done_marker(out, dist.rank, dist.world)
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.write_text(launch_id() + "\n", encoding="utf-8")


def _rank_done(out: Path, rank: int, world: int) -> bool:
    try:
        return done_marker(out, rank, world).read_text(encoding="utf-8").strip() == launch_id()
    except FileNotFoundError:
        return False


def wait_for_ranks(out: Path, dist: Distributed, timeout: float) -> None:
    if dist.world == 1:
        return
    deadline = time.monotonic() + timeout
    pending = [r for r in range(dist.world) if not _rank_done(out, r, dist.world)]
    while pending and time.monotonic() < deadline:
        time.sleep(2.0)
        pending = [r for r in pending if not _rank_done(out, r, dist.world)]
    if pending:
        log.warning("ranks %s did not finish within %.0f s; merging what exists", pending, timeout)
