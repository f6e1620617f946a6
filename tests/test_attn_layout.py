"""How the attention stage places the model: load arguments per layout, CUDA device binding, head checks."""

from __future__ import annotations

import types

import pytest

from sysbench_gpu.attention.capture.layout import (
    Distributed,
    LoadPlan,
    check_tensor_parallel_heads,
    plan_load,
)
from sysbench_gpu.core.errors import SysbenchError

SOLO = Distributed(rank=0, world=1, local_rank=0)
RANK2_OF_4 = Distributed(rank=2, world=4, local_rank=2)


def test_data_parallel_rank_binds_its_own_gpu_and_loads_straight_onto_it():
    plan = plan_load("auto", None, False, RANK2_OF_4, cuda_available=True)
    assert plan == LoadPlan("data-parallel", device_map={"": "cuda:2"}, cuda_device=2)
    assert plan.splits_sessions
    # `--device cuda` means this rank's GPU, not GPU 0.
    assert plan_load("cuda", None, False, RANK2_OF_4, cuda_available=True).device_map == {"": "cuda:2"}
    assert plan_load("cuda:1", None, False, SOLO, cuda_available=True) == LoadPlan("single", {"": "cuda:1"}, 1)


def test_cpu_and_device_map_layouts():
    assert plan_load("auto", None, False, SOLO, cuda_available=False) == LoadPlan("single", {"": "cpu"}, None)
    assert plan_load("auto", None, False, RANK2_OF_4, cuda_available=False).device_map == {"": "cpu"}
    plan = plan_load("auto", "auto", False, SOLO, cuda_available=True)
    assert plan == LoadPlan("device-map", device_map="auto") and plan.cuda_device is None
    with pytest.raises(SysbenchError, match="do not combine it with torchrun"):
        plan_load("auto", "auto", False, RANK2_OF_4, cuda_available=True)
    with pytest.raises(SysbenchError, match="no CUDA device"):
        plan_load("cuda:0", None, False, SOLO, cuda_available=False)
    with pytest.raises(SysbenchError, match="not cpu, cuda or cuda:N"):
        plan_load("cuda:x", None, False, SOLO, cuda_available=True)


def test_tensor_parallel_plan_and_its_refusals():
    plan = plan_load("auto", None, True, RANK2_OF_4, cuda_available=True)
    assert plan == LoadPlan("tensor-parallel", device_map=None, cuda_device=2, tensor_parallel_size=4)
    assert not plan.splits_sessions  # every rank runs every session
    assert plan_load("auto", None, True, RANK2_OF_4, cuda_available=False).cuda_device is None
    for device, device_map, dist, message in (
        ("auto", None, SOLO, "needs several processes"),
        ("auto", "auto", RANK2_OF_4, "choose one"),
        ("cuda:0", None, RANK2_OF_4, "leave --device at auto"),
    ):
        with pytest.raises(SysbenchError, match=message):
            plan_load(device, device_map, True, dist, cuda_available=True)


def _config(heads, kv_heads, plan=True):
    return types.SimpleNamespace(
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        model_type="llama",
        base_model_tp_plan={"layers.*.self_attn.q_proj": "colwise"} if plan else None,
    )


def test_tensor_parallel_head_counts_must_divide():
    check_tensor_parallel_heads(_config(9, 3), 3, "smollm2")
    check_tensor_parallel_heads(_config(64, 8), 4, "Qwen2-72B")
    with pytest.raises(SysbenchError) as error:
        check_tensor_parallel_heads(_config(9, 3), 2, "smollm2")
    assert str(error.value) == (
        "--tensor-parallel over 2 ranks: smollm2 has 9 attention heads and 3 key/value heads, "
        "and both must divide by 2 (use --nproc-per-node in [3])"
    )
    with pytest.raises(SysbenchError, match=r"28 attention heads and 4 key/value heads.*in \[2, 4\]"):
        check_tensor_parallel_heads(_config(28, 4), 8, "Qwen2-7B")  # KV heads fail although 28 % 8 != 0 too
    with pytest.raises(SysbenchError, match="no tensor-parallel plan"):
        check_tensor_parallel_heads(_config(8, 8, plan=False), 2, "custom")


def test_load_model_binds_the_device_before_loading_and_never_copies_through_the_host(monkeypatch, smollm2_path):
    """Issue 8 defect 8 on the CPU: record what load_model asks of torch.cuda and from_pretrained."""
    import torch
    from transformers import AutoModelForCausalLM

    from sysbench_gpu.attention.capture import layout as attn_layout

    events = []

    class FakeModel:
        def eval(self):
            events.append(("eval",))
            return self

        def to(self, *args, **kwargs):  # a host copy moved afterwards would call this
            events.append(("to", args))
            return self

    def fake_from_pretrained(path, **kwargs):
        events.append(("from_pretrained", kwargs))
        return FakeModel()

    monkeypatch.setattr(torch.cuda, "set_device", lambda index: events.append(("set_device", index)))
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", fake_from_pretrained)
    plan = plan_load("auto", None, False, RANK2_OF_4, cuda_available=True)
    attn_layout.load_model("smollm2", "bfloat16", plan)
    assert [e[0] for e in events] == ["set_device", "from_pretrained", "eval"]
    assert events[0] == ("set_device", 2)
    assert events[1][1] == {"dtype": torch.bfloat16, "device_map": {"": "cuda:2"}}

    events.clear()
    attn_layout.load_model("smollm2", "auto", plan_load("auto", "auto", False, SOLO, cuda_available=True))
    assert events[0] == ("from_pretrained", {"dtype": "auto", "device_map": "auto"})

    events.clear()
    attn_layout.load_model(
        "smollm2", "float32", plan_load("auto", None, True, Distributed(1, 3, 1), cuda_available=False)
    )
    kwargs = events[0][1]
    assert "device_map" not in kwargs and kwargs["distributed_config"].tp_size == 3
    assert kwargs["distributed_config"].tp_plan == "auto"


@pytest.mark.gpu
def test_data_parallel_rank_loads_onto_its_own_gpu_only(smollm2_path):
    """On a CUDA machine: the last GPU's rank holds every weight there and allocates nothing on GPU 0."""
    import torch

    from sysbench_gpu.attention.capture import layout as attn_layout

    last = torch.cuda.device_count() - 1
    rank = Distributed(rank=last, world=last + 1, local_rank=last)
    model, _, _ = attn_layout.load_model(
        "smollm2", "bfloat16", plan_load("auto", None, False, rank, cuda_available=True)
    )
    assert torch.cuda.current_device() == last
    assert {str(p.device) for p in model.parameters()} == {f"cuda:{last}"}
    if last > 0:
        assert torch.cuda.memory_allocated(0) == 0


def test_any_model_load_failure_is_one_line(monkeypatch, smollm2_path):
    """A failure inside from_pretrained (not caught by the model-folder checks) is one SysbenchError line."""
    from transformers import AutoModelForCausalLM

    from sysbench_gpu.attention.capture import layout as attn_layout
    from sysbench_gpu.core.errors import SysbenchError

    def broken(path, **kwargs):
        raise RuntimeError("size mismatch for model.layers.0.self_attn.q_proj.weight\nsecond line of detail")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", broken)
    with pytest.raises(SysbenchError) as caught:
        attn_layout.load_model("smollm2", "float32", plan_load("cpu", None, False, SOLO, cuda_available=False))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("attention could not load model 'smollm2'") and "size mismatch" in message
