"""profile end to end: a tiny run generated with the hf engine and SmolLM2, profiled on the CPU spec.

One generation (2 demo sessions x 5 turns x 16 tokens, ~30 s on two cores) serves every
test of this module.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sysbench_gpu.benchmarks.registry import load_run_sessions
from sysbench_gpu.cli import main
from sysbench_gpu.core.records import JudgmentRecord, Verdict
from sysbench_gpu.core.rundir import RunDir


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, smollm2_path) -> Path:
    out = tmp_path_factory.mktemp("profile") / "run"
    code = main(
        [
            "generate",
            "--data",
            "demo",
            "--model",
            "smollm2",
            "--engine",
            "hf",
            "--limit",
            "2",
            "--max-tokens",
            "16",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    return out


def _profile_json(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert main(["profile", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_profile_on_cpu_spec_every_efficiency_in_0_1_and_files_written(tiny_run, tmp_path, capsys):
    out = tmp_path / "prof"
    data = _profile_json(capsys, str(tiny_run), "--device-spec", "cpu", "--out", str(out))
    assert [c["turn"] for c in data["calls"]] == [1, 2, 3, 4, 5]
    for row in data["calls"] + [data["run"]]:
        for key in ("measured_s", "bound_s", "efficiency", "bound_by", "prompt_tokens", "output_tokens"):
            assert key in row
        assert 0 < row["efficiency"] <= 1
        assert row["bound_by"] in ("compute", "memory")
        assert row["efficiency"] == pytest.approx(row["bound_s"] / row["measured_s"])
    for row in data["calls"]:
        assert {"turn", "measured_s", "bound_s", "efficiency", "bound_by"} <= set(row)
        assert row["output_tokens"] == 2 * 16 and row["cache_hit_rate"] is None  # hf reports no cache hits
    stats = json.loads((tiny_run / "stats.json").read_text())
    assert data["run"]["measured_s"] == pytest.approx(stats["totals"]["wall_s"])
    assert data["run"]["bound_s"] == pytest.approx(sum(c["bound_s"] for c in data["calls"]))
    assert data["model"]["params"] == 134_515_008 and data["model"]["dtype"] == "float32"
    names = [w["name"] for w in data["what_if"]]
    assert names[:3] == ["turn-synchronous", "one session at a time", "20 client threads"]
    assert all(w["estimate"] and w["bound_s"] > 0 for w in data["what_if"])
    assert json.loads((out / "profile.json").read_text())["calls"] == data["calls"]
    for name in ("fig_profile_throughput", "fig_profile_cache_hits", "fig_profile_efficiency"):
        assert (out / f"{name}.png").stat().st_size > 1000


def test_profile_text_names_the_bounding_resource(tiny_run, capsys):
    capsys.readouterr()
    assert main(["profile", str(tiny_run), "--what-if", "tp=2"]) == 0  # cpu by default: the run was on the CPU
    text = capsys.readouterr().out
    lines = text.splitlines()
    call_rows = [line for line in lines if line.split()[:1] in (["1"], ["2"], ["3"], ["4"], ["5"])]
    assert len(call_rows) == 5
    assert any(line.lstrip().startswith("run") and ("memory (" in line or "compute (" in line) for line in lines)
    assert "one session at a time" in text and "turn-synchronous, tp=2,pp=1,dp=1" in text


def test_a_spec_the_run_beats_is_flagged(tiny_run, tmp_path, capsys):
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps({"peak_flops": 1e6, "memory_bandwidth": 1e6}))
    data = _profile_json(capsys, str(tiny_run), "--device-spec", str(slow))
    assert all(row["efficiency"] > 1 for row in data["calls"])
    assert len(data["warnings"]) == 5 and "understates" in data["warnings"][0]


def test_estimate_counts_the_same_prompt_tokens_as_the_engine(tiny_run, capsys):
    recorded = _profile_json(capsys, str(tiny_run))
    estimated = _profile_json(capsys, str(tiny_run), "--estimate", "--tokenizer", "smollm2", "--prefix-cache", "none")
    assert [c["prompt_tokens"] for c in estimated["calls"]] == [c["prompt_tokens"] for c in recorded["calls"]]
    assert all(c["measured_s"] is None and c["efficiency"] is None for c in estimated["calls"])
    cached = _profile_json(capsys, str(tiny_run), "--estimate", "--tokenizer", "smollm2", "--cache-block", "1")
    # Turn t >= 2 shares the previous prompt and reply with it: most of the prompt is cached.
    rates = [c["cache_hit_rate"] for c in cached["calls"]]
    assert rates[0] == 0 and all(r > 0.5 for r in rates[1:])


def test_user_errors_are_one_line(tiny_run, tmp_path, capsys):
    gpu_run = tmp_path / "gpu-run"
    shutil.copytree(tiny_run, gpu_run)
    manifest = json.loads((gpu_run / "manifest.json").read_text())
    manifest["stages"]["generate"]["engine_describe"]["device"] = "cuda:0"
    (gpu_run / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main(["profile", str(gpu_run)]) == 2
    assert "name it with --device-spec" in capsys.readouterr().err
    (gpu_run / "stats.json").unlink()
    assert main(["profile", str(gpu_run), "--device-spec", "h100"]) == 2
    err = capsys.readouterr().err
    assert "stats.json: missing" in err and "--estimate" in err and len(err.strip().splitlines()) == 1
    assert main(["profile", str(gpu_run), "--estimate", "--device-spec", "h100"]) == 2
    assert "--tokenizer" in capsys.readouterr().err
    assert main(["profile", str(tiny_run), "--model-config", str(tmp_path / "none.json")]) == 2
    assert "--model-config" in capsys.readouterr().err


def test_quantized_checkpoints_need_the_weight_width(tiny_run, tmp_path, capsys, smollm2_path):
    config = json.loads((Path(smollm2_path) / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    capsys.readouterr()
    assert main(["profile", str(tiny_run), "--model-config", str(path)]) == 2
    assert "quantized checkpoint (awq, 4 bits); pass --dtype" in capsys.readouterr().err
    full = _profile_json(capsys, str(tiny_run))
    packed = _profile_json(capsys, str(tiny_run), "--model-config", str(path), "--dtype", "int4")
    assert packed["model"]["weight_bytes_per_param"] == 0.5 and packed["model"]["kv_dtype"] == "float32"
    # Decode reads weights; an 8x narrower weight makes every decode phase cheaper.
    for a, b in zip(packed["calls"], full["calls"], strict=False):
        assert a["decode"]["bytes"] < b["decode"]["bytes"]


def test_report_has_a_profile_section(tiny_run, tmp_path, capsys):
    judged = tmp_path / "judged"
    shutil.copytree(tiny_run, judged)
    run = RunDir(judged)
    sessions = {s.system_id: s for s in load_run_sessions(run)}
    run.judgments.append(
        JudgmentRecord(
            system_id=sid,
            turn=turn,
            verdicts={
                str(c.id): Verdict(raw="是", value="yes", type=c.type) for c in sessions[sid].turn(turn).constraints
            },
        )
        for sid, turn in sorted(run.generations.read())
    )
    out = tmp_path / "report"
    assert main(["report", str(judged), "--out", str(out), "--no-figures", "--resamples", "20"]) == 0
    markdown = (out / "report.md").read_text()
    assert "## Throughput profile" in markdown
    assert "| Call | Turn | Measured s | Bound s | η | Bound by |" in markdown
    profile = json.loads((out / "report.json").read_text())["profile"]
    assert len(profile) == 1 and 0 < profile[0]["run"]["efficiency"] <= 1
