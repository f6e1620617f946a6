"""Attention-share capture against a plain forward and against eager attention.

For each sequence length T the same model and inputs run as:

* ``plain``: a normal SDPA forward (no capture), one logit kept: the baseline;
* ``capture``: the same forward inside ``AttentionShareCapture`` at the selected layers
  (kernel-LSE path where a kernel applies: the layer's output and its row LSE from one
  kernel call, plus the LSE over the span keys);
* ``fallback`` (``--fallback``): the capture forced onto the chunked recomputation of
  every row's LSE (the path eager models take);
* ``eager``: eager attention with its probabilities materialized at the selected layers
  only (the model file's ``eager_attention_forward``, what ``output_attentions=True``
  returns), span shares summed from them; the other layers run SDPA.

Plain, capture (and fallback) are timed interleaved, alternating their order on every
repeat, after one untimed warm-up each; medians are reported. Peak memory is read in one
further pass per run, apart from the timed ones (``interleaved`` says why). Eager is timed after them
and skipped where one layer's heads x T x T scores and probabilities would exceed
``--eager-max-gib``. That guard is an estimate: each row gives it (``eager_estimate_mib``) beside
the measured peak of eager beyond a plain forward (``eager_extra_peak_mib``), and an eager run
that still runs out of memory is recorded in ``eager_status`` instead of ending the benchmark;
a plain or capture pass that does is a row with only ``status``. Every pass is guarded
(``out_of_memory``), and its memory is freed once the exception is gone.
Peak extra memory: ``torch.cuda.max_memory_allocated`` of the device
in use above its pre-forward allocation on CUDA; on the CPU the peak RSS (VmHWM, reset
through /proc/self/clear_refs after malloc_trim) above the pre-forward RSS.

Inputs: ``--model tiny`` (random-weight Llama) takes random token ids, with a 3-token
lead and a 300-token system span. ``--model smollm2`` (or a model folder) takes a real
SysBench conversation: session ``--session`` of ``--data`` rendered with the model's chat
template, its system message as the system span, turns 1-2 with their reference replies,
extended with the next sessions' turns when T is longer, and cut at T.

``measure(model, lengths, layers, device, ...)`` is the function ``gpu_check.py`` calls.

Usage::

    python kernels_bench/bench_attention_capture.py                      # tiny random Llama, CPU
    python kernels_bench/bench_attention_capture.py --model smollm2 --lengths 2048 --repeats 3 --json F
    python kernels_bench/bench_attention_capture.py --device cuda --model smollm2 --lengths 1024,2048,4096,8192,16384
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sysbench_gpu.attention.capture.hooks import AttentionShareCapture
from sysbench_gpu.attention.capture.layers import attention_modules, resolve_layers
from sysbench_gpu.attention.capture.span_math import eager_reference_shares  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "sysbench" / "sessions.json"
LEAD_TOKENS = 3
# Random inputs: a system span the size SysBench's lead + system spans have on average with Qwen2's tokenizer
# (298 keys over the 1000 forwards of the published Qwen2-72B run; docs/attention.md, "Estimate").
SYSTEM_TOKENS = 300
EAGER_BENCH_IMPL = "sysbench_bench_eager_at_layers"

Inputs = tuple[torch.Tensor, list[tuple[int, int]]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--model", default="tiny", help="tiny (random-weight Llama, GQA), smollm2, or a model path")
    parser.add_argument("--lengths", default="1024,2048,4096,8192", help="sequence lengths")
    parser.add_argument("--layers", default="mid,last", help="layers to capture (mid, last, numbers)")
    parser.add_argument(
        "--dtype", default="auto", help="auto (bfloat16 on CUDA, float32 on the CPU), float32, bfloat16, float16"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per measurement (median reported)")
    parser.add_argument("--chunk-mib", type=int, default=32, help="capture's score-block budget (MiB)")
    parser.add_argument(
        "--eager-max-gib", type=float, default=4.0, help="skip eager when one layer's scores exceed this"
    )
    parser.add_argument("--no-eager", action="store_true", help="do not run eager attention")
    parser.add_argument(
        "--fallback", action="store_true", help="also time the capture's fallback path (full LSE recomputation)"
    )
    parser.add_argument(
        "--data", default=str(DEFAULT_DATA), help="SysBench sessions.json for real inputs (models with a tokenizer)"
    )
    parser.add_argument("--session", type=int, default=1, help="system id of the session that starts the input")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    return parser.parse_args(argv)


def default_dtype(device: str) -> torch.dtype:
    """bf16 on CUDA (in fp32 SDPA falls back to its math kernel and builds [1, H, T, T]); fp32 on the CPU."""
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def build_model(name: str, dtype: torch.dtype, device: str) -> tuple[Any, Any]:
    """The model (SDPA) and its tokenizer (None for the tiny random model)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if name == "tiny":
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=1000,
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=32768,
        )
        return LlamaForCausalLM(config).to(dtype).to(device).eval(), None
    from sysbench_gpu.engines.models import resolve_model

    path = resolve_model(name)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    return model.to(device).eval(), AutoTokenizer.from_pretrained(path)


# ----------------------------------------------------------------- inputs


def random_inputs(vocab_size: int, device: str) -> Callable[[int], Inputs]:
    def make(length: int) -> Inputs:
        generator = torch.Generator().manual_seed(length)
        ids = torch.randint(0, min(vocab_size, 1000), (1, length), generator=generator).to(device)
        return ids, [
            (0, min(LEAD_TOKENS, length)),
            (min(LEAD_TOKENS, length), min(LEAD_TOKENS + SYSTEM_TOKENS, length)),
        ]

    return make


def sysbench_inputs(tokenizer: Any, data: Path, first_session: int, device: str) -> Callable[[int], Inputs]:
    """A real SysBench conversation through the chat template, extended with later sessions' turns and cut at T."""
    from sysbench_gpu.attention.capture.segments import TurnText, layout_conversation
    from sysbench_gpu.benchmarks.registry import load_dataset

    sessions = load_dataset(data).sessions
    start = next((i for i, s in enumerate(sessions) if s.system_id == first_session), None)
    if start is None:
        raise SystemExit(f"{data}: no session {first_session}")
    ordered = sessions[start:] + sessions[:start]
    pieces = [(t.user, t.reference) for s in ordered for t in s.turns if t.reference]  # turns 1-2 have references
    system_prompt = ordered[0].system_prompt
    cache: dict[int, Any] = {}

    def layout_for(length: int) -> Any:
        # Grow the number of turns until the rendered conversation reaches the length.
        count = 2
        while True:
            if count not in cache:
                turns = [TurnText(i + 1, user, reply) for i, (user, reply) in enumerate(pieces[:count])]
                cache[count] = layout_conversation(tokenizer, system_prompt, turns, "system")
            if cache[count].n_tokens >= length or count >= len(pieces):
                return cache[count]
            count = min(len(pieces), count * 2)

    def make(length: int) -> Inputs:
        layout = layout_for(length)
        if layout.n_tokens < length:
            raise SystemExit(f"{data}: all sessions together are shorter than {length} tokens")
        ids = torch.tensor([list(layout.token_ids[:length])], device=device)
        clip = lambda span: (min(span[0], length), min(span[1], length))  # noqa: E731
        return ids, [clip(layout.lead), clip(layout.system)]

    return make


# ----------------------------------------------------------------- memory


class PeakMemory:
    """Peak extra memory of a block on ``device``: its CUDA allocator peak, or the CPU peak RSS."""

    def __init__(self, device: str) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())

    def __enter__(self) -> PeakMemory:
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            with torch.cuda.device(self.device):
                torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            _release_free_heap()
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
            self.base = _status_kib("VmRSS") * 1024
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device) - self.base
        else:
            self.peak = _status_kib("VmHWM") * 1024 - self.base


def _release_free_heap() -> None:
    """Return freed heap pages to the OS so the RSS baseline is what is really in use."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _seconds(run: Callable[[], None], device: str) -> float:
    started = time.perf_counter()
    run()
    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))
    return time.perf_counter() - started


def _peak_bytes(run: Callable[[], None], device: str) -> int:
    with PeakMemory(device) as memory:
        run()
    return memory.peak


def interleaved(runs: dict[str, Callable[[], None]], device: str, repeats: int) -> dict[str, tuple[float, int]]:
    """Median seconds and peak bytes of each run, the runs interleaved and their order reversed every repeat.

    Timing and memory are separate passes: the memory reading empties the caching allocator
    (CUDA) or returns the free heap to the OS (CPU) first, and a run timed right after that
    pays for faulting its memory back in, which a run in the stage never does (on the CPU
    that alone put the capture 15% behind a plain forward at T = 1024). So the timed repeats
    run as the stage runs, back to back, and one pass per run after them reads its peak.
    """
    for run in runs.values():
        run()  # warm-up
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(max(1, repeats)):
        for name in names if repeat % 2 == 0 else reversed(names):
            times[name].append(_seconds(runs[name], device))
    return {name: (statistics.median(times[name]), _peak_bytes(runs[name], device)) for name in names}


# ----------------------------------------------------------------- eager at the selected layers


@contextlib.contextmanager
def registered_attention(name: str, function: Callable[..., Any], mask_like: str = "sdpa") -> Iterator[None]:
    """``function`` as transformers' attention implementation ``name`` for one block, always removed after it.

    transformers' registries are process-wide (``register`` writes the class's ``_global_mapping``):
    an entry left behind keeps its closure (and the model it holds) alive, and a later run
    that registers nothing would pick up the stale function.
    """
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    registries = (ALL_ATTENTION_FUNCTIONS, ALL_MASK_ATTENTION_FUNCTIONS)
    before = [(registry._global_mapping.get(name), registry._local_mapping.get(name)) for registry in registries]
    ALL_ATTENTION_FUNCTIONS.register(name, function)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS._global_mapping[mask_like])
    try:
        yield
    finally:
        for registry, (global_entry, local_entry) in zip(registries, before, strict=True):
            for mapping, entry in ((registry._global_mapping, global_entry), (registry._local_mapping, local_entry)):
                if entry is None:
                    mapping.pop(name, None)
                else:
                    mapping[name] = entry


class EagerAtLayers:
    """Switch ``model`` to an attention function that runs eager (probabilities materialized) at ``layers``
    and SDPA elsewhere, for one ``with`` block.

    The eager layers use the model file's ``eager_attention_forward`` with an additive mask
    (the SDPA mask, or the causal one where SDPA had none), so their probabilities are what
    ``output_attentions=True`` returns. ``shares[layer]`` holds the per-head span shares.
    On leaving, the model is back on SDPA and transformers' registries hold no entry of ours.
    """

    def __init__(self, model: Any, layers: list[int], spans: list[tuple[int, int]]) -> None:
        self.model, self.layers, self.spans = model, set(layers), spans
        self.shares: dict[int, torch.Tensor] = {}
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> EagerAtLayers:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
        layers, spans, shares = self.layers, self.spans, self.shares  # the closure holds these, not the model

        def attention(module, query, key, value, attention_mask, **kwargs):
            if getattr(module, "layer_idx", None) not in layers:
                return sdpa(module, query, key, value, attention_mask, **kwargs)
            eager = sys.modules[type(module).__module__].eager_attention_forward
            output, weights = eager(module, query, key, value, _additive(attention_mask, query), **kwargs)
            shares[module.layer_idx] = eager_reference_shares(weights, spans)
            return output, None

        with contextlib.ExitStack() as stack:  # undone at once if switching the model fails
            stack.enter_context(registered_attention(EAGER_BENCH_IMPL, attention))
            self.model.set_attn_implementation(EAGER_BENCH_IMPL)
            stack.callback(self.model.set_attn_implementation, "sdpa")
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()


def _additive(mask: torch.Tensor | None, query: torch.Tensor) -> torch.Tensor:
    """The mask eager attention adds to its scores: from SDPA's boolean mask, or causal where SDPA used is_causal."""
    t_q, t_k = query.shape[2], query.shape[2] if mask is None else mask.shape[-1]
    if mask is None:
        mask = torch.ones(t_q, t_k, dtype=torch.bool, device=query.device).tril()[None, None]
    if mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill_(
        ~mask, torch.finfo(query.dtype).min
    )


# ----------------------------------------------------------------- measurement


def measure(
    model: Any,
    lengths: list[int],
    layers: list[int],
    device: str,
    repeats: int = 3,
    eager: bool = True,
    eager_max_gib: float = 4.0,
    chunk_mib: int = 32,
    input_ids_for: Callable[[int], Any] | None = None,
    fallback: bool = False,
) -> list[dict[str, Any]]:
    """One row per length: plain, capture (and fallback) timed interleaved, eager after; peaks; shares vs eager.

    ``input_ids_for(T)`` returns token ids ``[1, T]`` on ``device``, or ``(ids, spans)``; default:
    random ids with a 3-token lead and a 300-token system span.
    """
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    make = input_ids_for or random_inputs(config.vocab_size, device)
    heads = config.num_attention_heads
    element = torch.finfo(next(model.parameters()).dtype).bits // 8
    budget = int(chunk_mib) << 20
    rows = []
    for length in lengths:
        made = make(length)
        ids, spans = made if isinstance(made, tuple) else (made, random_inputs(config.vocab_size, device)(length)[1])
        captured: dict[str, Any] = {}

        def plain(ids: Any = ids) -> None:
            with torch.inference_mode():
                model(input_ids=ids, use_cache=False, logits_to_keep=1)

        def capture_with(
            path: str, per_head: bool = False, ids: Any = ids, spans: Any = spans, captured: dict[str, Any] = captured
        ) -> Callable[[], None]:
            def run() -> None:
                with AttentionShareCapture(
                    model, layers=layers, spans=spans, budget_bytes=budget, path=path, per_head=per_head
                ) as cap:
                    captured[path] = cap.forward(ids, stop_early=False)
                    captured[f"{path} paths"] = dict(cap.paths)

            return run

        runs = {"plain": plain, "capture": capture_with("auto")}
        if fallback:
            runs["fallback"] = capture_with("fallback")
        measured, failed = out_of_memory(functools.partial(interleaved, runs, device, repeats), device)
        if failed is not None:
            rows.append({"tokens": length, "spans": [list(s) for s in spans], "status": f"out of memory: {failed}"})
            continue
        (t_plain, m_plain), (t_cap, m_cap) = measured["plain"], measured["capture"]
        mib = lambda b: None if b is None else b / (1 << 20)  # noqa: E731
        row: dict[str, Any] = {
            "tokens": length,
            "spans": [list(s) for s in spans],
            "plain_s": t_plain,
            "capture_s": t_cap,
            "capture_over_plain_time": t_cap / t_plain,
            "plain_peak_mib": mib(m_plain),
            "capture_peak_mib": mib(m_cap),
            "capture_paths": {str(k): v for k, v in captured["auto paths"].items()},
            "eager_s": None,
            "eager_peak_mib": None,
            "eager_over_capture_memory": None,
            "eager_over_capture_time": None,
            "max_abs_diff_vs_eager": None,
            "max_abs_diff_per_head_vs_eager": None,
        }
        if fallback:
            row.update(
                fallback_s=measured["fallback"][0],
                fallback_peak_mib=mib(measured["fallback"][1]),
                fallback_over_plain_time=measured["fallback"][0] / t_plain,
            )
        # One layer's scores and probabilities at a time: what eager holds at its peak beyond a plain forward.
        eager_bytes = 2 * heads * length * length * element
        row.update(
            eager_layer_bytes=eager_bytes,
            eager_estimate_mib=mib(eager_bytes),
            eager_extra_peak_mib=None,
            eager_peak_source=peak_source(device),
            eager_status="not run (eager=False)",
        )
        if eager and eager_bytes > eager_max_gib * (1 << 30):
            row["eager_status"] = (
                f"skipped: estimate {eager_bytes / (1 << 30):.2f} GiB > eager_max_gib {eager_max_gib:g}"
            )
        elif eager:
            reference: dict[int, torch.Tensor] = {}

            def run_eager(ids: Any = ids, spans: Any = spans, reference: dict[int, torch.Tensor] = reference) -> None:
                reference.update(eager_forward(model, ids, layers, spans))

            # The guard's estimate can be too low: record the failure and go on to the next length.
            timed, failed = out_of_memory(functools.partial(interleaved, {"eager": run_eager}, device, repeats), device)
            # Untimed: per-head values for the comparison.
            failed = failed or out_of_memory(capture_with("auto", per_head=True), device)[1]
            if fallback:
                failed = failed or out_of_memory(capture_with("fallback", per_head=True), device)[1]
            if failed is not None:
                row["eager_status"] = f"eager: out of memory at T={length} ({failed})"
                rows.append(row)
                continue
            ((t_eager, m_eager),) = timed.values()
            diffs = [_diff(captured["auto"][layer], reference[layer]) for layer in layers]
            row.update(
                eager_status="measured",
                eager_s=t_eager,
                eager_peak_mib=mib(m_eager),
                # Measured against the guard: eager's peak beyond a plain forward's.
                eager_extra_peak_mib=mib(m_eager - m_plain),
                eager_over_capture_time=t_eager / t_cap,
                eager_over_capture_memory=(m_eager / m_cap) if m_cap > 0 else None,
                max_abs_diff_vs_eager=max(d[0] for d in diffs),
                max_abs_diff_per_head_vs_eager=max(d[1] for d in diffs),
            )
            if fallback:
                fallback_diffs = [_diff(captured["fallback"][layer], reference[layer]) for layer in layers]
                row["fallback_max_abs_diff_per_head_vs_eager"] = max(d[1] for d in fallback_diffs)
        rows.append(row)
    return rows


def eager_forward(model: Any, ids: Any, layers: list[int], spans: list[tuple[int, int]]) -> dict[int, torch.Tensor]:
    """One forward with eager attention at ``layers``: their per-head span shares."""
    with EagerAtLayers(model, layers, spans) as eager_run, torch.inference_mode():
        model(input_ids=ids, use_cache=False, logits_to_keep=1)
    return eager_run.shares


def peak_source(device: str) -> str:
    """What the peak-memory fields measure on ``device`` (see ``PeakMemory``)."""
    if torch.device(device).type == "cuda":
        return "torch.cuda.max_memory_allocated above the allocation before the forward"
    return "peak RSS (VmHWM) above the RSS before the forward"


def out_of_memory(run: Callable[[], Any], device: str) -> tuple[Any, str | None]:
    """``(run(), None)``; on a CUDA out-of-memory error ``(None, its first line)``, once the pass's memory is freed.

    The memory is freed after the ``except`` block ends: inside it, the traceback still holds the
    failed forward's frames and so its tensors. ``torch.cuda.OutOfMemoryError`` exists in every
    torch the package allows (``torch.OutOfMemoryError`` only from 2.5).
    """
    result, message = None, None
    try:
        result = run()
    except torch.cuda.OutOfMemoryError as error:
        message = str(error).splitlines()[0][:200]
    if message is not None:
        release_memory(device)
    return result, message


def release_memory(device: str) -> None:
    """Give back what a failed run left in the caching allocator before the next length."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def _diff(shares: Any, eager_per_head: torch.Tensor) -> tuple[float, float]:
    """(head mean, per head) largest |capture - eager|."""
    eager_per_head = eager_per_head.float().cpu()
    mean = float((shares.mean.float().cpu() - eager_per_head.mean(dim=1)).abs().max())
    per_head = (
        float((shares.per_head.float().cpu() - eager_per_head).abs().max()) if shares.per_head is not None else mean
    )
    return mean, per_head


# ----------------------------------------------------------------- command line


def print_rows(rows: list[dict[str, Any]], header: bool = True) -> None:
    fallback = any("fallback_s" in row for row in rows)
    line = (
        f"{'T':>6} {'plain s':>8} {'capture s':>9} "
        + (f"{'fallback s':>10} " if fallback else "")
        + f"{'eager s':>8} {'cap/plain t':>11} "
        + (f"{'fb/plain t':>10} " if fallback else "")
        + f"{'plain MiB':>9} {'capture MiB':>11} {'eager MiB':>9} {'eager/cap mem':>13} "
        f"{'max|diff|':>9} {'per head':>9}"
    )
    if header:
        print(line)
    for row in rows:
        if "status" in row:  # the plain and capture pass ran out of memory: nothing was measured
            print(f"{row['tokens']:>6} {row['status']}", flush=True)
            continue
        secs = lambda s: "-" if s is None else f"{s:.3f}"  # noqa: E731
        mib = lambda b: "-" if b is None else f"{b:.0f}"  # noqa: E731
        ratio = lambda r: "-" if r is None else f"{r:.3f}"  # noqa: E731
        sci = lambda d: "-" if d is None else f"{d:.1e}"  # noqa: E731
        print(
            f"{row['tokens']:>6} {secs(row['plain_s']):>8} {secs(row['capture_s']):>9} "
            + (f"{secs(row.get('fallback_s')):>10} " if fallback else "")
            + f"{secs(row['eager_s']):>8} {ratio(row['capture_over_plain_time']):>11} "
            + (f"{ratio(row.get('fallback_over_plain_time')):>10} " if fallback else "")
            + f"{mib(row['plain_peak_mib']):>9} {mib(row['capture_peak_mib']):>11} {mib(row['eager_peak_mib']):>9} "
            f"{ratio(row['eager_over_capture_memory']):>13} {sci(row['max_abs_diff_vs_eager']):>9} "
            f"{sci(row['max_abs_diff_per_head_vs_eager']):>9}",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dtype = default_dtype(args.device) if args.dtype == "auto" else getattr(torch, args.dtype)
    model, tokenizer = build_model(args.model, dtype, args.device)
    config = model.config
    n_layers = config.num_hidden_layers
    layers = sorted(set(resolve_layers(args.layers, n_layers).values()))
    lengths = [int(x) for x in args.lengths.split(",")]
    source = "random ids, 3-token lead, 300-token system span"
    input_ids_for = None
    if tokenizer is not None:
        input_ids_for = sysbench_inputs(tokenizer, Path(args.data), args.session, args.device)
        source = (
            f"SysBench session {args.session} of {args.data} (and later sessions' turns), through the chat template"
        )
    print(
        f"model {args.model}: {n_layers} layers, {config.num_attention_heads} heads / "
        f"{config.num_key_value_heads} KV heads, "
        f"{str(dtype).replace('torch.', '')}, device {args.device}, capture layers {layers}, "
        f"threads {torch.get_num_threads()}, "
        f"{len(attention_modules(model))} attention modules; input: {source}",
        flush=True,
    )
    rows = []
    for length in lengths:  # one length at a time, so each row prints as soon as it is measured
        rows += measure(
            model,
            [length],
            layers,
            args.device,
            repeats=args.repeats,
            eager=not args.no_eager,
            eager_max_gib=args.eager_max_gib,
            chunk_mib=args.chunk_mib,
            input_ids_for=input_ids_for,
            fallback=args.fallback,
        )
        print_rows(rows[-1:], header=len(rows) == 1)
    for row in rows:
        print(f"T={row['tokens']}: spans {row['spans']}, capture paths {row.get('capture_paths', '-')}")
    if args.json:
        report = {
            "args": vars(args),
            "dtype": str(dtype).replace("torch.", ""),
            "layers": layers,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "rows": rows,
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
