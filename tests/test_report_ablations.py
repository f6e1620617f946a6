"""report with SysBench history ablations: run kinds from manifests, the combined per-turn ISR figure and table,
and the ground-truth-history gain split by dependent and parallel sessions with its ±|ΔT1| band."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from test_report import _assert_figure, _pick_sessions, _row

from sysbench_gpu.benchmarks.registry import save_run_sessions
from sysbench_gpu.benchmarks.sysbench import report_runs
from sysbench_gpu.benchmarks.sysbench.report_ablations import (
    RunKind,
    ablation_groups,
    ablation_panels,
    gains_by_group,
    run_kind,
)
from sysbench_gpu.cli import main
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord, Verdict
from sysbench_gpu.core.rundir import RunDir

Fails = Callable[[object, int], bool]  # (session, turn) -> does the turn fail


def _make(path: Path, dataset, sessions, fails: Fails, model: str = "toy", **generate) -> Path:
    """A judged run whose turn fails when ``fails(session, turn)``; ``generate``: its stages.generate fields."""
    run = RunDir(path)
    run.update_manifest(label=path.name, model=model)
    save_run_sessions(run, sessions, dataset)
    if generate:
        run.update_manifest(stage="generate", status="complete", model=model, benchmark="sysbench", **generate)
    run.generations.append(
        GenerationRecord(system_id=s.system_id, turn=t.index, user=t.user, response="ok", model=model)
        for s in sessions
        for t in s.turns
    )
    records = []
    for session in sessions:
        for turn in session.turns:
            bad = fails(session, turn.index)
            verdicts = {
                str(c.id): Verdict(
                    raw="否" if bad and i == 0 else "是", value="no" if bad and i == 0 else "yes", type=c.type
                )
                for i, c in enumerate(turn.constraints)
            }
            records.append(JudgmentRecord(system_id=session.system_id, turn=turn.index, verdicts=verdicts))
    run.judgments.append(records)
    return path


@pytest.fixture(scope="module")
def ablation_runs(tmp_path_factory, dataset):
    """Five sessions (3 dependent, 2 parallel) of model toy under four kinds, and a plain run of another model.

    own history:     dependent sessions fail turns 3 and 4, parallel ones turn 4
    reference:       dependent sessions fail turn 4
    single-turn:     every session fails turn 2
    2 distractors:   every session fails turns 1 and 2
    """
    root = tmp_path_factory.mktemp("ablations")
    sessions = _pick_sessions(dataset)
    own = _make(
        root / "own",
        dataset,
        sessions,
        lambda s, t: t == 4 or (s.dependent and t == 3),
        history="model",
        distractor_turns=0,
        distractor_seed=None,
    )
    ref = _make(
        root / "reference",
        dataset,
        sessions,
        lambda s, t: s.dependent and t == 4,
        history="reference",
        distractor_turns=0,
        distractor_seed=None,
    )
    single = _make(
        root / "single",
        dataset,
        sessions,
        lambda s, t: t == 2,
        history="single-turn",
        distractor_turns=0,
        distractor_seed=None,
    )
    distract = _make(
        root / "distract",
        dataset,
        sessions,
        lambda s, t: t <= 2,
        history="model",
        distractor_turns=2,
        distractor_seed=0,
    )
    other = _make(root / "other", dataset, sessions, lambda s, t: False, model="other")
    return {"own": own, "ref": ref, "single": single, "distract": distract, "other": other}


def test_run_kind_from_generate_import_or_nothing():
    assert run_kind({}) == RunKind()
    assert run_kind({"stages": {"generate": {"history": "single-turn"}}}).name == "single-turn"
    assert run_kind({"stages": {"generate": {"history": "model", "distractor_turns": 3}}}).name == "3 distractor turns"
    assert run_kind({"stages": {"generate": {"history": "reference", "distractor_turns": 1}}}).name == (
        "1 distractor turn, ground-truth history"
    )
    imported = run_kind({"stages": {"import": {"history": "reference"}}})
    assert imported.imported and imported.name == "ground-truth history"
    assert run_kind({"stages": {"generate": {"benchmark": "sysbench"}}}).name == "own history"  # older fields missing


def test_one_figure_and_table_for_every_kind_of_one_model(ablation_runs, tmp_path, capsys):
    out = tmp_path / "report"
    order = ["distract", "own", "single", "ref", "other"]
    rc = main(
        ["report", *(str(ablation_runs[k]) for k in order), "--out", str(out), "--resamples", "20", "--formats", "png"]
    )
    assert rc == 0, capsys.readouterr().err
    _assert_figure(out / "fig_history_ablation_isr.png")
    table = (out / "table_history_ablation.md").read_text(encoding="utf-8")
    # Own history first, then ground truth, single-turn, distractors; the other model has one kind: not shown.
    labels = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    assert labels == ["toy: own history", "toy: ground-truth history", "toy: single-turn", "toy: 2 distractor turns"]
    # SSR: dependent sessions pass 2 leading turns of 5, parallel ones 3: (3 * 2 + 2 * 3) / 25 = 48%.
    assert _row(table, "toy: own history") == ["100.0", "100.0", "40.0", "0.0", "100.0", "68.0", "48.0"]
    assert _row(table, "toy: ground-truth history")[:5] == ["100.0", "100.0", "100.0", "40.0", "100.0"]
    assert _row(table, "toy: single-turn")[:5] == ["100.0", "0.0", "100.0", "100.0", "100.0"]
    assert _row(table, "toy: 2 distractor turns")[:5] == ["0.0", "0.0", "100.0", "100.0", "100.0"]
    assert (out / "table_history_ablation.tex").is_file()
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "fig_history_ablation_isr.png" in md and "History ablations: ISR per turn" in md
    meta = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert {r["label"]: r["history_kind"] for r in meta["runs"]}["single"] == "single-turn"
    assert meta["figures"]["fig_history_ablation_isr"] == ["fig_history_ablation_isr.png"]


def test_gt_pair_joins_the_panel_and_the_gain_is_split_by_group(ablation_runs, tmp_path, capsys):
    runs = [report_runs.load_run(ablation_runs[k], resamples=10) for k in ("own", "single")]
    gt = report_runs.load_run(ablation_runs["ref"], resamples=10)
    pair = report_runs.GtPair(label="toy", gt=gt, base=runs[0])
    groups, warnings = ablation_groups(runs, [pair])
    assert warnings == [] and [g.model for g in groups] == ["toy"]
    panels = ablation_panels(groups)
    assert [name for name, _, _ in panels[0][1]] == ["own history", "ground-truth history", "single-turn"]
    # Dependent sessions: the reference run passes turn 3 where own history fails it. Parallel: turn 4.
    assert gains_by_group(pair) == {
        "dependent": pytest.approx([0, 0, 100, 0, 0]),
        "parallel": pytest.approx([0, 0, 0, 100, 0]),
    }
    out = tmp_path / "report"
    rc = main(
        [
            "report",
            str(ablation_runs["own"]),
            "--out",
            str(out),
            "--gt-pair",
            f"{ablation_runs['ref']}={ablation_runs['own']}",
            "--resamples",
            "10",
            "--formats",
            "png",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    _assert_figure(out / "fig_gt_history_gain.png")
    meta = json.loads((out / "report.json").read_text(encoding="utf-8"))
    by_group = meta["gt_pairs"][0]["isr_gain_by_turn_by_group_points"]
    assert by_group["dependent"] == pytest.approx([0, 0, 100, 0, 0])
    # A plain report with a gt pair is unchanged: no ablation table or figure.
    assert not (out / "table_history_ablation.md").exists() and not (out / "fig_history_ablation_isr.png").exists()


def test_repeated_kind_is_a_warning(ablation_runs, tmp_path, capsys):
    import shutil

    again = tmp_path / "own-again"
    shutil.copytree(ablation_runs["own"], again)
    out = tmp_path / "report"
    rc = main(
        [
            "report",
            str(ablation_runs["single"]),
            str(ablation_runs["own"]),
            str(again),
            "--labels",
            "s,o1,o2",
            "--out",
            str(out),
            "--resamples",
            "10",
            "--no-figures",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "o2 and o1 are both own history runs; the figure shows o1" in captured.err
    table = (out / "table_history_ablation.md").read_text(encoding="utf-8")
    assert table.count("toy: own history") == 1 and "toy: single-turn" in table


def test_metrics_has_per_turn_isr_by_group(ablation_runs):
    from sysbench_gpu.benchmarks.runs import run_metrics

    result = run_metrics(ablation_runs["own"], resamples=10)
    assert result["isr_by_round_by_group"]["dependent"] == pytest.approx([1, 1, 0, 0, 1])
    assert result["isr_by_round_by_group"]["parallel"] == pytest.approx([1, 1, 1, 0, 1])
