"""`attention-analyze` end to end on the 5 demo sessions: heads map, failure probe and decay over two history modes.

One module-scoped fixture measures SmolLM2 (layers 0 and 1, per head, both arms) on two runs
of the demo sessions, one per ``--history`` mode, judged with made-up verdicts that pass some
turns and fail others.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("sklearn")
pytest.importorskip("scipy")

from sysbench_gpu.attention.analysis import heads, interp_report, probe  # noqa: E402
from sysbench_gpu.attention.analysis.head_table import HeadTable, load_head_table  # noqa: E402
from sysbench_gpu.benchmarks.registry import demo_data_path, load_dataset, save_run_sessions  # noqa: E402
from sysbench_gpu.cli import main  # noqa: E402
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord, Verdict  # noqa: E402
from sysbench_gpu.core.rundir import RunDir  # noqa: E402

HISTORIES = ("model", "single-turn")


def failing(system_id: int, turn: int) -> bool:
    """About a third of the turns fail, in every session."""
    return (system_id + turn) % 3 == 0


def _short(session):
    """Shortened texts keep the CPU forwards small; the structure (5 sessions of 5 turns, checklists) is the demo's."""
    turns = tuple(dataclasses.replace(t, user=t.user[:40]) for t in session.turns)
    return dataclasses.replace(session, system_prompt=session.system_prompt[:120], turns=turns)


def make_run(path, dataset, history):
    sessions = [_short(s) for s in dataset.select(limit=5)]
    run = RunDir(path)
    run.update_manifest(stage="generate", model="smollm2", history=history)
    save_run_sessions(run, sessions, dataset)
    generations, judgments = [], []
    for session in sessions:
        for turn in session.turns:
            reply = f"Sure. Turn {turn.index}: {turn.user[:20]}"
            generations.append(
                GenerationRecord(session.system_id, turn.index, turn.user, reply, status="ok", model="smollm2")
            )
            verdicts = {
                str(c.id): Verdict(
                    raw="yes",
                    value="no" if failing(session.system_id, turn.index) and c.id == 1 else "yes",
                    type=c.type,
                )
                for c in turn.constraints
            }
            judgments.append(JudgmentRecord(system_id=session.system_id, turn=turn.index, verdicts=verdicts))
    run.generations.append(generations)
    run.judgments.append(judgments)
    return run


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    dataset = load_dataset(demo_data_path())
    dirs = []
    for history in HISTORIES:
        run = make_run(root / f"run-{history}", dataset, history)
        out = root / f"attn-{history}"
        argv = ["attention", str(run.path), "--model", "smollm2", "--out", str(out), "--layers", "0,1"]
        argv += ["--control", "--per-head", "--chunk-tokens", "64", "--bootstrap", "20", "--no-figures"]
        assert main(argv) == 0
        dirs.append(out)
    return root, dirs


def test_heads_probe_and_decay_end_to_end(measured, capsys):
    root, dirs = measured
    capsys.readouterr()
    argv = ["attention-analyze", *map(str, dirs), "--top", "5", "--bootstrap", "200"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    print(printed)  # the CV AUC with its CI, for the record (pytest -s)
    assert "probe: CV AUC" in printed and "vs baseline (turn, reply length)" in printed

    model_dir = dirs[0]
    data = json.loads((model_dir / "heads.json").read_text())
    assert data["layers"] == [0, 1] and data["n_heads"] == 9
    assert np.asarray(data["r_point_biserial"], dtype=float).shape == (2, 9)
    assert data["n_turns"] == 25 and data["n_sessions"] == 5
    assert data["pass_rate"] == pytest.approx(1 - sum(failing(s, t) for s in range(1, 6) for t in range(1, 6)) / 25)
    q = np.asarray(data["q"], dtype=float)
    p = np.asarray(data["p"], dtype=float)
    assert np.all(q >= p - 1e-12)  # BH never lowers a p-value
    assert data["p_value"]["method"] == "session-permutation" and data["p_value"]["permutations"] == 10000
    assert data["p_value"]["seed"] == 0 and data["p_value"]["exchangeable_sessions"] == 5
    top = json.loads((model_dir / "top_heads.json").read_text())
    assert len(top["heads"]) <= 5 and all(layer in (0, 1) and 0 <= head < 9 for layer, head in top["heads"])
    assert "criterion" in top and top["p_value"] == data["p_value"] and top["alpha"] == heads.ALPHA
    for item in top["details"]:  # the session-aware q of heads.json, and the flag that follows from it
        position = data["layers"].index(item["layer"])
        assert item["q"] == pytest.approx(q[position, item["head"]])
        assert item["significant"] == (item["q"] < heads.ALPHA)
    steering = pytest.importorskip("sysbench_gpu.modeling.steering")  # part A's reader of `generate --steer-heads`
    assert [list(pair) for pair in steering.read_steer_heads(model_dir / "top_heads.json")] == top["heads"]
    result = json.loads((model_dir / "probe.json").read_text())
    assert result["status"] == "ok" and result["cv"]["folds"] == 5
    for arm in ("probe", "baseline"):
        auc, ci = result[arm]["auc"], result[arm]["ci95"]
        assert 0 <= auc <= 1 and ci is not None and ci[0] <= ci[1]
    decay = json.loads((model_dir / "decay.json").read_text())
    keys = {(s["history"], s["condition"], s["layer_label"]) for s in decay["series"]}
    assert keys == {(h, c, label) for h in HISTORIES for c in ("system", "control") for label in ("layer0", "layer1")}
    for item in decay["series"]:
        assert item["turn"]["slope"] is not None and item["turn"]["n_sessions"] == 5
        assert item["turn"]["slope_ci95"][0] <= item["turn"]["slope"] <= item["turn"]["slope_ci95"][1] + 1e-9
        assert item["distance"]["slope"] is not None
    figures = {p.name for p in (model_dir / "figures").iterdir()}
    assert {"heads_map.png", "probe_roc.png", "decay_layer0.png", "decay_layer1.png"} <= figures
    # The second directory gets its own heads and probe; decay goes to the first only.
    assert (dirs[1] / "heads.json").exists() and not (dirs[1] / "decay.json").exists()

    report = root / "report"
    assert main(["report", str(root / "run-model"), "--out", str(report), "--attention", str(model_dir)]) == 0
    text = (report / "report.md").read_text()
    for title in ("## Attention: heads, failure probe, decay", "### Heads", "### Failure probe", "### Decay"):
        assert title in text
    assert "](../attn-model/figures/heads_map.png)" in text

    site = root / "site"
    assert main(["explore", str(root / "run-model"), "--out", str(site), "--attention", str(model_dir)]) == 0
    index = (site / "data" / "index.js").read_text()
    assert '"interp"' in index and '"top_heads"' in index and (site / "data" / "interp" / "0_heads_map.png").exists()


def test_head_table_joins_verdicts_through_the_protocol(measured):
    _, dirs = measured
    table = load_head_table(dirs[0])
    assert table.shares.shape == (25, 2, 9)
    expected = [0.0 if failing(int(s), int(t)) else 1.0 for s, t in zip(table.session_ids, table.turns, strict=True)]
    assert table.passed.tolist() == expected
    # The head mean of the per-head table is the stored head-mean share's reply mean, to float32 precision.
    assert np.all(table.shares >= 0)


def test_columnwise_r_and_fdr_match_references():
    from scipy import stats

    rng = np.random.default_rng(1)
    x = rng.normal(size=(40, 6))
    y = (rng.random(40) > 0.5).astype(float)
    x[:, 0] += 2 * y  # one head that carries the outcome
    r = heads.columnwise_r(x, y)
    for k in range(6):
        assert r[k] == pytest.approx(stats.pearsonr(x[:, k], y).statistic)
    # The permutation statistic gives the same r for the observed outcome vector.
    assert heads.r_of_outcomes(x, y)(y[None, :])[0] == pytest.approx(r)
    p = np.array([0.01, 0.04, 0.03, 0.2])
    # Benjamini-Hochberg by hand: sorted p * m / rank, made monotone from the top.
    assert heads.bh_q_values(p).tolist() == pytest.approx([0.04, 0.16 / 3, 0.16 / 3, 0.2])
    assert np.isnan(heads.columnwise_r(np.ones((5, 1)), np.array([0, 1, 0, 1, 1.0])))[0]


def test_probe_says_so_when_the_data_hold_one_class(measured, monkeypatch):
    _, dirs = measured
    table = load_head_table(dirs[0])
    table.passed[:] = 1.0
    result = probe.run_probe(table, n_boot=10)
    assert result.status == "one-class" and result.probe is None
    assert probe.summary_line(result) == "probe: every judged turn passes: the data hold one class, so there is no AUC"
    monkeypatch.setattr(probe, "sklearn_available", lambda: False)
    assert interp_report.analyze_heads(dirs[0], None, _args())[-1] == f"probe: {probe.INSTALL_HINT}"


def _args():
    import argparse

    return argparse.Namespace(bootstrap=20, permutations=200, seed=0, top=3, folds=5, no_figures=True)


# ----------------------------------------------------------------- session-aware p-values on synthetic tables


def _table(session_ids, turns, shares, passed) -> HeadTable:
    shares = np.asarray(shares, dtype=np.float64)
    return HeadTable(
        session_ids=np.asarray(session_ids),
        turns=np.asarray(turns),
        reply_tokens=np.full(len(passed), 20),
        shares=shares.reshape(len(passed), 1, -1),
        passed=np.asarray(passed, dtype=np.float64),
        layers=[7],
        layer_labels=["mid"],
    )


def _turn_level_q(table: HeadTable) -> np.ndarray:
    """The p-value the map used to give (Pearson's t test with every turn independent), then BH."""
    from scipy import stats

    x = table.shares.reshape(table.shares.shape[0], -1)
    p = np.asarray([stats.pearsonr(x[:, k], table.passed).pvalue for k in range(x.shape[1])])
    return stats.false_discovery_control(p, method="bh")


@pytest.mark.parametrize("n_sessions", [4, 5, 6])
def test_session_constant_shares_and_outcomes_give_no_significant_head(n_sessions):
    """Shares and pass/fail constant within each session, unrelated across sessions: only n_sessions data points."""
    turns, n_heads = 5, 40
    rng = np.random.default_rng(n_sessions)
    session_shares = rng.random((n_sessions, n_heads))  # drawn apart from the outcomes
    session_passed = np.zeros(n_sessions)
    session_passed[rng.permutation(n_sessions)[: n_sessions // 2]] = 1.0
    table = _table(
        np.repeat(np.arange(1, n_sessions + 1), turns),
        np.tile(np.arange(1, turns + 1), n_sessions),
        np.repeat(session_shares, turns, axis=0),
        np.repeat(session_passed, turns),
    )
    # Turns taken as independent, many heads pass BH: 25 turns count as 25 data points.
    assert (_turn_level_q(table) < heads.ALPHA).sum() >= 5
    result = heads.head_map(table, n_boot=100, seed=0, permutations=2000)
    assert result.n_tests == n_heads and result.permutations == 2000 and result.exchangeable_sessions == n_sessions
    assert not result.significant.any()
    # With labels constant in each session only C(n, n // 2) labellings exist (6, 10, 20), the observed one
    # among them, and for an even n its mirror image (r -> -r): p is about 0.1 at the least.
    assert np.nanmin(result.p) >= 0.08
    top = heads.top_heads(result, 8)
    assert top["n_listed_significant"] == 0 and not any(item["significant"] for item in top["details"])
    assert all(item["q"] >= heads.ALPHA for item in top["details"])


def test_an_outcome_that_only_follows_the_turn_is_in_the_permutation_null():
    """Every session: shares fall over turns and later turns fail more, with no link between them otherwise."""
    rng = np.random.default_rng(0)
    n_sessions, turns = 12, 5
    turn = np.tile(np.arange(1, turns + 1), n_sessions)
    passed = (rng.random(turn.size) > turn / 6.0).astype(float)
    shares = 0.5 - 0.05 * turn + rng.normal(0, 0.01, turn.size)
    table = _table(np.repeat(np.arange(n_sessions), turns), turn, shares[:, None], passed)
    assert _turn_level_q(table)[0] < 1e-3  # the turn-independent test calls it a strong effect
    result = heads.head_map(table, n_boot=100, seed=0, permutations=2000)
    assert result.r[0, 0] > 0.4 and result.p[0, 0] > 0.2 and not result.significant.any()


def test_a_head_that_carries_the_outcome_within_sessions_is_found():
    rng = np.random.default_rng(1)
    n_sessions, turns = 30, 5
    passed = (rng.random(n_sessions * turns) > 0.4).astype(float)
    shares = rng.normal(0.3, 0.05, size=(passed.size, 6))
    shares[:, 2] += 0.1 * passed
    table = _table(
        np.repeat(np.arange(n_sessions), turns), np.tile(np.arange(1, turns + 1), n_sessions), shares, passed
    )
    result = heads.head_map(table, n_boot=100, seed=0, permutations=2000)
    assert result.significant[0].tolist() == [False, False, True, False, False, False]
    assert result.p[0, 2] == pytest.approx(1 / 2001)  # no permutation reached the observed r


def test_permutations_are_seeded_and_move_labels_only_between_sessions_judged_on_the_same_turns():
    from sysbench_gpu.core.stats import session_permutation_p

    rng = np.random.default_rng(2)
    # Sessions 1-4 judged on turns 1-3; session 5 on turns 1, 2 and 4 (turn 3 unparsed, say): it keeps its labels.
    session_ids = np.repeat(np.arange(1, 6), 3)
    turns = np.concatenate([np.tile([1, 2, 3], 4), [1, 2, 4]])
    y = rng.integers(0, 2, 15).astype(float)
    y[:2] = [0.0, 1.0]
    seen = []

    def statistic(outcomes):
        seen.append(outcomes.copy())
        return outcomes[:, :1]

    test = session_permutation_p(session_ids, turns, y, statistic, permutations=300, seed=5)
    assert test.permutations == 300 and test.seed == 5 and test.exchangeable_sessions == 4 and test.strata == 1
    permuted = np.concatenate(seen[1:])
    assert permuted.shape == (300, 15)
    assert np.all(permuted[:, 12:] == y[12:])  # session 5 never moves
    sessions = {tuple(y[3 * i : 3 * i + 3]) for i in range(4)}
    for row in permuted:  # each of sessions 1-4 gets one whole vector of sessions 1-4, turn for turn
        assert sorted(tuple(row[3 * i : 3 * i + 3]) for i in range(4)) == sorted(
            tuple(y[3 * i : 3 * i + 3]) for i in range(4)
        )
        assert {tuple(row[3 * i : 3 * i + 3]) for i in range(4)} <= sessions
    again = session_permutation_p(session_ids, turns, y, lambda o: o[:, :1], permutations=300, seed=5)
    assert np.array_equal(test.p, again.p)
