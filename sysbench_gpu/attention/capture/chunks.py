"""How the chunked fallback cuts the score matrix: blocks sized to a memory budget (cache-sized on the CPU)."""

from __future__ import annotations

from dataclasses import dataclass

from sysbench_gpu.core.errors import SysbenchError

DEFAULT_BUDGET_BYTES = 256 << 20


MAX_Q_CHUNK = 1024


MAX_K_CHUNK = 4096


# Live fp32 blocks of size heads x q_chunk x k_chunk at the peak (scores, updated in place, plus
# temporaries such as a broadcast mask or a span slice reduction): budget three.
_LIVE_BLOCKS = 3


# CPU plans: one fp32 score block of about this size, keys in chunks of at most this many.
CPU_BLOCK_BYTES = 1 << 20


CPU_MAX_K_CHUNK = 1024


@dataclass(frozen=True)
class ChunkPlan:
    q_chunk: int
    k_chunk: int

    def peak_bytes(self, batch: int, heads: int) -> int:
        return _LIVE_BLOCKS * 4 * batch * heads * self.q_chunk * self.k_chunk


def plan_chunks(
    batch: int,
    heads: int,
    t_q: int,
    t_k: int,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    chunk_tokens: int | None = None,
    device_type: str = "cuda",
) -> ChunkPlan:
    """Chunk lengths for queries and keys.

    ``chunk_tokens`` fixes both; otherwise keys go in chunks of up to 4096 and the
    query chunk is the largest (up to 1024) that keeps the fp32 score blocks within
    ``budget_bytes``, so the blocks never grow with T beyond 1024 x 4096 per head.
    On the CPU (``device_type="cpu"``) a block is also kept near ``CPU_BLOCK_BYTES``, with
    keys in chunks of up to ``CPU_MAX_K_CHUNK``: each block is walked several times (the
    matmul, shift, exp, masks, span sums), and a block the cache holds makes the span work
    1.5-2x faster than one sized by the memory budget (``kernels_bench/bench_span_work.py``).
    """
    if chunk_tokens is not None:
        if chunk_tokens < 1:
            raise SysbenchError(f"--chunk-tokens must be positive, got {chunk_tokens}")
        return ChunkPlan(q_chunk=min(chunk_tokens, max(t_q, 1)), k_chunk=min(chunk_tokens, max(t_k, 1)))
    on_cpu = device_type == "cpu"
    k_chunk = max(1, min(t_k, CPU_MAX_K_CHUNK if on_cpu else MAX_K_CHUNK))
    budget = min(budget_bytes, _LIVE_BLOCKS * CPU_BLOCK_BYTES) if on_cpu else budget_bytes
    per_query = _LIVE_BLOCKS * 4 * batch * heads * k_chunk
    q_chunk = max(1, min(t_q, MAX_Q_CHUNK, budget // max(per_query, 1)))
    return ChunkPlan(q_chunk=q_chunk, k_chunk=k_chunk)
