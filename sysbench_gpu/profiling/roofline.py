"""Roofline arithmetic: FLOPs and bytes of a dense decoder-only model, and time bounds.

Pure Python, no torch. Everything here is a *lower bound* on the work an engine must
do, so that ``bound / measured`` (the efficiency) never exceeds 1 on a correct device
spec (see docs/profile.md for the derivation):

* **FLOPs.** Every matrix multiply costs 2 FLOPs per weight per token. The output
  projection (lm head) runs once per *sampled* token: once per sequence in the prefill
  (its last prompt token) and once per decode step. Attention costs ``4 * layers *
  heads * head_dim`` FLOPs per (query, key) pair (QK^T and AV), and a causal query at
  position c sees c keys (itself included). Norms, activations and biases are left out.
* **Bytes.** Each forward pass reads every weight once (the embedding table only through
  the lm head when tied); the KV cache is read at every decode step for every live
  sequence, the cached prefix once in the prefill, and each new token's KV is written
  once. Activations are left out.
* **Time.** A segment of work that runs concurrently on a device takes at least
  ``max(FLOPs / peak FLOP/s, bytes / bandwidth)``. Segments that must run one after
  another (turns of a turn-synchronous run, batches of the hf engine) add up
  (:mod:`sysbench_gpu.profiling.bounds`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sysbench_gpu.core.errors import SysbenchError

# Bytes per element of the dtypes engines record.
DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float8": 1,
    "fp8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "int4": 0.5,
    "fp4": 0.5,
    "nf4": 0.5,
}
DEFAULT_DTYPE = "bfloat16"
# Model families whose q/k/v projections carry a bias although the config has no
# ``attention_bias`` key.
_QKV_BIAS_FAMILIES = ("qwen2",)
# Families whose MLP is up + down only (no gate projection); the rest are llama-like.
_UNGATED_FAMILIES = ("gpt_neox", "gptj", "phi", "opt", "falcon", "starcoder2", "bloom", "gpt_bigcode", "gpt2")
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")


def dtype_bytes(dtype: str | None) -> float:
    """Bytes per weight of a dtype name as the engines record it (``torch.`` prefix allowed)."""
    name = (dtype or DEFAULT_DTYPE).replace("torch.", "").lower()
    if name == "auto":
        name = DEFAULT_DTYPE
    if name not in DTYPE_BYTES:
        raise SysbenchError(f"unknown dtype {dtype!r} (known: {', '.join(sorted(DTYPE_BYTES))})")
    return DTYPE_BYTES[name]


# ---------------------------------------------------------------- the model


@dataclass(frozen=True)
class ModelShape:
    """What the roofline needs from a dense decoder-only ``config.json``."""

    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    gated_mlp: bool = True
    sliding_window: int | None = None  # every layer attends to at most this many keys
    name: str = "model"

    @classmethod
    def from_config(cls, config: Mapping[str, Any], name: str = "model") -> ModelShape:
        """Read a transformers config dict; a clear error for what it cannot describe."""
        text = config.get("text_config")
        if isinstance(text, Mapping) and "num_hidden_layers" not in config:
            config = {**text, "model_type": text.get("model_type", config.get("model_type"))}
        moe = [key for key in _MOE_KEYS if config.get(key)]
        if moe:
            raise SysbenchError(
                f"{name}: config has {moe[0]!r}: mixture-of-experts models are not supported by the roofline "
                "(only dense decoder-only models)"
            )

        def need(key: str) -> int:
            value = config.get(key)
            if not isinstance(value, int) or value <= 0:
                raise SysbenchError(f"{name}: config field {key!r} is missing or not a positive integer ({value!r})")
            return value

        hidden = need("hidden_size")
        heads = need("num_attention_heads")
        kv_heads = config.get("num_key_value_heads") or heads
        head_dim = config.get("head_dim") or hidden // heads
        model_type = str(config.get("model_type") or "")
        window = config.get("sliding_window")
        if not isinstance(window, int) or window <= 0 or config.get("use_sliding_window") is False:
            window = None
        return cls(
            n_layers=need("num_hidden_layers"),
            hidden=hidden,
            n_heads=heads,
            n_kv_heads=int(kv_heads),
            head_dim=int(head_dim),
            intermediate=need("intermediate_size"),
            vocab=need("vocab_size"),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=bool(config.get("attention_bias", False)) or model_type in _QKV_BIAS_FAMILIES,
            o_bias=bool(config.get("attention_bias", False)),
            gated_mlp=model_type not in _UNGATED_FAMILIES,
            sliding_window=window,
            name=name,
        )

    # -- parameters --------------------------------------------------------------
    @property
    def layer_matmul_params(self) -> int:
        """Weights of the matrix multiplies of one layer (q, k, v, o, MLP)."""
        q_out = self.n_heads * self.head_dim
        kv_out = self.n_kv_heads * self.head_dim
        attention = self.hidden * q_out + 2 * self.hidden * kv_out + q_out * self.hidden
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.intermediate
        return attention + mlp

    @property
    def layer_params(self) -> int:
        """All parameters of one layer: matmuls, biases and the two norms."""
        biases = 0
        if self.qkv_bias:
            biases += (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
        if self.o_bias:
            biases += self.hidden
        return self.layer_matmul_params + biases + 2 * self.hidden

    @property
    def lm_head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        """Every parameter (the embedding table counted once when tied)."""
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.n_layers * self.layer_params + embeddings + self.hidden

    @property
    def params_read_per_forward(self) -> int:
        """Weights a forward pass reads: layers, final norm and lm head (the embedding lookup reads only a few rows)."""
        return self.n_layers * self.layer_params + self.hidden + self.lm_head_params

    # -- per-token costs ------------------------------------------------------------
    @property
    def linear_flops_per_token(self) -> int:
        """Matmul FLOPs of one token through all layers (lm head not included)."""
        return 2 * self.n_layers * self.layer_matmul_params

    @property
    def lm_head_flops(self) -> int:
        """FLOPs of the logits of one sampled token."""
        return 2 * self.lm_head_params

    @property
    def attention_flops_per_key(self) -> int:
        """FLOPs of one (query, key) pair over all layers and heads: QK^T and AV."""
        return 4 * self.n_layers * self.n_heads * self.head_dim

    def kv_elements_per_token(self) -> int:
        """K and V entries of one token over all layers."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim

    def keys(self, context: int) -> int:
        """Keys a query at position ``context`` (1-based) attends to."""
        return min(context, self.sliding_window) if self.sliding_window else context

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "layers": self.n_layers,
            "hidden": self.hidden,
            "heads": self.n_heads,
            "kv_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "intermediate": self.intermediate,
            "vocab": self.vocab,
            "tied_embeddings": self.tied_embeddings,
            "qkv_bias": self.qkv_bias,
            "sliding_window": self.sliding_window,
            "params": self.total_params,
            "params_read_per_forward": self.params_read_per_forward,
        }


def _sum_keys(shape: ModelShape, first: int, last: int) -> int:
    """Sum of ``shape.keys(c)`` for c = first..last (0 when last < first)."""
    if last < first:
        return 0
    window = shape.sliding_window
    if not window or last <= window:
        return (first + last) * (last - first + 1) // 2
    below = _sum_keys(shape, first, window) if first <= window else 0
    return below + window * (last - max(first, window + 1) + 1)


# ---------------------------------------------------------------- work of sequences


@dataclass(frozen=True)
class SequenceTokens:
    """One request: its templated prompt, the part served from the prefix cache, its reply."""

    prompt: int
    cached: int
    output: int

    def __post_init__(self) -> None:
        if self.prompt < 0 or self.output < 0 or not 0 <= self.cached <= self.prompt:
            raise SysbenchError(f"bad token counts: prompt {self.prompt}, cached {self.cached}, output {self.output}")

    @property
    def forwards(self) -> int:
        """Forward passes that touch this sequence: the prefill yields the first token, each later one a step."""
        return max(1, self.output)


@dataclass
class Work:
    """FLOPs and KV-cache bytes of a set of sequences, split into prefill and decode."""

    prefill_flops: float = 0.0
    decode_flops: float = 0.0
    prefill_kv_bytes: float = 0.0
    decode_kv_bytes: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    sequences: int = 0

    @property
    def flops(self) -> float:
        return self.prefill_flops + self.decode_flops

    @property
    def kv_bytes(self) -> float:
        return self.prefill_kv_bytes + self.decode_kv_bytes

    def add(self, other: Work) -> Work:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self


def sequence_work(shape: ModelShape, seq: SequenceTokens, kv_bytes_per_element: float) -> Work:
    """The prefill and decode work of one request (see the module docstring)."""
    kv_token = shape.kv_elements_per_token() * kv_bytes_per_element
    new = seq.prompt - seq.cached
    prefill = new * shape.linear_flops_per_token
    # Query i of the new tokens sits at position cached + i and sees that many keys.
    prefill += shape.attention_flops_per_key * _sum_keys(shape, seq.cached + 1, seq.prompt)
    if seq.output >= 1:
        prefill += shape.lm_head_flops
    steps = max(0, seq.output - 1)  # the decode forwards: they feed output tokens 1..o-1
    decode = steps * (shape.linear_flops_per_token + shape.lm_head_flops)
    decode += shape.attention_flops_per_key * _sum_keys(shape, seq.prompt + 1, seq.prompt + steps)
    # Reads: the cached prefix once in the prefill; at decode step j the prompt + j - 1
    # tokens already cached (capped by the window). Writes: every fed token's KV once.
    decode_reads = _sum_keys(shape, seq.prompt, seq.prompt + steps - 1) if steps else 0
    return Work(
        prefill_flops=float(prefill),
        decode_flops=float(decode),
        prefill_kv_bytes=float((shape.keys(seq.cached) if seq.cached else 0) + new) * kv_token,
        decode_kv_bytes=float(decode_reads + steps) * kv_token,
        prompt_tokens=seq.prompt,
        cached_tokens=seq.cached,
        output_tokens=seq.output,
        sequences=1,
    )


def total_work(shape: ModelShape, seqs: Iterable[SequenceTokens], kv_bytes_per_element: float) -> Work:
    work = Work()
    for seq in seqs:
        work.add(sequence_work(shape, seq, kv_bytes_per_element))
    return work


# ---------------------------------------------------------------- devices and layouts


@dataclass(frozen=True)
class DeviceSpec:
    """Peak dense matrix throughput, memory bandwidth and memory of one accelerator (or CPU)."""

    name: str
    peak_flops: float  # FLOP/s
    memory_bandwidth: float  # bytes/s
    memory_bytes: float | None = None
    description: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        for key in ("peak_flops", "memory_bandwidth"):
            value = getattr(self, key)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise SysbenchError(f"device spec {self.name!r}: {key} must be a positive number, got {value!r}")

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Layout:
    """Tensor, pipeline and data parallel sizes."""

    tp: int = 1
    pp: int = 1
    dp: int = 1

    def __post_init__(self) -> None:
        for key in ("tp", "pp", "dp"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise SysbenchError(f"layout: {key} must be a positive integer, got {value!r}")

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def label(self) -> str:
        return f"tp={self.tp},pp={self.pp},dp={self.dp}"

    @classmethod
    def parse(cls, text: str, base: Layout | None = None) -> Layout:
        """``tp=4``, ``dp=2,tp=2``: named sizes override ``base`` (default all 1)."""
        values = dict((base or cls()).__dict__)
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            key, sep, value = item.partition("=")
            key = key.strip().lower()
            if not sep or key not in values or not value.strip().isdigit() or int(value) < 1:
                raise SysbenchError(f"layout {text!r}: expected items like tp=4, pp=2, dp=2 (positive integers)")
            values[key] = int(value)
        return cls(**values)


def kv_replication(shape: ModelShape, tp: int) -> float:
    """Total KV held over tp GPUs relative to one copy: KV heads are replicated when tp > KV heads."""
    per_gpu = math.ceil(shape.n_kv_heads / tp)
    return per_gpu * tp / shape.n_kv_heads
