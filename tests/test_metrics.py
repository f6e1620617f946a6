"""Metrics on hand-built sessions with answers worked out by hand, run comparison, CLI errors."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from sysbench_gpu import cli
from sysbench_gpu.benchmarks.registry import save_run_sessions
from sysbench_gpu.benchmarks.runs import compare_runs, run_metrics
from sysbench_gpu.benchmarks.sysbench.data import CONSTRAINT_TYPES
from sysbench_gpu.benchmarks.sysbench.metrics import compute_metrics
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord, Verdict
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.core.sessions import Constraint, Session, Turn
from sysbench_gpu.core.verdicts import normalize_verdict

RAW_TYPE = {english: chinese for chinese, english in CONSTRAINT_TYPES.items()}

# (dependent, [(alignment, [(type, raw verdict), ...]) per turn])
TINY = {
    1: (
        True,
        [
            ("aligned", [("content", "是"), ("format", "是")]),
            ("misaligned", [("action", "否")]),
            ("aligned", [("content", "是"), ("style", "不适用"), ("role", "是")]),
        ],
    ),
    2: (
        False,
        [
            ("aligned", [("content", "是")]),
            ("aligned", [("format", "是"), ("format", "是")]),
            ("misaligned", [("action", "否"), ("content", "是")]),
        ],
    ),
    3: (
        True,
        [("misaligned", [("action", "否")]), ("aligned", [("content", "否")]), ("misaligned", [("style", "是")])],
    ),
}


def make_sessions(spec=TINY) -> list[Session]:
    sessions = []
    for system_id, (dependent, turns) in spec.items():
        built = []
        for index, (alignment, items) in enumerate(turns, start=1):
            constraints = tuple(
                Constraint(id=n, content=f"rule {n} of {system_id}/{index}", type=kind, type_raw=RAW_TYPE[kind])
                for n, (kind, _) in enumerate(items, start=1)
            )
            built.append(
                Turn(
                    index=index,
                    user=f"user {system_id}/{index}",
                    reference=None,
                    alignment=alignment,
                    constraints=constraints,
                )
            )
        sessions.append(
            Session(
                system_id=system_id,
                system_prompt=f"system {system_id}",
                turns=tuple(built),
                dependent=dependent,
                domain="test",
                scene=None,
                benchmark="sysbench",
            )
        )
    return sessions


def make_judgments(spec=TINY) -> dict[tuple[int, int], JudgmentRecord]:
    judgments = {}
    for system_id, (_, turns) in spec.items():
        for index, (_, items) in enumerate(turns, start=1):
            verdicts = {
                str(n): Verdict(raw=raw, value=normalize_verdict(raw), type=kind)
                for n, (kind, raw) in enumerate(items, start=1)
            }
            judgments[(system_id, index)] = JudgmentRecord(system_id=system_id, turn=index, verdicts=verdicts)
    return judgments


def f(numerator: int, denominator: int) -> float:
    return float(Fraction(numerator, denominator))


def test_every_key_on_hand_built_sessions():
    m = compute_metrics(make_sessions(), make_judgments(), resamples=50)
    assert (m["n_sessions"], m["n_turns"], m["n_constraints"]) == (3, 9, 14)
    assert m["csr"] == pytest.approx(f(9, 14))
    # Eq. 1: mean of per-turn ratios 1, 0, 2/3, 1, 1, 1/2, 0, 0, 1 -- differs from pooled CSR.
    assert m["csr_macro"] == pytest.approx(f(31, 54))
    assert m["csr"] != pytest.approx(m["csr_macro"])
    assert m["isr"] == pytest.approx(f(5, 9))
    assert m["ssr"] == pytest.approx(f(1, 3))  # leading passes 1, 2, 0 of T=3
    assert m["csr_by_type"] == pytest.approx(
        {"action": 0.0, "content": 0.8, "format": 1.0, "role": 1.0, "style": 0.5, "background": None}
    )
    assert m["n_constraints_by_type"] == {
        "action": 3,
        "content": 5,
        "background": 0,
        "role": 1,
        "format": 3,
        "style": 2,
    }
    assert m["isr_by_alignment"] == pytest.approx({"aligned": 0.8, "misaligned": 0.25})
    assert m["isr_by_group"]["dependent"] == pytest.approx({"aligned": f(2, 3), "misaligned": f(1, 3), "all": 0.5})
    assert m["isr_by_group"]["parallel"] == pytest.approx({"aligned": 1.0, "misaligned": 0.0, "all": f(2, 3)})
    assert m["rounds"]["all"] == pytest.approx([f(2, 3), f(1, 3), 0.0])
    assert m["rounds"]["dependent"] == pytest.approx([0.5, 0.0, 0.0])
    assert m["rounds"]["parallel"] == pytest.approx([1.0, 1.0, 0.0])
    assert m["ssr_by_group"] == pytest.approx({"dependent": f(1, 6), "parallel": f(2, 3)})
    assert m["ssr"] == pytest.approx(sum(m["rounds"]["all"]) / 3)
    assert m["isr_by_round"] == pytest.approx([f(2, 3), f(1, 3), f(2, 3)])
    # 不适用 neither satisfies (style CSR 1/2) nor fails (session 1, turn 3 passes).
    assert m["verdict_counts"] == {"yes": 9, "no": 4, "other": 1}
    assert m["n_other_verdicts"] == 1
    assert (m["n_unparsed_turns"], m["n_missing_turns"], m["partial"], m["excluded_unparsed"]) == (0, 0, False, False)
    assert m["bootstrap"] == {"resamples": 50, "seed": 0, "unit": "session"}
    assert set(m["ci95"]) == {"csr", "isr", "ssr"}
    json.dumps(m)  # plain JSON values only


def test_missing_judgment_is_an_error_unless_partial():
    judgments = make_judgments()
    del judgments[(2, 2)]
    with pytest.raises(SysbenchError, match=r"1 expected turn.*session 2, turn 2.*--allow-partial"):
        compute_metrics(make_sessions(), judgments)
    m = compute_metrics(make_sessions(), judgments, allow_partial=True, resamples=20)
    assert m["partial"] is True and m["n_missing_turns"] == 1 and m["n_turns"] == 8
    assert m["isr"] == pytest.approx(0.5)
    # The streak of session 2 now stops at its missing turn 2: leading passes 1, 1, 0.
    assert m["rounds"]["all"] == pytest.approx([f(2, 3), 0.0, 0.0])
    assert m["ssr"] == pytest.approx(f(2, 9))


def test_unparsed_judgment_is_an_error_unless_excluded():
    judgments = make_judgments()
    judgments[(1, 3)] = JudgmentRecord(system_id=1, turn=3, verdicts={}, parse_status="unparsed", raw_reply="??")
    with pytest.raises(SysbenchError, match=r"unparsed.*session 1, turn 3.*--exclude-unparsed"):
        compute_metrics(make_sessions(), judgments)
    m = compute_metrics(make_sessions(), judgments, exclude_unparsed=True, resamples=20)
    assert m["excluded_unparsed"] is True and m["n_unparsed_turns"] == 1
    assert (m["n_turns"], m["n_constraints"]) == (8, 11)
    assert m["isr"] == pytest.approx(0.5)
    assert m["partial"] is False


def test_skipped_generation_is_never_scored_as_a_pass():
    judgments = make_judgments()
    judgments[(1, 3)] = JudgmentRecord(system_id=1, turn=3, verdicts={}, parse_status="skipped")
    with pytest.raises(SysbenchError, match=r"skipped at generation.*session 1, turn 3.*--exclude-skipped"):
        compute_metrics(make_sessions(), judgments)
    m = compute_metrics(make_sessions(), judgments, exclude_skipped=True, resamples=20)
    assert m["n_skipped_turns"] == 1 and m["n_unparsed_turns"] == 0
    assert (m["n_turns"], m["n_constraints"]) == (8, 11)
    assert m["isr"] == pytest.approx(0.5)


def test_missing_verdict_counts_as_unsatisfied_and_not_failing():
    judgments = make_judgments()
    del judgments[(1, 1)].verdicts["2"]
    m = compute_metrics(make_sessions(), judgments, resamples=20)
    assert m["n_missing_verdicts"] == 1
    assert m["csr"] == pytest.approx(f(8, 14))
    assert m["isr"] == pytest.approx(f(5, 9))


def test_expected_limits_the_turns_that_must_be_judged():
    judgments = make_judgments()
    for key in [(3, 1), (3, 2), (3, 3), (2, 3)]:
        del judgments[key]
    expected = {(1, 1), (1, 2), (1, 3), (2, 1), (2, 2)}
    # Turns never generated make an unfinished run: an error naming them, unless partial runs are allowed.
    with pytest.raises(
        SysbenchError,
        match=r"4 turn\(s\) were never generated \(session 2, turn 3; session 3, turns 1-3\).*--allow-partial",
    ):
        compute_metrics(make_sessions(), judgments, expected=expected, resamples=20)
    m = compute_metrics(make_sessions(), judgments, expected=expected, resamples=20, allow_partial=True)
    assert (m["n_sessions"], m["n_turns"], m["n_ungenerated_turns"], m["partial"]) == (2, 5, 4, True)


def random_spec(n_sessions: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    kinds = list(RAW_TYPE)
    spec = {}
    for system_id in range(1, n_sessions + 1):
        turns = []
        for _ in range(5):
            items = [
                (kinds[rng.integers(len(kinds))], "是" if rng.random() < 0.8 else "否")
                for _ in range(int(rng.integers(1, 4)))
            ]
            turns.append(("aligned" if rng.random() < 0.75 else "misaligned", items))
        spec[system_id] = (bool(rng.random() < 0.7), turns)
    return spec


def test_bootstrap_is_seeded_and_contains_the_point_estimate():
    spec = random_spec(80, seed=3)
    sessions, judgments = make_sessions(spec), make_judgments(spec)
    first = compute_metrics(sessions, judgments, resamples=300, seed=7)
    again = compute_metrics(sessions, judgments, resamples=300, seed=7)
    other = compute_metrics(sessions, judgments, resamples=300, seed=8)
    assert first["ci95"] == again["ci95"]
    assert first["ci95"] != other["ci95"]
    for name in ("csr", "isr", "ssr"):
        low, high = first["ci95"][name]
        assert low < first[name] < high
        assert high - low < 0.5


def write_run(path: Path, spec=TINY, label: str = "tiny") -> Path:
    run = RunDir(path)
    sessions = make_sessions(spec)
    run.update_manifest(label=label, model="hand-built")
    save_run_sessions(run, sessions)
    run.generations.append(
        GenerationRecord(system_id=s.system_id, turn=t.index, user=t.user, response="ok", model="hand-built")
        for s in sessions
        for t in s.turns
    )
    run.judgments.append(sorted(make_judgments(spec).values(), key=lambda j: j.key))
    return path


def test_run_metrics_reads_a_run_directory(tmp_path):
    m = run_metrics(write_run(tmp_path / "run"), resamples=20)
    assert (m["label"], m["model"]) == ("tiny", "hand-built")
    assert m["csr"] == pytest.approx(f(9, 14))


def test_compare_with_itself_is_zero_with_zero_width_ci(tmp_path):
    run = write_run(tmp_path / "run")
    result = compare_runs(run, run, resamples=100)
    assert result["n_sessions"] == 3 and result["bootstrap"]["paired"] is True
    for name in ("csr", "csr_macro", "isr", "ssr", "csr_by_type.action", "isr_by_alignment.misaligned"):
        assert result["metrics"][name]["diff"] == 0.0
        assert result["metrics"][name]["ci95"] == [0.0, 0.0]
    assert result["metrics"]["csr_by_type.background"]["diff"] is None


def replace_turn(spec: dict, system_id: int, turn: int, alignment: str, items: list) -> dict:
    changed = dict(spec)
    dependent, turns = spec[system_id]
    turns = list(turns)
    turns[turn - 1] = (alignment, items)
    changed[system_id] = (dependent, turns)
    return changed


def test_compare_gives_paired_difference(tmp_path):
    spec_b = replace_turn(TINY, 1, 2, "misaligned", [("action", "是")])  # session 1, turn 2 now passes
    result = compare_runs(write_run(tmp_path / "a"), write_run(tmp_path / "b", spec_b, label="b"), resamples=200)
    assert result["metrics"]["isr"]["diff"] == pytest.approx(f(1, 9))
    assert result["metrics"]["csr"]["diff"] == pytest.approx(f(1, 14))
    low, high = result["metrics"]["isr"]["ci95"]
    assert 0.0 <= low <= high


def test_compare_of_mismatched_runs_names_the_differences(tmp_path):
    smaller = {k: v for k, v in TINY.items() if k != 3}
    with pytest.raises(SysbenchError, match=r"3 turn\(s\) only in .*session 3, turns 1-3"):
        compare_runs(write_run(tmp_path / "a"), write_run(tmp_path / "b", smaller))
    other_checklist = replace_turn(TINY, 2, 2, "aligned", [("format", "是")])
    with pytest.raises(SysbenchError, match=r"different checklists.*session 2, turn 2"):
        compare_runs(write_run(tmp_path / "c"), write_run(tmp_path / "d", other_checklist))


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_metrics_text_and_json(tmp_path, capsys):
    run = write_run(tmp_path / "run")
    code, out, _ = run_cli(["metrics", str(run), "--resamples", "50"], capsys)
    assert code == 0 and "CSR" in out and "tiny" in out and "64.3" in out  # 9/14
    code, out, _ = run_cli(["metrics", str(run), "--json", "--resamples", "50", "--seed", "3"], capsys)
    result = json.loads(out)
    assert code == 0 and result["bootstrap"]["seed"] == 3 and result["isr"] == pytest.approx(f(5, 9))
    code, out, _ = run_cli(["compare", str(run), str(run), "--json", "--resamples", "30"], capsys)
    assert code == 0 and json.loads(out)["metrics"]["ssr"]["diff"] == 0.0
    code, out, _ = run_cli(["compare", str(run), str(run), "--resamples", "30"], capsys)
    assert code == 0 and "csr_by_type.style" in out


def one_error_line(code: int, err: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_cli_errors_on_missing_or_torn_run_dirs(tmp_path, capsys):
    line = one_error_line(*run_cli(["metrics", str(tmp_path / "nope")], capsys)[::2])
    assert "no such run directory" in line

    run = write_run(tmp_path / "no-sessions")
    (run / "sessions.json").unlink()
    assert "sessions.json" in one_error_line(*run_cli(["metrics", str(run)], capsys)[::2])

    run = write_run(tmp_path / "torn-tail")
    data = (run / "judgments.jsonl").read_bytes()
    (run / "judgments.jsonl").write_bytes(data[: data.rstrip(b"\n").rfind(b"\n") + 40])  # last record torn
    assert "session 3, turn 3" in one_error_line(*run_cli(["metrics", str(run)], capsys)[::2])

    run = write_run(tmp_path / "torn-middle")
    lines = (run / "judgments.jsonl").read_bytes().split(b"\n")
    lines[2] = lines[2][:30]
    (run / "judgments.jsonl").write_bytes(b"\n".join(lines))
    assert "line 3" in one_error_line(*run_cli(["metrics", str(run)], capsys)[::2])

    run = write_run(tmp_path / "no-manifest")
    (run / "manifest.json").unlink()
    assert "not a run directory" in one_error_line(*run_cli(["metrics", str(run)], capsys)[::2])

    good = write_run(tmp_path / "good")
    line = one_error_line(*run_cli(["compare", str(good), str(tmp_path / "torn-tail")], capsys)[::2])
    assert "torn-tail" in line and "session 3, turn 3" in line


def test_metrics_never_imports_torch(tmp_path):
    run = write_run(tmp_path / "run")
    script = (
        "import sys\n"
        "from sysbench_gpu import cli\n"
        f"code = cli.main(['metrics', {str(run)!r}, '--json', '--resamples', '20'])\n"
        f"code |= cli.main(['compare', {str(run)!r}, {str(run)!r}, '--resamples', '20'])\n"
        "heavy = [m for m in ('torch', 'transformers', 'vllm', 'openai', 'matplotlib') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stdout
