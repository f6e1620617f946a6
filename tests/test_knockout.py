"""Knockout on SmolLM2 (CPU): the hooked SDPA path against an eager reference with explicit 4-D masks, and the stage."""

from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # loads SmolLM2

from sysbench_gpu.attention.analysis.knockout_report import finish_knockout, knockout_markdown, plot_knockout  # noqa: E402
from sysbench_gpu.attention.capture.knockout import knockout_layout, reply_logps  # noqa: E402
from sysbench_gpu.attention.capture.segments import TurnText, layout_conversation  # noqa: E402
from sysbench_gpu.attention.files.knockout_rows import KNOCKOUT_FILE, KnockoutRow, read_knockout  # noqa: E402
from sysbench_gpu.benchmarks.registry import demo_data_path, load_dataset, save_run_sessions  # noqa: E402
from sysbench_gpu.cli import main  # noqa: E402
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord, Verdict  # noqa: E402
from sysbench_gpu.core.rundir import RunDir  # noqa: E402
from sysbench_gpu.explore.attention import knockout_by_turn  # noqa: E402
from sysbench_gpu.modeling.key_bias import key_bias  # noqa: E402
from sysbench_gpu.modeling.layer_bands import mid_band, parse_layer_band  # noqa: E402
from sysbench_gpu.modeling.registry import attention_modules  # noqa: E402

TURNS = (
    TurnText(1, "Name a colour.", "Blue, always in capitals: BLUE."),
    TurnText(2, "And a fruit?", "APPLE, in capitals as asked."),
)
SYSTEM = "Answer in capital letters only and never mention animals."


@pytest.fixture(scope="module")
def models(smollm2_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two spinning threads on a shared 2-core box are several times slower
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    sdpa = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32, attn_implementation="sdpa").eval()
    eager = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32, attn_implementation="eager").eval()
    yield tokenizer, sdpa, eager
    torch.set_num_threads(threads)


def _eager_reference(eager, ids, layout, layers):
    """Mean reply log p with the system keys hidden at ``layers``: eager attention, an explicit 4-D float mask."""
    t = ids.shape[1]
    causal = torch.full((t, t), float("-inf")).triu(1)
    knocked = causal.clone()
    start, end = layout.system
    knocked[end:, start:end] = float("-inf")
    masks = {layer: knocked[None, None] for layer in layers}
    handles = []
    for layer, module in attention_modules(eager).items():
        mask = masks.get(layer, causal[None, None])

        def swap(_module, args, kwargs, mask=mask):
            return args, {**kwargs, "attention_mask": mask}

        handles.append(module.register_forward_pre_hook(swap, with_kwargs=True))
    try:
        return reply_logps(eager, ids, layout.replies)
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize("arm", ["system", "control"])
def test_knockout_delta_matches_eager_reference(models, arm):
    tokenizer, sdpa, eager = models
    layout = layout_conversation(tokenizer, SYSTEM, TURNS, arm)
    ids = torch.tensor([layout.token_ids])
    plain_ref = _eager_reference(eager, ids, layout, [])
    for spec in ("all", "mid-band"):
        layers = parse_layer_band(spec, 30)
        knocked_ref = _eager_reference(eager, ids, layout, layers)
        with key_bias(sdpa, layers, float("-inf")) as bias:
            rows = knockout_layout(sdpa, bias, layout, 7, arm, 0, ids.device)
        assert [r.turn for r in rows] == [1, 2] and {r.arm for r in rows} == {arm}
        for row, before, after in zip(rows, plain_ref, knocked_ref, strict=True):
            assert row.reply_span == layout.replies[row.turn - 1]
            assert row.logp_plain == pytest.approx(before, abs=1e-4), spec
            assert row.logp_knockout == pytest.approx(after, abs=1e-4), spec
            assert row.delta == pytest.approx(after - before, abs=1e-4), spec
            assert abs(row.delta) > 1e-3, spec  # the knockout changed something
    # The hook is gone: the model runs plain SDPA again.
    assert sdpa.config._attn_implementation == "sdpa"
    assert not any(hasattr(m, "_sysbench_key_bias") for m in attention_modules(sdpa).values())


def test_layer_bands():
    assert mid_band(30) == list(range(10, 20))
    assert parse_layer_band("3-5,7", 30) == [3, 4, 5, 7]
    with pytest.raises(Exception, match="--knockout-layers: '28-31' is out of range"):
        parse_layer_band("28-31", 30)


def test_attention_stage_writes_knockout(tmp_path, dataset):
    session = dataset.select(limit=1)[0]
    turns = tuple(dataclasses.replace(t, user=t.user[:30]) for t in session.turns[:2])
    session = dataclasses.replace(session, system_prompt=session.system_prompt[:80], turns=turns)
    run = RunDir(tmp_path / "run")
    run.update_manifest(stage="generate", model="smollm2")
    save_run_sessions(run, [session], dataset)
    run.generations.append(
        [
            GenerationRecord(
                system_id=session.system_id, turn=t.index, user=t.user, response=f"好的，第{t.index}轮。", status="ok"
            )
            for t in turns
        ]
    )
    run.judgments.append(
        [
            JudgmentRecord(
                system_id=session.system_id, turn=t.index, verdicts={"1": Verdict(raw="是", value="yes", type="x")}
            )
            for t in turns
        ]
    )
    out = tmp_path / "attn"
    args = ["attention", str(run.path), "--model", "smollm2", "--out", str(out), "--layers", "12"]
    args += ["--knockout", "system", "--knockout-layers", "10-12", "--no-figures", "--bootstrap", "20"]
    assert main(args) == 0
    rows = read_knockout(out)
    assert sorted((r.arm, r.turn) for r in rows) == [("control", 1), ("control", 2), ("system", 1), ("system", 2)]
    stored = json.loads((out / "knockout.jsonl").read_text().splitlines()[0])
    assert set(stored) == {"system_id", "turn", "arm", "reply_span", "logp_plain", "logp_knockout", "delta"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["knockout"]["layers"] == [10, 11, 12] and manifest["knockout"]["path"].startswith("sdpa-dense")
    summary = json.loads((out / "knockout_summary.json").read_text())
    assert summary["arms"]["system"]["n"] == 2
    lines = knockout_markdown([out])
    assert lines[0] == "## Attention: knockout" and any(line.startswith("| system | 2 | 1 |") for line in lines)
    assert {p.suffix for p in plot_knockout(summary, tmp_path / "fig" / "knockout_delta")} == {".png", ".pdf"}
    by_turn = knockout_by_turn(out, session.system_id)
    assert set(by_turn) == {"system", "control"} and set(by_turn["control"]) == {"1", "2"}
    # Rerun: nothing appended; other layers into the same folder are refused.
    assert main(args) == 0
    assert len(read_knockout(out)) == 4
    assert main(args[:8] + ["--knockout", "system", "--knockout-layers", "all", "--no-figures"]) == 2


def test_bench_knockout_rows(tmp_path, capsys):
    import sys
    from pathlib import Path

    bench_dir = Path(__file__).resolve().parent.parent / "kernels_bench"
    sys.path.insert(0, str(bench_dir))
    try:
        import bench_knockout
    finally:
        sys.path.remove(str(bench_dir))
    out = tmp_path / "rows.json"
    assert bench_knockout.main(["--lengths", "64", "--repeats", "1", "--layers", "all", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["T"] == 64 and row["layers"] == 2 and row["ratio"] > 0
    assert "ratio" in capsys.readouterr().out


def _knockout_folder(path, rows):
    """An attention folder holding only knockout rows (the model is not needed to summarize them)."""
    path.mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps({"knockout": {"layers": [1], "layers_spec": "1"}}))
    (path / KNOCKOUT_FILE).write_text("".join(row.to_json() + "\n" for row in rows))
    return path


def _row(system_id, turn, delta):
    return KnockoutRow(system_id, turn, "system", (0, 1), -1.0, -1.0 + delta, delta)


def test_knockout_splits_pass_and_fail_through_turn_view(tmp_path):
    """A SysBench turn whose judgment never parsed is not judged, whatever verdicts the record still holds."""
    dataset = load_dataset(demo_data_path())
    session = dataset.select(limit=1)[0]
    run = RunDir(tmp_path / "run")
    run.update_manifest(stage="generate", model="smollm2")
    save_run_sessions(run, [session], dataset)
    sid = session.system_id

    def judged(turn, value, status="ok"):
        return JudgmentRecord(sid, turn, {"1": Verdict(raw=value, value=value, type="x")}, parse_status=status)

    # Turn 1 passes, turn 2 fails, turn 3's judge reply never parsed (a "no" left in the record: the raw
    # verdicts would count it as a fail), turn 4 has no judgment.
    run.judgments.append([judged(1, "yes"), judged(2, "no"), judged(3, "no", status="unparsed")])
    out = _knockout_folder(
        tmp_path / "attn", [_row(sid, 1, -0.1), _row(sid, 2, -0.3), _row(sid, 3, -0.9), _row(sid, 4, -0.5)]
    )
    summary = finish_knockout(out, run, resamples=20, figures=False)
    split = summary["verdicts"]["system"]
    assert (split["n_pass"], split["n_fail"], split["n_scored_only"], split["n_not_judged"]) == (1, 1, 0, 2)
    assert split["mean_delta_pass"] == pytest.approx(-0.1) and split["mean_delta_fail"] == pytest.approx(-0.3)
    assert json.loads((out / "knockout_summary.json").read_text())["verdicts"]["system"] == split


def test_knockout_on_a_scored_benchmark_counts_scored_turns_and_splits_none(tmp_path, mteval_data_dir):
    from mteval_runs import make_mteval_run

    run = make_mteval_run(tmp_path / "run", mteval_data_dir / "refinement_multi.jsonl", [1], lambda s, t: "A reply.")
    session = load_dataset(run.sessions_path).sessions[0]
    answered = [turn.index for turn in session.turns if turn.answered][:3]
    run.judgments.append([JudgmentRecord(session.system_id, t, {}, score=7.0, scorer="judge") for t in answered[:2]])
    rows = [_row(session.system_id, t, -0.2) for t in answered]
    out = _knockout_folder(tmp_path / "attn", rows)
    summary = finish_knockout(out, run, resamples=20, figures=False)
    split = summary["verdicts"]["system"]
    assert (split["n_pass"], split["n_fail"], split["n_scored_only"], split["n_not_judged"]) == (0, 0, 2, 1)
    assert any("scores these turns (2 rows) without a pass or fail" in line for line in knockout_markdown([out]))
