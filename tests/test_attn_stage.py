"""The `attention` stage end to end on a small SmolLM2 run: shares, table, analysis, figures, resume, ranks."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from sysbench_gpu.attention.analysis.figures import moving_average, normalized_axis  # noqa: E402
from sysbench_gpu.attention.analysis.turn_stats import compare_conditions, correlate_with_verdicts  # noqa: E402
from sysbench_gpu.attention.files.store import append_lines, complete_lines  # noqa: E402
from sysbench_gpu.attention.files.turn_table import TurnShare, read_turn_table, turn_shares  # noqa: E402
from sysbench_gpu.benchmarks.explorer import TurnView  # noqa: E402
from sysbench_gpu.benchmarks.registry import save_run_sessions
from sysbench_gpu.cli import main  # noqa: E402
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord, Verdict  # noqa: E402
from sysbench_gpu.core.rundir import RunDir  # noqa: E402

N_SESSIONS = 3


def _short(session):
    """Shortened texts keep the CPU forward small; the structure (5 turns, checklists) is the real one."""
    turns = tuple(dataclasses.replace(t, user=t.user[:40]) for t in session.turns)
    return dataclasses.replace(session, system_prompt=session.system_prompt[:90], turns=turns)


@pytest.fixture()
def run_dir(tmp_path, dataset):
    sessions = [_short(s) for s in dataset.select(limit=N_SESSIONS)]
    run = RunDir(tmp_path / "run")
    run.update_manifest(stage="generate", model="smollm2")
    save_run_sessions(run, sessions, dataset)
    generations, judgments = [], []
    for session in sessions:
        for turn in session.turns:
            # Session 2 stops after turn 3 (turn 4 skipped for length by the generator).
            skipped = session.system_id == sessions[1].system_id and turn.index == 4
            generations.append(
                GenerationRecord(
                    system_id=session.system_id,
                    turn=turn.index,
                    user=turn.user,
                    response=None if skipped else f"好的。第{turn.index}轮：{turn.user[:8]}",
                    status="skipped" if skipped else "ok",
                    model="smollm2",
                )
            )
            verdicts = {
                str(c.id): Verdict(
                    raw="是", value="yes" if (c.id + turn.index + session.system_id) % 3 else "no", type=c.type
                )
                for c in turn.constraints
            }
            judgments.append(JudgmentRecord(system_id=session.system_id, turn=turn.index, verdicts=verdicts))
    run.generations.append(generations)
    run.judgments.append(judgments)
    return run, sessions


def _run(run, out, *extra):
    return main(
        [
            "attention",
            str(run.path),
            "--model",
            "smollm2",
            "--out",
            str(out),
            "--layers",
            "1,3",
            "--chunk-tokens",
            "48",
            "--bootstrap",
            "50",
            *extra,
        ]
    )


def test_attention_end_to_end_resumes(run_dir, tmp_path, capsys):
    run, sessions = run_dir
    out = tmp_path / "attn"
    assert _run(run, out, "--control") == 0
    printed = capsys.readouterr().out
    assert "share vs turn pass: r =" in printed

    files = sorted((out / "sessions").glob("*.npz"))
    assert len(files) == 2 * N_SESSIONS
    stored = np.load(out / "sessions" / f"{sessions[0].system_id:04d}.system.npz")
    meta = json.loads(str(stored["meta"]))
    assert meta["turns_measured"] == [1, 2, 3, 4, 5] and list(stored["layers"]) == [1, 3]
    shares = stored["shares"]
    assert shares.shape == (2, len(stored["token_ids"]), 2)
    assert np.all(shares >= 0) and np.all(shares.sum(-1) <= 1 + 1e-5)
    # Every query after the system text sees it; the token right after it gives it a positive share.
    assert np.all(shares[:, stored["system"][1] :, 1] > 0)
    short = json.loads(str(np.load(out / "sessions" / f"{sessions[1].system_id:04d}.control.npz")["meta"]))
    assert short["turns_measured"] == [1, 2, 3] and "turn 4" in short["stopped"]

    rows = read_turn_table(out / "turn_shares.jsonl")
    assert len(rows) == 2 * 2 * (5 + 3 + 5)  # conditions x layers x measured turns
    assert {r.layer_label for r in rows} == {"layer1", "layer3"}
    analysis = json.loads((out / "analysis.json").read_text())
    assert analysis["verdicts"]["status"] == "ok"
    assert analysis["verdicts"]["layers"]["layer1"]["turn_pass"]["n"] == 13
    assert set(analysis["system_vs_user"]["layers"]) == {"layer1", "layer3"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["layers"] == [1, 3] and manifest["replies"] == "generations"
    figures = {p.name for p in (out / "figures").iterdir()}
    assert {
        "turn_means_layer1.png",
        "turn_means_layer1.pdf",
        f"token_shares_{sessions[0].system_id}_layer3.png",
    } <= figures

    before = {p: p.stat().st_mtime_ns for p in files}
    assert _run(run, out, "--control") == 0
    assert {p: p.stat().st_mtime_ns for p in sorted((out / "sessions").glob("*.npz"))} == before
    assert len(read_turn_table(out / "turn_shares.jsonl")) == len(rows)
    # A different model into the same directory is refused.
    assert (
        main(["attention", str(run.path), "--model", "smollm2", "--out", str(out), "--layers", "2", "--no-figures"])
        == 2
    )


def test_ranks_split_sessions_and_rank0_merges(run_dir, tmp_path, monkeypatch):
    run, sessions = run_dir
    out = tmp_path / "attn"
    common = [
        "--replies",
        "reference",
        "--no-figures",
        "--per-head",
        "--store-dtype",
        "float16",
        "--sessions",
        ",".join(str(s.system_id) for s in sessions[:2]),
    ]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert _run(run, out, *common) == 0
    assert not (out / "turn_shares.jsonl").exists()
    assert [p.name for p in (out / "sessions").glob("*.npz")] == [f"{sessions[1].system_id:04d}.system.npz"]
    stored = np.load(out / "sessions" / f"{sessions[1].system_id:04d}.system.npz")
    assert stored["per_head"].shape == (2, 9, len(stored["token_ids"]), 2) and stored["shares"].dtype == np.float16
    assert np.allclose(stored["per_head"].astype(np.float32).mean(axis=1), stored["shares"], atol=2e-3)
    monkeypatch.setenv("RANK", "0")
    assert _run(run, out, *common, "--wait-timeout", "5") == 0
    rows = read_turn_table(out / "turn_shares.jsonl")
    # Reference replies exist for turns 1-2 only in the shared data.
    assert {(r.system_id, r.turn) for r in rows} == {(s.system_id, t) for s in sessions[:2] for t in (1, 2)}
    analysis = json.loads((out / "analysis.json").read_text())
    assert analysis["n_sessions"] == 2
    written = main(
        ["attention-plot", str(out), str(out), "--names", "a,b", "--out", str(tmp_path / "fig"), "--layer", "layer3"]
    )
    assert written == 0 and (tmp_path / "fig" / "turn_means_layer3.pdf").exists()


def test_torn_shard_tail_is_cut_and_its_rows_recovered(run_dir, tmp_path, monkeypatch):
    """Issue 9 item 7: a crash mid-append tears the shard's last line; the rerun neither fails nor loses rows."""
    from sysbench_gpu.attention.capture import hooks as attn_hooks

    class CaptureWithPaths(attn_hooks.AttentionShareCapture):
        paths = {3: "fallback", 1: "kernel-lse"}  # what the capture reports it ran, where it reports it

    monkeypatch.setattr(attn_hooks, "AttentionShareCapture", CaptureWithPaths)
    run, sessions = run_dir
    out = tmp_path / "attn"
    assert _run(run, out, "--limit", "2", "--no-figures") == 0
    assert json.loads((out / "manifest.json").read_text())["capture_paths"] == {"1": "kernel-lse", "3": "fallback"}
    shard = out / "shards" / "rank0-of-1.jsonl"
    data = shard.read_bytes()
    shard.write_bytes(data[:-30])  # the last row of session 2 is cut mid-line; its .npz was written first
    assert len(read_turn_table(shard)) == len(data.splitlines()) - 1  # readers skip the torn line
    (out / "turn_shares.jsonl").unlink()
    assert _run(run, out, "--limit", "3", "--no-figures") == 0  # measures session 3, appending after the cut
    text = shard.read_text(encoding="utf-8")
    assert text.endswith("\n") and all(json.loads(line) for line in text.splitlines())
    rows = read_turn_table(out / "turn_shares.jsonl")
    expected = []
    for session in sessions:
        expected += turn_shares(np.load(out / "sessions" / f"{session.system_id:04d}.system.npz"))
    assert sorted(r.key for r in rows) == sorted(r.key for r in expected) and len(rows) == 2 * (5 + 3 + 5)
    assert {r.key: r for r in rows} == {r.key: r for r in expected}


def test_second_attention_process_on_one_out_is_refused_before_loading(run_dir, tmp_path, capsys, monkeypatch):
    """One writer per output directory: while another process holds the stage lock, nothing is loaded or written."""
    from sysbench_gpu.attention.capture import layout as attn_layout
    from sysbench_gpu.core.locks import stage_lock

    def never_load(*args, **kwargs):
        raise AssertionError("the model must not load while another process holds the lock")

    monkeypatch.setattr(attn_layout, "load_model", never_load)
    run, _ = run_dir
    out = tmp_path / "attn"
    with stage_lock(out, "attention"):
        assert _run(run, out, "--limit", "1", "--no-figures") == 2
    assert "another `attention` (pid" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == []  # the holder's lock file is gone after release; nothing else
    # Under torchrun (data parallel) each rank locks its own name, so ranks of one launch never collide.
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with stage_lock(out, "attention.rank1-of-2"):
        assert _run(run, out, "--limit", "2", "--no-figures") == 2
    assert "another `attention.rank1-of-2`" in capsys.readouterr().err


def test_shard_lines_torn_tail_helpers(tmp_path):
    path = tmp_path / "shard.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": 2}\n{"c"')
    assert complete_lines(path) == [(1, '{"a": 1}'), (2, '{"b": 2}')]
    append_lines(path, ['{"d": 4}', '{"e": 5}'])
    assert path.read_bytes() == b'{"a": 1}\n{"b": 2}\n{"d": 4}\n{"e": 5}\n'
    path.write_bytes(b'{"only": "torn"')
    append_lines(path, ["x"])
    assert path.read_bytes() == b"x\n" and complete_lines(tmp_path / "missing.jsonl") == []


def test_correlation_takes_each_turns_outcome_from_the_benchmark():
    """turn_pass is the benchmark's pass or fail (turn_view), not the record's: turns it does not count as judged
    are out of both parts, and a benchmark that only scores its turns gives no pass/fail correlation."""
    rows, judgments, views = [], {}, {}
    rng = np.random.default_rng(1)
    for sid in range(1, 13):
        for turn in range(1, 4):
            share = float(rng.uniform(0, 1))
            rows.append(TurnShare(sid, "system", 5, "mid", turn, 10, 5, share, share, share, share))
            judgments[(sid, turn)] = JudgmentRecord(sid, turn, {"1": Verdict("是", "yes", "format")})
            # The record passes every turn; the benchmark's view, which the correlation must follow, does not.
            views[(sid, turn)] = TurnView(judged=turn != 3, passed=share > 0.5 if turn != 3 else None)
    result = correlate_with_verdicts(rows, views, judgments, n_boot=50)
    stats = result["layers"]["mid"]["turn_pass"]
    judged = [(r.system_id, r.turn) for r in rows if r.turn != 3]
    assert stats["n"] == len(judged) == 24 and result["layers"]["mid"]["by_type"]["format"]["n"] == 24
    assert stats["pass_rate"] == np.mean([views[key].passed for key in judged]) < 1
    scored = {key: TurnView(judged=True, score=7.0, scale=10.0) for key in views}
    assert correlate_with_verdicts(rows, scored, judgments, n_boot=50) == {
        "status": "skipped",
        "reason": "the benchmark scores the measured turns without a pass or fail",
    }
    unjudged = {key: TurnView(judged=False) for key in views}
    assert correlate_with_verdicts(rows, unjudged, judgments)["reason"] == "no judged turn matches a measured turn"


def test_correlation_and_helpers():
    rows, judgments, views = [], {}, {}
    rng = np.random.default_rng(0)
    for sid in range(1, 21):
        for turn in range(1, 6):
            share = float(rng.uniform(0, 1))
            passed = share > 0.5
            for condition, value in (("system", share), ("control", share - 0.1)):
                rows.append(TurnShare(sid, condition, 5, "mid", turn, 10, 5, value, value, value, value))
            judgments[(sid, turn)] = JudgmentRecord(
                sid,
                turn,
                {"1": Verdict("是", "yes" if passed else "no", "format"), "2": Verdict("不适用", "other", "style")},
            )
            views[(sid, turn)] = TurnView(judged=True, passed=passed)
    result = correlate_with_verdicts(rows, views, judgments, n_boot=100)
    stats = result["layers"]["mid"]["turn_pass"]
    assert stats["n"] == 100 and stats["r_point_biserial"] > 0.7
    assert stats["ci95"][0] > 0.5 and stats["mean_share_pass"] > stats["mean_share_fail"]
    assert set(result["layers"]["mid"]["by_type"]) == {"format"}
    assert correlate_with_verdicts(rows, views, {})["status"] == "skipped"
    diff = compare_conditions(rows, n_boot=50)["layers"]["mid"]["1"]
    assert diff["n_paired"] == 20 and abs(diff["diff_mean"] - 0.1) < 1e-9 and diff["diff_ci95"][0] > 0.09
    assert np.allclose(moving_average(np.array([0.0, 3.0, 0.0, 3.0]), 3), [1.5, 1.0, 2.0, 1.5])
    index, x = normalized_axis(np.array([[2, 4], [4, 8]]))
    assert list(index) == [2, 3, 4, 5, 6, 7] and np.allclose(x, [0, 0.5, 1, 1.25, 1.5, 1.75])
