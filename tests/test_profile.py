"""profile: roofline FLOPs, bytes and bounds against hand-worked examples; what-ifs; device specs.

Pure arithmetic, no model is loaded. Every expected number is worked by hand in the
comment beside it (checked with plain integer arithmetic, independent of the module).
"""

from __future__ import annotations

import json

import pytest

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.profiling.bounds import segment_bound
from sysbench_gpu.profiling.device_specs import builtin_table, load_device_spec
from sysbench_gpu.profiling.inputs import Request, RunCall
from sysbench_gpu.profiling.model_config import reference_configs
from sysbench_gpu.profiling.roofline import (
    Layout,
    ModelShape,
    SequenceTokens,
    dtype_bytes,
    sequence_work,
)
from sysbench_gpu.profiling.schedule import (
    Hardware,
    call_bound,
    client_threads,
    makespan,
    turn_synchronous,
    what_ifs,
)

LLAMA_31_8B = {
    "model_type": "llama",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}
QWEN2_72B = {
    "model_type": "qwen2",
    "num_hidden_layers": 80,
    "hidden_size": 8192,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "intermediate_size": 29568,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
    "sliding_window": 131072,
    "use_sliding_window": False,
}
H100 = load_device_spec("h100")  # 989e12 FLOP/s, 3.35e12 B/s, 80e9 B


def test_llama_31_8b_parameters_and_per_token_costs():
    shape = ModelShape.from_config(LLAMA_31_8B)
    # Per layer: q 4096*4096 = 16,777,216; k and v 4096*1024 = 4,194,304 each; o 16,777,216
    # -> attention 41,943,040; MLP 3*4096*14336 = 176,160,768; matmuls 218,103,808; + norms 2*4096
    # -> 218,112,000. Embedding and lm head 128256*4096 = 525,336,576 each; final norm 4096.
    assert shape.layer_matmul_params == 218_103_808
    assert shape.layer_params == 218_112_000
    # 32*218,112,000 + 2*525,336,576 + 4096 = 8,030,261,248 (the published 8.03B)
    assert shape.total_params == 8_030_261_248
    # A forward reads the layers, the final norm and the lm head: 6,979,584,000 + 4096 + 525,336,576
    assert shape.params_read_per_forward == 7_504_924_672
    assert shape.linear_flops_per_token == 2 * 32 * 218_103_808 == 13_958_643_712
    assert shape.lm_head_flops == 2 * 525_336_576 == 1_050_673_152
    # QK^T and AV: 4 * layers * heads * head_dim = 4*32*32*128
    assert shape.attention_flops_per_key == 524_288
    # K and V of one token: 2*32 layers*8 KV heads*128 = 65,536 elements, 131,072 bytes in bf16
    assert shape.kv_elements_per_token() * dtype_bytes("bfloat16") == 131_072


def test_llama_31_8b_one_sequence_of_1000_prompt_and_200_output_tokens_on_h100():
    shape = ModelShape.from_config(LLAMA_31_8B)
    seq = SequenceTokens(prompt=1000, cached=0, output=200)
    work = sequence_work(shape, seq, kv_bytes_per_element=2)
    # Prefill: 1000 tokens * 13,958,643,712 = 13,958,643,712,000
    #   + attention 524,288 * (1 + 2 + ... + 1000 = 500,500) = 262,406,144,000
    #   + one lm-head row 1,050,673,152                      = 14,222,100,529,152
    assert work.prefill_flops == 14_222_100_529_152
    # Decode: 199 steps (the prefill gave token 1) * (13,958,643,712 + 1,050,673,152) = 2,986,854,055,936
    #   + attention 524,288 * (1001 + ... + 1199 = 218,900) = 114,766,643,200  -> 3,101,620,699,136
    assert work.decode_flops == 3_101_620_699_136
    # KV: the prefill writes 1000 tokens; decode reads 1000 + ... + 1198 = 218,701 and writes 199
    # -> (1000 + 218,900) * 131,072 = 28,822,732,800 bytes
    assert work.kv_bytes == 28_822_732_800
    bound = segment_bound(shape, work, seq.forwards, H100, Layout(), weight_bytes_per_param=2)
    # Memory: 200 forwards * 7,504,924,672 * 2 B = 3,001,969,868,800 + KV 28,822,732,800
    #   = 3,030,792,601,600 B / 3.35e12 B/s = 0.90471 s
    # Compute: 17,323,721,228,288 FLOPs / 989e12 = 0.017516 s   -> memory bound
    assert bound.memory_s == pytest.approx(3_030_792_601_600 / 3.35e12)
    assert bound.compute_s == pytest.approx(17_323_721_228_288 / 989e12)
    assert bound.bound_s == pytest.approx(0.9047142, rel=1e-6)
    assert bound.bound_by == "memory"
    assert bound.prefill.bound_by == "compute" and bound.decode.bound_by == "memory"


def test_qwen2_72b_under_tensor_parallel_4():
    shape = ModelShape.from_config(QWEN2_72B)
    # Per layer: q 8192*8192 = 67,108,864; k, v 8192*1024 = 8,388,608 each; o 67,108,864 -> 150,994,944;
    # q/k/v biases 8192 + 1024 + 1024 = 10,240; MLP 3*8192*29568 = 726,663,168; norms 16,384
    # -> 877,684,736 per layer; 80 layers = 70,214,778,880; embedding + lm head 2*152064*8192 = 2,491,416,576;
    # final norm 8192 -> 72,706,203,648 (the published 72.7B).
    assert shape.qkv_bias and shape.sliding_window is None
    assert shape.total_params == 72_706_203_648
    assert shape.params_read_per_forward == 70_214_778_880 + 8192 + 1_245_708_288 == 71_460_495_360
    # 8 sequences, each a 2048-token prompt of which 1024 are cached, and 256 output tokens.
    seqs = [SequenceTokens(2048, 1024, 256)] * 8
    requests = [Request(i, 1, s) for i, s in enumerate(seqs, start=1)]
    hw = Hardware(shape, H100, Layout(tp=4), weight_bytes=2, kv_bytes=2)
    call = RunCall(index=1, turn=1, measured_s=None, requests=requests, cached_reported=True)
    bound = call_bound(call, hw, engine="vllm", batch_size=None)
    # Per sequence, linear FLOPs per token 2*80*877,658,112 = 140,425,297,920; attention per key
    # 4*80*64*128 = 2,621,440; lm head 2*152064*8192 = 2,491,416,576.
    # Prefill: 1024 new tokens * 140,425,297,920 = 143,795,505,070,080
    #   + 2,621,440 * (1025 + ... + 2048 = 1,573,376) = 4,124,510,781,440 + 2,491,416,576 = 147,922,507,268,096
    # Decode: 255 * (140,425,297,920 + 2,491,416,576) = 36,443,762,196,480
    #   + 2,621,440 * (2049 + ... + 2303 = 554,880) = 1,454,584,627,200 -> 37,898,346,823,680
    # Eight sequences: 8 * 185,820,854,091,776 = 1,486,566,832,734,208 FLOPs
    assert bound.work.flops == 1_486_566_832_734_208
    # KV per token 2*80*8*128*2 B = 327,680. Per sequence: prefill reads 1024 cached + writes 1024;
    # decode reads 2048 + ... + 2302 = 554,625 and writes 255 -> 556,928 tokens = 182,494,167,040 B; x8:
    assert bound.kv_bytes == 8 * 182_494_167_040 == 1_459_953_336_320
    # Weights: 256 forwards (the longest reply) * 71,460,495,360 * 2 B = 36,587,773,624,320.
    # TP 4 splits weights, KV (8 KV heads over 4 GPUs, no replication) and FLOPs over 4 GPUs:
    # memory (36,587,773,624,320 + 1,459,953,336,320) / (4 * 3.35e12) = 2.83938 s
    # compute 1,486,566,832,734,208 / (4 * 989e12) = 0.37578 s
    assert bound.memory_s == pytest.approx(38_047_726_960_640 / (4 * 3.35e12))
    assert bound.compute_s == pytest.approx(1_486_566_832_734_208 / (4 * 989e12))
    assert bound.bound_s == pytest.approx(2.8393826, rel=1e-6)
    assert bound.bound_by == "memory"
    # Pipeline parallel 4 instead: same aggregate, but the 256 forwards pass the 4 stages one after
    # another, each reading its quarter: 256 * 142,920,990,720 B / 3.35e12 = 10.92 s binds.
    piped = call_bound(call, hw.with_layout(Layout(pp=4)), engine="vllm", batch_size=None)
    assert piped.bound_s == pytest.approx(256 * 71_460_495_360 * 2 / 3.35e12)


def _two_turn_sessions(n_sessions: int) -> list[RunCall]:
    turn1 = [Request(s, 1, SequenceTokens(500, 0, 100)) for s in range(1, n_sessions + 1)]
    turn2 = [Request(s, 2, SequenceTokens(700, 600, 50)) for s in range(1, n_sessions + 1)]
    return [RunCall(1, 1, None, turn1, True), RunCall(2, 2, None, turn2, True)]


def test_what_if_20_threads_against_a_server_on_h100():
    shape = ModelShape.from_config(LLAMA_31_8B)
    hw = Hardware(shape, H100, Layout(), weight_bytes=2, kv_bytes=2)
    calls = _two_turn_sessions(40)
    threads = client_threads(calls, hw, threads=20)
    # KV fits: (0.9 * 80e9 - 8,030,261,248 * 2) / (131,072 B * mean context (600 + 750) / 2) = 631 >= 20 threads.
    assert threads.slots == 20 and not threads.notes
    # Each session takes 100 + 50 = 150 forwards on its thread; 40 sessions on 20 threads -> 300 forwards.
    assert threads.bound.forwards == 300
    # KV per session: turn 1 writes 500, reads 500..598 (54,351) and writes 99 -> 54,950 tokens;
    # turn 2 reads 600 cached, writes 100, reads 700..748 (35,476), writes 49 -> 36,225; 91,175 * 131,072 B
    # = 11,950,489,600 B; 40 sessions: 478,019,584,000 B. Weights 300 * 7,504,924,672 * 2 = 4,502,954,803,200 B.
    # (4,502,954,803,200 + 478,019,584,000) / 3.35e12 = 1.48686 s; compute ~0.43 s -> memory bound.
    assert threads.bound.bound_s == pytest.approx(4_980_974_387_200 / 3.35e12)
    assert threads.bound.bound_by == "memory"
    sync = turn_synchronous(calls, hw)
    # Turn-synchronous: turn 1 takes 100 forwards:
    # (100 * 15,009,849,344 + 40 * 54,950 * 131,072) / 3.35e12 = 0.534054 s;
    # turn 2 takes 50: (50 * 15,009,849,344 + 40 * 36,225 * 131,072) / 3.35e12 = 0.280721 s; together 0.814775 s.
    assert sync.bound.forwards == 150
    assert sync.bound.bound_s == pytest.approx(0.8147752, rel=1e-6)
    # So 20 threads need 1.8249x the turn-synchronous time on the same requests.
    assert threads.bound.bound_s / sync.bound.bound_s == pytest.approx(1.824869, rel=1e-5)
    results = {w.name: w for w in what_ifs(calls, hw, threads=20, layouts=[Layout(dp=2)])}
    assert results["20 client threads"].bound.bound_s == threads.bound.bound_s
    # One session at a time: every request alone; 40 * (100 + 50) = 6000 forwards.
    assert results["one session at a time"].bound.forwards == 6000
    # Two data-parallel replicas each take 20 sessions: each turn's forwards are unchanged, halving KV traffic
    # per replica; the bound is the slowest replica: (100 * 15,009,849,344 + 20 * 54,950 * 131,072) / 3.35e12 + ...
    dp2 = results["turn-synchronous, tp=1,pp=1,dp=2"].bound
    expected = (
        (100 * 15_009_849_344 + 20 * 54_950 * 131_072) + (50 * 15_009_849_344 + 20 * 36_225 * 131_072)
    ) / 3.35e12
    assert dp2.bound_s == pytest.approx(expected)


def test_makespan_and_memory_cap():
    assert makespan([5, 3, 4], None) == 5
    assert makespan([5, 3, 4], 2) == 7  # 5 on slot 1; 3 then 4 on slot 2
    assert makespan([], 3) == 0
    shape = ModelShape.from_config(LLAMA_31_8B)
    small = Hardware(shape, load_device_spec("h100"), Layout(), 2, 2, memory_utilization=0.2)
    # 0.2 * 80e9 = 16e9 B < 16,060,522,496 B of weights: nothing fits.
    result = turn_synchronous(_two_turn_sessions(4), small)
    assert result.bound is None and "exceed" in result.notes[0]


def test_sliding_window_caps_attention_and_kv_reads():
    windowed = ModelShape.from_config({**LLAMA_31_8B, "sliding_window": 100})
    full = ModelShape.from_config(LLAMA_31_8B)
    seq = SequenceTokens(prompt=150, cached=0, output=1)
    # Keys seen by queries 1..150: 1+...+100 + 50*100 = 5050 + 5000 = 10,050 (full attention: 11,325).
    win, ful = sequence_work(windowed, seq, 2), sequence_work(full, seq, 2)
    assert ful.prefill_flops - win.prefill_flops == (11_325 - 10_050) * 524_288


def test_hf_batches_are_sequential_by_prompt_length():
    shape = ModelShape.from_config(LLAMA_31_8B)
    hw = Hardware(shape, H100, Layout(), 2, 2)
    requests = [
        Request(1, 1, SequenceTokens(10, 0, 50)),
        Request(2, 1, SequenceTokens(30, 0, 5)),
        Request(3, 1, SequenceTokens(20, 0, 7)),
    ]
    call = RunCall(1, 1, 1.0, requests, False)
    # batch_size 2: prompts sorted 10, 20 | 30 -> forwards max(50, 7) + 5 = 55
    assert call_bound(call, hw, "hf", 2).forwards == 55
    assert call_bound(call, hw, "vllm", None).forwards == 50


def test_device_specs_table_and_files(tmp_path):
    table = builtin_table()
    assert {"h100", "h200", "a100", "cpu"} <= set(table)
    h200 = load_device_spec("H200")
    assert (h200.peak_flops, h200.memory_bandwidth, h200.memory_bytes) == (989e12, 4.8e12, 141e9)
    assert load_device_spec("a100").peak_flops == 312e12
    one = tmp_path / "mine.json"
    one.write_text(json.dumps({"peak_flops": 5e10, "memory_bandwidth": 2e10}))
    assert load_device_spec(str(one)).name == "mine"
    many = tmp_path / "lab.json"
    many.write_text(
        json.dumps(
            {
                "devices": {
                    "l40s": {"peak_flops": 362e12, "memory_bandwidth": 864e9},
                    "x": {"peak_flops": 1, "memory_bandwidth": 1},
                }
            }
        )
    )
    assert load_device_spec(f"{many}#l40s").peak_flops == 362e12
    with pytest.raises(SysbenchError, match="name one"):
        load_device_spec(str(many))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"peak_flops": -1, "memory_bandwidth": 2e10}))
    with pytest.raises(SysbenchError, match="bad.json: field 'peak_flops'"):
        load_device_spec(str(bad))
    with pytest.raises(SysbenchError, match="neither a known device"):
        load_device_spec("tpu9")


def test_packaged_reference_configs_and_unsupported_models():
    configs = reference_configs()
    assert ModelShape.from_config(configs["llama-3.1-8b"]).total_params == 8_030_261_248
    assert ModelShape.from_config(configs["qwen2-72b"]).total_params == 72_706_203_648
    # Qwen2-7B: 28 * 233,057,792 + 2 * 152064 * 3584 + 3584 = 7,615,616,512 (the published 7.6B)
    assert ModelShape.from_config(configs["qwen2-7b"]).total_params == 7_615_616_512
    with pytest.raises(SysbenchError, match="mixture-of-experts"):
        ModelShape.from_config({**LLAMA_31_8B, "num_local_experts": 8}, name="mixtral")
    with pytest.raises(SysbenchError, match="'hidden_size'"):
        ModelShape.from_config({k: v for k, v in LLAMA_31_8B.items() if k != "hidden_size"})
    with pytest.raises(SysbenchError, match="tp=4"):
        Layout.parse("tp=four")
    assert Layout.parse("dp=2", Layout(tp=4)) == Layout(tp=4, dp=2)
