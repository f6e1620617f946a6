"""A stand-in for ``bench_attention_capture.measure`` with the contract ``gpu_check.py`` calls.

Used by ``tests/test_gpu_check.py`` only while the installed ``bench_attention_capture.py``
does not provide ``measure(model, lengths, layers, device, ...)`` yet (the attention-capture
rework provides it; the test switches to it by itself once it is there). It times a plain
forward, the capture and eager attention; it does not measure memory (peaks are None).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable


def measure(model: Any, lengths: list[int], layers: list[int], device: str, repeats: int = 3, eager: bool = True,
            eager_max_gib: float = 4.0, chunk_mib: int = 32, input_ids_for: Callable[[int], Any] | None = None
            ) -> list[dict[str, Any]]:
    import torch

    from sysbench_gpu.attn_hooks import AttentionShareCapture, eager_reference_shares

    config = model.config
    rows = []
    for length in lengths:
        if input_ids_for is not None:
            ids = input_ids_for(length)
        else:
            generator = torch.Generator().manual_seed(length)
            ids = torch.randint(0, min(config.vocab_size, 1000), (1, length), generator=generator).to(device)
        spans = [(0, 3), (3, length // 3)]
        captured: dict[int, Any] = {}

        def plain() -> None:
            with torch.inference_mode():
                model(input_ids=ids, use_cache=False, logits_to_keep=1)

        def capture() -> None:
            with AttentionShareCapture(model, layers=layers, spans=spans, budget_bytes=chunk_mib << 20) as cap:
                captured.update(cap.forward(ids, stop_early=False))

        plain_s, capture_s = _timed(plain, repeats), _timed(capture, repeats)
        row: dict[str, Any] = {"tokens": length, "plain_s": plain_s, "capture_s": capture_s, "eager_s": None,
                               "capture_over_plain_time": capture_s / plain_s, "eager_over_capture_memory": None,
                               "max_abs_diff_vs_eager": None, "plain_peak_mib": None, "capture_peak_mib": None,
                               "eager_peak_mib": None}
        element = torch.finfo(next(model.parameters()).dtype).bits // 8
        eager_bytes = config.num_hidden_layers * config.num_attention_heads * length * length * element
        if eager and eager_bytes <= eager_max_gib * (1 << 30):
            shares: dict[int, Any] = {}

            def run_eager() -> None:
                with torch.inference_mode():
                    attentions = model(input_ids=ids, use_cache=False, logits_to_keep=1, output_attentions=True).attentions
                    for layer in layers:
                        shares[layer] = eager_reference_shares(attentions[layer], spans).mean(dim=1)

            model.set_attn_implementation("eager")
            try:
                row["eager_s"] = _timed(run_eager, repeats)
            finally:
                model.set_attn_implementation("sdpa")
            row["max_abs_diff_vs_eager"] = max(
                float((shares[layer].float().cpu() - captured[layer].mean.float().cpu()).abs().max()) for layer in layers
            )
        rows.append(row)
    return rows


def _timed(run: Callable[[], None], repeats: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(max(1, repeats)):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)
