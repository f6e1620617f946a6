"""kernels_bench/bench_attention_capture.py: its rows, its SysBench inputs, its eager reference, its memory reading."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BENCH_DIR = Path(__file__).resolve().parent.parent / "kernels_bench"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH_DIR))
    try:
        import bench_attention_capture

        return bench_attention_capture
    finally:
        sys.path.remove(str(BENCH_DIR))


def _tiny_qwen2():
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    return transformers.Qwen2ForCausalLM(config).eval()


def test_measure_rows_have_the_contract_fields(bench):
    model = _tiny_qwen2()
    rows = bench.measure(model, [40, 77], [2, 3], "cpu", repeats=2, chunk_mib=1, fallback=True)
    assert [row["tokens"] for row in rows] == [40, 77]
    for row in rows:
        for field in (
            "plain_s",
            "capture_s",
            "eager_s",
            "fallback_s",
            "capture_over_plain_time",
            "eager_over_capture_memory",
            "plain_peak_mib",
            "capture_peak_mib",
            "eager_peak_mib",
        ):
            assert row[field] is not None, field
        assert row["capture_over_plain_time"] == pytest.approx(row["capture_s"] / row["plain_s"])
        assert row["max_abs_diff_vs_eager"] < 1e-5 and row["max_abs_diff_per_head_vs_eager"] < 1e-5
        assert row["fallback_max_abs_diff_per_head_vs_eager"] < 1e-5
        assert row["capture_paths"] == {"2": "kernel-lse (torch-cpu-flash)", "3": "kernel-lse (torch-cpu-flash)"}
        assert row["spans"] == [[0, 3], [3, min(303, row["tokens"])]]
    assert model.config._attn_implementation == "sdpa"  # the eager reference switched it back


def test_eager_at_selected_layers_is_output_attentions(bench):
    model = _tiny_qwen2()
    ids = torch.randint(0, 97, (1, 33), generator=torch.Generator().manual_seed(1))
    spans = [(0, 2), (2, 20)]
    model.set_attn_implementation("eager")
    with torch.no_grad():
        full = model(input_ids=ids, output_attentions=True)
    model.set_attn_implementation("sdpa")
    with bench.EagerAtLayers(model, [1, 3], spans) as eager, torch.no_grad():
        logits = model(input_ids=ids).logits
    assert torch.allclose(logits, full.logits, atol=1e-5)
    for layer in (1, 3):
        expected = torch.stack([full.attentions[layer][..., a:b].sum(-1) for a, b in spans], dim=-1)
        assert torch.allclose(eager.shares[layer], expected, atol=1e-6)
    assert set(eager.shares) == {1, 3}


def test_sysbench_inputs_are_a_real_session_cut_at_the_length(bench, smollm2_path, sessions_file, dataset):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    make = bench.sysbench_inputs(tokenizer, sessions_file, 1, "cpu")
    ids, spans = make(3000)  # longer than session 1's two referenced turns: later sessions' turns extend it
    assert ids.shape == (1, 3000)
    (lead_start, lead_end), (system_start, system_end) = spans
    assert lead_start == 0 and lead_end == system_start and system_end > system_start
    session = next(s for s in dataset.sessions if s.system_id == 1)
    assert tokenizer.decode(ids[0, system_start:system_end]).strip() == session.system_prompt.strip()
    assert session.turns[0].user in tokenizer.decode(ids[0, system_end:])
    short, short_spans = make(200)  # shorter than the system message: the span is cut with the input
    assert torch.equal(short[0], ids[0, :200]) and short_spans[1] == (system_start, 200)


def test_peak_memory_reads_the_device_it_is_given(bench, monkeypatch):
    """Issue 8 item 5: statistics come from the given GPU, not from the current one
    (checked with a stand-in allocator)."""
    calls = []
    allocated = {1: 100}
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(("sync", device)))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(("empty", None)))
    monkeypatch.setattr(torch.cuda, "device", lambda device: _Nothing())
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append(("reset", device)))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated[torch.device(device).index])
    monkeypatch.setattr(
        torch.cuda, "max_memory_allocated", lambda device=None: 100 + 4096 * (torch.device(device).index == 1)
    )
    with bench.PeakMemory("cuda:1") as memory:
        pass
    assert memory.peak == 4096
    assert {device for kind, device in calls if kind in ("sync", "reset")} == {torch.device("cuda", 1)}
    assert bench.PeakMemory("cuda").device == torch.device("cuda", 0)  # plain "cuda": the current device, named


def test_default_dtype_is_bf16_on_cuda_only(bench):
    assert bench.default_dtype("cuda") == torch.bfloat16 and bench.default_dtype("cuda:1") == torch.bfloat16
    assert bench.default_dtype("cpu") == torch.float32
    assert bench.parse_args([]).dtype == "auto"


def test_json_output_has_rows(bench, tmp_path):
    out = tmp_path / "bench.json"
    assert bench.main(["--lengths", "48", "--repeats", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["dtype"] == "float32" and [row["tokens"] for row in report["rows"]] == [48]
    row = report["rows"][0]
    assert row["max_abs_diff_vs_eager"] < 1e-5
    # The guard's estimate (2 x 4 heads x 48^2 x 4 bytes) beside the measured peak eager adds to a plain forward.
    assert row["eager_status"] == "measured" and row["eager_layer_bytes"] == 2 * 4 * 48 * 48 * 4
    assert row["eager_estimate_mib"] == pytest.approx(row["eager_layer_bytes"] / (1 << 20))
    assert row["eager_extra_peak_mib"] == pytest.approx(row["eager_peak_mib"] - row["plain_peak_mib"])
    assert row["eager_peak_source"].startswith("peak RSS")


def _no_bench_entry(bench) -> bool:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return all(
        bench.EAGER_BENCH_IMPL not in mapping
        for registry in (ALL_ATTENTION_FUNCTIONS, ALL_MASK_ATTENTION_FUNCTIONS)
        for mapping in (registry._global_mapping, registry._local_mapping)
    )


def test_the_eager_function_is_removed_from_transformers_registry(bench):
    """Issue 21: the closure (and the model it reached) stayed registered after the benchmark."""
    import gc
    import weakref

    model = _tiny_qwen2()
    bench.measure(model, [24], [1], "cpu", repeats=1, chunk_mib=1)
    assert _no_bench_entry(bench)
    ids = torch.randint(0, 97, (1, 16), generator=torch.Generator().manual_seed(2))
    with pytest.raises(RuntimeError, match="forward failed"), bench.EagerAtLayers(model, [1], [(0, 4)]):
        assert not _no_bench_entry(bench)  # registered inside the block
        raise RuntimeError("forward failed")
    assert _no_bench_entry(bench) and model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        model(input_ids=ids)  # still runs: back on SDPA
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None  # nothing of the benchmark keeps the model alive


def test_eager_out_of_memory_is_recorded_not_fatal(bench, monkeypatch):
    def out_of_memory(model, ids, layers, spans):
        if ids.shape[1] > 32:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, ids, layers, spans)

    real = bench.eager_forward
    monkeypatch.setattr(bench, "eager_forward", out_of_memory)
    rows = bench.measure(_tiny_qwen2(), [24, 40], [1], "cpu", repeats=1, chunk_mib=1)
    fits, failed = rows
    assert fits["eager_status"] == "measured" and fits["eager_s"] is not None
    assert failed["eager_status"].startswith("eager: out of memory at T=40 (CUDA out of memory")
    assert failed["eager_s"] is None and failed["eager_peak_mib"] is None and failed["eager_extra_peak_mib"] is None
    assert failed["eager_estimate_mib"] > 0 and failed["capture_s"] > 0  # the rest of the row is measured
    assert _no_bench_entry(bench)


def test_the_eager_guard_skip_is_recorded(bench):
    row = bench.measure(_tiny_qwen2(), [24], [1], "cpu", repeats=1, chunk_mib=1, eager_max_gib=1e-9)[0]
    assert row["eager_status"].startswith("skipped: estimate") and row["eager_s"] is None


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_span_work_bench_times_both_cpu_plans(tmp_path):
    """kernels_bench/bench_span_work.py runs and records the stage's CPU plan beside the budget-only one."""
    sys.path.insert(0, str(BENCH_DIR))
    try:
        import bench_span_work
    finally:
        sys.path.remove(str(BENCH_DIR))
    out = tmp_path / "span.json"
    assert bench_span_work.main(["--lengths", "48,130", "--span", "40", "--repeats", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [row["tokens"] for row in rows] == [48, 130]
    for row in rows:
        assert row["kernel"] == "torch-cpu-flash" and row["kernel_s"] > 0
        for plan in ("stage_plan", "budget_only_plan"):
            assert row[f"kernel_lse_s_{plan}"] > 0 and row[f"fallback_s_{plan}"] > 0


def test_out_of_memory_frees_after_the_exception_is_gone(bench, monkeypatch) -> None:
    """A CUDA OOM in any pass is caught as torch.cuda.OutOfMemoryError (torch < 2.5 has no
    torch.OutOfMemoryError), and memory is released only once the traceback, which holds the
    failed forward's tensors, is gone."""
    released: list[object] = []
    monkeypatch.setattr(bench, "release_memory", lambda device: released.append(sys.exc_info()[1]))

    def failing_pass() -> None:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")

    result, message = bench.out_of_memory(failing_pass, "cuda")
    assert result is None
    assert message == "CUDA out of memory. Tried to allocate 2.00 GiB"
    assert released == [None]  # released once, outside the except block

    assert bench.out_of_memory(lambda: 7, "cuda") == (7, None)
    assert released == [None]  # nothing to release after a pass that ran
