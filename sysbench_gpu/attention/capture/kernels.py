"""Attention kernels that return the row log-sum-exp beside the output: one typed function per backend.

The capture needs ``LSE_all`` (the log-sum-exp of each query's scores over every key it
sees) from the same kernel call that computes the layer's output, so the model gets that
call's output back and the share costs only the span's keys (``attn_math.span_share_given_lse``).

Every function takes the tensors transformers' attention interface passes (query
``[B, H, T, D]``, key and value ``[B, KVH, T, D]`` after RoPE, the model's mask or None)
and returns a ``KernelResult``: the output as transformers' SDPA path returns it
(``[B, T, H, D]``, contiguous) and the LSE ``[B, H, T]`` in fp32.

* ``cpu_flash_attention``: ``aten._scaled_dot_product_flash_attention_for_cpu``, the
  kernel PyTorch's SDPA itself runs on the CPU (grouped-query keys without repeating
  them, an additive mask);
* ``cuda_flash_attention``: ``aten._scaled_dot_product_flash_attention`` (fp16/bf16, no
  mask, grouped-query keys as they are);
* ``cuda_efficient_attention``: ``aten._scaled_dot_product_efficient_attention`` (any
  float dtype, an additive mask; keys repeated per group, as SDPA does for it);
* ``flash_attn_attention``: the ``flash-attn`` package (the ``[flash]`` extra; fp16/bf16,
  grouped-query keys as they are, no mask).

``choose_kernel`` picks one from the device, dtype, mask and what the model's own
attention path does, or says why none applies (then the capture keeps the model's own
call and takes the fallback path). The flash kernels are chosen only on sm80 or newer, and
flash-attn only where it imports (a wheel built for another torch ABI is found but does not).
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

log = logging.getLogger(__name__)

_HALF = ("float16", "bfloat16")
MAX_FLASH_HEAD_DIM = 256
FLASH_MIN_CAPABILITY = (8, 0)  # flash-attn 2 and torch's CUDA flash SDPA need Ampere (sm80) or newer


@dataclass(frozen=True)
class KernelResult:
    output: torch.Tensor  # [B, T, H, D], what transformers' attention functions return
    lse: torch.Tensor  # [B, H, T] fp32: log-sum-exp of each row's scaled scores over its visible keys


@dataclass(frozen=True)
class KernelInputs:
    """What a kernel needs besides the tensors, decided once from the model's call."""

    scale: float | None  # None: D ** -0.5
    is_causal: bool  # causal flag as the model's SDPA call would pass it (False when a mask is given)


KernelFunction = Callable[
    ["torch.Tensor", "torch.Tensor", "torch.Tensor", "torch.Tensor | None", KernelInputs], KernelResult
]


# ----------------------------------------------------------------- the kernels


def cpu_flash_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, inputs: KernelInputs
) -> KernelResult:
    """PyTorch's CPU flash kernel (what ``scaled_dot_product_attention`` dispatches to on the CPU)."""
    import torch

    output, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, inputs.is_causal, attn_mask=additive_mask(mask, query.dtype), scale=inputs.scale
    )
    return KernelResult(output.transpose(1, 2).contiguous(), lse)


def cuda_flash_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, inputs: KernelInputs
) -> KernelResult:
    """PyTorch's CUDA flash kernel: fp16/bf16, no mask; grouped-query keys are taken as they are."""
    import torch

    if mask is not None:
        raise ValueError("the CUDA flash kernel takes no mask")
    result = torch.ops.aten._scaled_dot_product_flash_attention(
        query, key, value, 0.0, inputs.is_causal, False, scale=inputs.scale
    )
    output, lse = result[0], result[1]
    return KernelResult(output.transpose(1, 2).contiguous(), lse[..., : query.shape[2]])


def cuda_efficient_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, inputs: KernelInputs
) -> KernelResult:
    """PyTorch's memory-efficient CUDA kernel: any float dtype and an additive mask; keys repeated per group."""
    import torch

    group = query.shape[1] // key.shape[1]
    if group > 1:  # this kernel needs as many key heads as query heads (SDPA repeats them for it too)
        key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    bias = additive_mask(mask, query.dtype)
    if bias is not None:
        bias = _aligned_bias(bias).expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    output, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, True, 0.0, inputs.is_causal, scale=inputs.scale
    )
    # The LSE comes padded to a multiple of 32 rows.
    return KernelResult(output.transpose(1, 2).contiguous(), lse[..., : query.shape[2]])


def flash_attn_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, inputs: KernelInputs
) -> KernelResult:
    """The flash-attn package: fp16/bf16, no mask; grouped-query keys natively.

    No window and no softcap: this stands in for the model's SDPA call, which applies a
    sliding window only through its mask (then this kernel is not chosen) and drops softcap.
    """
    from flash_attn import flash_attn_func

    if mask is not None:
        raise ValueError("flash-attn takes no mask")
    output, lse, _ = flash_attn_func(
        query.transpose(1, 2),
        key.transpose(1, 2),
        value.transpose(1, 2),
        dropout_p=0.0,
        softmax_scale=inputs.scale,
        causal=inputs.is_causal,
        return_attn_probs=True,
    )
    return KernelResult(output.contiguous(), lse)


# ----------------------------------------------------------------- helpers


def additive_mask(mask: torch.Tensor | None, dtype: Any) -> torch.Tensor | None:
    """A boolean mask (True = visible) as SDPA converts it: 0 where visible, -inf elsewhere, in the query dtype."""
    import torch

    if mask is None or mask.dtype != torch.bool:
        return mask
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, zero, torch.tensor(float("-inf"), dtype=dtype, device=mask.device))


def _aligned_bias(bias: torch.Tensor, alignment: int = 16) -> torch.Tensor:
    """The efficient kernel reads the bias in aligned rows: pad the key dimension, then view the original width."""
    import torch

    width = bias.shape[-1]
    if width % alignment == 0 and bias.stride(-2) % alignment == 0:
        return bias
    padded = torch.nn.functional.pad(bias, (0, (-width) % alignment))
    return padded[..., :width]


@functools.cache
def flash_attn_installed() -> bool:
    """Whether ``flash_attn`` imports, tried once per process (``flash_attn_installed.cache_clear()`` to retry).

    A wheel built against another torch ABI is found on the path but fails to import
    ("undefined symbol ..."): that counts as not installed, with one warning naming the error.
    """
    try:
        importlib.import_module("flash_attn")
    except ModuleNotFoundError as error:
        if error.name != "flash_attn":  # flash_attn is there, one of its own imports is missing
            _warn_flash_attn_broken(error)
        return False
    except Exception as error:  # noqa: BLE001 (a broken build raises ImportError, OSError or RuntimeError)
        _warn_flash_attn_broken(error)
        return False
    return True


def _warn_flash_attn_broken(error: BaseException) -> None:
    first = str(error).splitlines()[0][:300] if str(error) else type(error).__name__
    log.warning("flash-attn is installed but does not import (%s); using torch's kernels", first)


def device_capability(device: Any) -> tuple[int, int]:
    """CUDA compute capability (major, minor) of ``device`` (the current device when it names no index)."""
    import torch

    index = getattr(device, "index", None)
    major, minor = torch.cuda.get_device_capability(index)
    return int(major), int(minor)


# ----------------------------------------------------------------- choice


@dataclass(frozen=True)
class KernelChoice:
    name: str  # short name recorded per layer in the manifest
    function: KernelFunction | None  # None: no kernel applies; ``reason`` says why
    reason: str = ""  # with a function: why a faster kernel was passed over (empty when none was)


def choose_kernel(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    base: str,
    flash_attn_available: bool | None = None,
    capability: tuple[int, int] | None = None,
) -> KernelChoice:
    """The kernel for one layer call, or why none applies (``function`` None).

    ``flash_attn_available`` and ``capability`` default to what this process sees (tests pass them).
    """
    if base != "sdpa":
        return KernelChoice("", None, f"{base} attention returns no log-sum-exp")
    if query.shape[2] != key.shape[2]:
        return KernelChoice("", None, "queries and keys differ in length (a cache)")
    if value.shape[-1] != query.shape[-1]:
        return KernelChoice("", None, "value and query head sizes differ")
    if mask is not None and mask.dim() != 4:
        return KernelChoice("", None, f"a {mask.dim()}-D mask")
    device = query.device.type
    dtype = str(query.dtype).replace("torch.", "")
    if device == "cpu":
        return KernelChoice("torch-cpu-flash", cpu_flash_attention)
    if device != "cuda":
        return KernelChoice("", None, f"no kernel with log-sum-exp on {device}")
    half = dtype in _HALF and query.shape[-1] <= MAX_FLASH_HEAD_DIM and query.shape[-1] % 8 == 0
    if mask is None and half:
        major, minor = capability if capability is not None else device_capability(query.device)
        if (major, minor) < FLASH_MIN_CAPABILITY:
            # Older GPUs (e.g. T4, V100) have no flash kernel; the efficient one returns the LSE there too.
            return KernelChoice(
                "torch-cuda-efficient", cuda_efficient_attention, f"sm{major}{minor}: the flash kernels need sm80+"
            )
        if flash_attn_available if flash_attn_available is not None else flash_attn_installed():
            return KernelChoice("flash-attn", flash_attn_attention)
        return KernelChoice("torch-cuda-flash", cuda_flash_attention)
    return KernelChoice("torch-cuda-efficient", cuda_efficient_attention)
