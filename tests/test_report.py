"""report: tables (Markdown/LaTeX), figures, report.json, gt-history gains, the CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sysbench_gpu.benchmarks.registry import save_run_sessions
from sysbench_gpu.benchmarks.sysbench import report as sysbench_report
from sysbench_gpu.benchmarks.sysbench import report_runs, report_tables
from sysbench_gpu.cli import main
from sysbench_gpu.core import tables as table_text
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord, Verdict
from sysbench_gpu.core.rundir import RunDir

REPO_ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- small hand-built runs


def _pick_sessions(dataset, n_dependent: int = 3, n_parallel: int = 2):
    dependent = [s for s in dataset.sessions if s.dependent][:n_dependent]
    parallel = [s for s in dataset.sessions if not s.dependent][:n_parallel]
    return dependent + parallel


def _make_run(path: Path, dataset, sessions, label: str, failing_turns: set[int], model: str = "toy") -> Path:
    """A judged run: every verdict yes, except constraint 1 is 'no' on ``failing_turns`` of every session."""
    run = RunDir(path)
    run.update_manifest(label=label, model=model)
    save_run_sessions(run, sessions, dataset)
    run.generations.append(
        GenerationRecord(system_id=s.system_id, turn=t.index, user=t.user, response="ok", model=model)
        for s in sessions
        for t in s.turns
    )
    records = []
    for session in sessions:
        for turn in session.turns:
            verdicts = {}
            for c in turn.constraints:
                fail = turn.index in failing_turns and c.id == turn.constraints[0].id
                verdicts[str(c.id)] = Verdict(raw="否" if fail else "是", value="no" if fail else "yes", type=c.type)
            records.append(JudgmentRecord(system_id=session.system_id, turn=turn.index, verdicts=verdicts))
    run.judgments.append(records)
    return path


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory, dataset):
    root = tmp_path_factory.mktemp("runs")
    sessions = _pick_sessions(dataset)
    perfect = _make_run(root / "perfect", dataset, sessions, "perfect", set())
    third = _make_run(root / "third", dataset, sessions, "fails_turn3 100% & co", {3})
    first = _make_run(root / "first", dataset, sessions, "fails_turn1", {1})
    return {"sessions": sessions, "perfect": perfect, "third": third, "first": first}


def _row(markdown: str, label: str) -> list[str]:
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == table_text.escape_markdown(label):
            return cells[1:]
    raise AssertionError(f"no row {label!r} in\n{markdown}")


# ---------------------------------------------------------------- tables


def test_tables_hold_the_right_numbers_and_bold_the_best(toy_runs):
    sessions = toy_runs["sessions"]
    n_constraints = sum(len(t.constraints) for s in sessions for t in s.turns)
    runs = [report_runs.load_run(toy_runs[name], resamples=50) for name in ("third", "perfect", "first")]
    assert [r.label for r in runs] == ["fails_turn3 100% & co", "perfect", "fails_turn1"]
    tables = {t.name: t for t in report_tables.build_tables(runs)}
    overall = table_text.render_markdown(tables["table2_overall"])
    # One failing constraint per session on one turn: ISR 4/5, CSR (N - sessions) / N.
    csr = f"{100 * (n_constraints - len(sessions)) / n_constraints:.1f}"
    third = _row(overall, "fails_turn3 100% & co")
    assert [c.split(" [")[0] for c in third] == [csr, "80.0", "40.0"]
    assert [c.split(" [")[0] for c in _row(overall, "perfect")] == ["**100.0**"] * 3
    assert [c.split(" [")[0] for c in _row(overall, "fails_turn1")] == [csr, "80.0", "0.0"]
    assert re.search(r"\*\*100\.0\*\* \[\d+\.\d, \d+\.\d\]", overall), "CI missing from the Markdown table"

    rounds = table_text.render_markdown(tables["table4_rounds"])
    # Dependent R1..R5, SSR, then parallel R1..R5, SSR.
    # R1 and R2 tie with the perfect run, so they are bold too.
    assert _row(rounds, "fails_turn3 100% & co") == ["**100.0**", "**100.0**", "0.0", "0.0", "0.0", "40.0"] * 2
    assert _row(rounds, "fails_turn1") == ["0.0"] * 12
    assert _row(rounds, "perfect") == ["**100.0**"] * 12

    by_type = table_text.render_markdown(tables["table6_csr_by_type"])
    assert _row(by_type, "perfect")[-1] == "**100.0**"
    assert _row(by_type, "fails_turn1")[-1] == csr

    alignment = table_text.render_markdown(tables["table3_alignment"])
    header = alignment.splitlines()[0]
    assert "Dependent Aligned" in header and "Overall Misaligned" in header
    assert len(_row(alignment, "perfect")) == 6


def test_bold_marks_ties_and_only_the_best():
    table = table_text.Table(
        name="t",
        title="t",
        caption="c",
        groups=[("", ["A", "B"])],
        rows=[("x", [50.04, 10.0]), ("y", [49.96, 20.0]), ("z", [None, 5.0])],
    )
    md = table_text.render_markdown(table)
    assert _row(md, "x") == ["**50.0**", "10.0"]
    assert _row(md, "y") == ["**50.0**", "**20.0**"]  # 49.96 shows as 50.0: a tie as displayed
    assert _row(md, "z") == ["–", "5.0"]


def test_latex_is_booktabs_escaped_and_well_formed(toy_runs):
    runs = [report_runs.load_run(toy_runs[name], resamples=20) for name in ("third", "perfect")]
    for table in report_tables.build_tables(runs):
        tex = table_text.render_latex(table)
        assert tex.count("\\begin{table}") == tex.count("\\end{table}") == 1
        assert tex.count("\\begin{tabular}") == tex.count("\\end{tabular}") == 1
        assert all(rule in tex for rule in ("\\toprule", "\\midrule", "\\bottomrule"))
        spec = re.search(r"\\begin\{tabular\}\{(l r*)\}".replace(" ", ""), tex).group(1)
        body = tex.split("\\midrule\n")[1].split("\\bottomrule")[0].strip().splitlines()
        assert len(body) == 2
        for line in body:
            # Every row has as many cells as the column spec; no unescaped & or % or _ in it.
            assert len(re.split(r"(?<!\\)&", line)) == len(spec)
            assert not re.search(r"(?<!\\)[%_]", line)
        for line in tex.splitlines():
            assert line.startswith("%") or not re.search(r"(?<!\\)%", line), line
        assert "fails\\_turn3 100\\% \\& co" in tex
        assert "\\textbf{100.0}" in tex
    assert table_text.escape_latex("a_b%c&d$e#f{g}h~i^j\\k") == (
        "a\\_b\\%c\\&d\\$e\\#f\\{g\\}h\\textasciitilde{}i\\textasciicircum{}j\\textbackslash{}k"
    )


# ---------------------------------------------------------------- gt history pairs


def test_gt_pair_gains_per_turn(toy_runs, tmp_path):
    perfect = report_runs.load_run(toy_runs["perfect"], resamples=20)
    third = report_runs.load_run(toy_runs["third"], resamples=20)
    first = report_runs.load_run(toy_runs["first"], resamples=20)
    pair = report_runs.GtPair(label="m", gt=perfect, base=third)
    assert pair.turn_gains == pytest.approx([0.0, 0.0, 100.0, 0.0, 0.0])
    reverse = report_runs.GtPair(label="r", gt=third, base=perfect)
    assert reverse.turn_gains == pytest.approx([0.0, 0.0, -100.0, 0.0, 0.0])
    table = report_tables.table_gt_gain([pair, reverse, report_runs.GtPair(label="t1", gt=perfect, base=first)])
    md = table_text.render_markdown(table)
    assert _row(md, "m") == ["+0.0", "+0.0", "+100.0", "+0.0", "+0.0", "+20.0", "+60.0"]
    assert _row(md, "r")[2] == "-100.0"
    assert "$-$100.0" in table_text.render_latex(table)
    # Turn 1 is the sanity check: same history in both runs, so only noise may move it.
    assert pair.turn1_noise_band == pytest.approx(0.0)
    fake = {"isr_by_round": [0.5] * 5, "n_sessions": 100}
    noisy = report_runs.GtPair(
        label="n",
        gt=report_runs.RunSummary(Path("g"), "g", None, None, fake, {}),
        base=report_runs.RunSummary(Path("b"), "b", None, None, fake, {}),
    )
    assert noisy.turn1_noise_band == pytest.approx(100 * 1.96 * (2 * 0.25 / 100) ** 0.5)
    pairs = [report_runs.GtPair(label="t1", gt=perfect, base=first)]
    result = sysbench_report.write_report([perfect], tmp_path, pairs, figures=False)
    assert any("turn-1 ISR gain is +100.0 points, beyond" in w for w in result.warnings)
    assert "Outside the noise band: t1" in (tmp_path / "report.md").read_text(encoding="utf-8")
    # Dict-shaped per-round values are read the same way as lists.
    assert report_runs.isr_gain_by_turn({"isr_by_round": {"t1": 0.5, "t2": 0.7}}, {"isr_by_round": [0.5, 0.6]})[:2] == (
        pytest.approx([0.0, 10.0])
    )


# ---------------------------------------------------------------- figures and the CLI


def test_every_domain_has_an_english_name(dataset):
    from sysbench_gpu.benchmarks.sysbench.figures import DOMAIN_NAMES_EN, domain_name_en

    domains = {s.domain for s in dataset.sessions}
    assert len(domains) == 22
    assert domains <= set(DOMAIN_NAMES_EN)
    assert all(domain_name_en(d).isascii() for d in domains)
    assert domain_name_en("未知领域") == "未知领域"  # unknown names fall back to the raw text


def _assert_figure(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) > 10_000, f"{path} looks empty ({len(data)} bytes)"
    magic = {".png": b"\x89PNG\r\n\x1a\n", ".pdf": b"%PDF-"}[path.suffix]
    assert data.startswith(magic)


def test_cli_report_writes_tables_figures_and_provenance(toy_runs, dataset, tmp_path, capsys):
    out = tmp_path / "report"
    gt_pair = f"{toy_runs['perfect']}={toy_runs['third']}"
    rc = main(
        [
            "report",
            str(toy_runs["third"]),
            str(toy_runs["perfect"]),
            str(toy_runs["first"]),
            "--out",
            str(out),
            "--gt-pair",
            gt_pair,
            "--labels",
            "third,perfect,first",
            "--data",
            str(dataset.path),
            "--sort",
            "ssr",
            "--resamples",
            "20",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    for name in ("table2_overall", "table3_alignment", "table4_rounds", "table6_csr_by_type", "table_gt_history_gain"):
        assert (out / f"{name}.md").is_file() and (out / f"{name}.tex").is_file()
    for name in ("fig_dataset_distribution", "fig_radar_csr_by_type", "fig_gt_history_gain"):
        for suffix in (".png", ".pdf"):
            _assert_figure(out / f"{name}{suffix}")

    # --sort ssr: perfect (100) first, then third (40), then first (0).
    overall = (out / "table2_overall.md").read_text(encoding="utf-8").splitlines()
    assert [line.split("|")[1].strip() for line in overall[2:]] == ["perfect", "third", "first"]
    gains = (out / "table_gt_history_gain.md").read_text(encoding="utf-8")
    assert _row(gains, "third")[:5] == ["+0.0", "+0.0", "+100.0", "+0.0", "+0.0"]

    md = (out / "report.md").read_text(encoding="utf-8")
    assert "![" in md and "fig_radar_csr_by_type.png" in md and "table4_rounds.tex" in md
    assert "## Warnings" not in md  # same dataset everywhere, all judged, no font problems

    meta = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert meta["tool"] == "sysbench-gpu" and meta["version"] and meta["created"]
    assert [r["label"] for r in meta["runs"]] == ["perfect", "third", "first"]
    assert meta["runs"][0]["dataset_sha256"] == dataset.sha256
    assert meta["runs"][0]["manifest"]["model"] == "toy"
    assert meta["runs"][1]["metrics"]["isr"] == pytest.approx(0.8)
    assert meta["gt_pairs"][0]["isr_gain_by_turn_points"] == pytest.approx([0, 0, 100, 0, 0])
    assert meta["metric_options"]["resamples"] == 20
    assert meta["warnings"] == []


def test_report_warns_on_mixed_datasets_and_rejects_unjudged_runs(toy_runs, dataset, tmp_path, capsys):
    other = tmp_path / "other"
    _make_run(other, dataset, toy_runs["sessions"][:2], "other", set())
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["dataset"]["sha256"] = "0" * 64
    (other / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "mixed"
    rc = main(["report", str(toy_runs["perfect"]), str(other), "--out", str(out), "--no-figures", "--resamples", "10"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "different dataset files" in captured.err
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "## Warnings" in md and "different dataset files" in md and "different sets of sessions" in md
    assert not list(out.glob("*.png"))

    unjudged = tmp_path / "unjudged"
    RunDir(unjudged).update_manifest(label="x")
    rc = main(["report", str(unjudged), "--out", str(tmp_path / "bad")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "not judged" in err[0] and str(unjudged) in err[0]
    rc = main(["report", str(tmp_path / "nowhere"), "--out", str(tmp_path / "bad")])
    assert rc == 2 and "no such run directory" in capsys.readouterr().err
    rc = main(["report", str(toy_runs["perfect"]), "--out", str(tmp_path / "bad"), "--labels", "a,b"])
    assert rc == 2 and "2 labels for 1 run" in capsys.readouterr().err
    rc = main(["report", str(toy_runs["perfect"]), "--out", str(tmp_path / "bad"), "--gt-pair", "nothing"])
    assert rc == 2 and "GT_RUN=BASE_RUN" in capsys.readouterr().err


def test_radar_with_fourteen_runs_has_no_font_warnings(tmp_path):
    from sysbench_gpu.benchmarks.sysbench import figures

    labels = [f"model_{i:02d}_with_a_long_name" for i in range(14)]
    values = [[60 + (i * 7 + j * 5) % 35 for j in range(6)] for i in range(14)]
    drawn = figures.plot_radar_csr_by_type(labels, values, ["A", "B", "C", "D", "E", "F"], tmp_path / "radar", ["png"])
    assert drawn.warnings == []
    _assert_figure(drawn.paths[0])
    # A Chinese label would have no glyph in the default fonts: the warning is caught and handed back.
    drawn = figures.plot_gt_history_gain(
        ["模型"], [{"dependent": [0, 1, 2, 3, 4], "parallel": [1, 0, 2, 1, 3]}], tmp_path / "gain", ["png"]
    )
    assert any("missing from" in w for w in drawn.warnings)


def test_report_cli_does_not_import_torch(toy_runs, tmp_path):
    """The report stage runs on a plain install: no torch (or vllm/transformers) is imported."""
    code = (
        "import sys; from sysbench_gpu.cli import main; "
        f"rc = main(['report', {str(toy_runs['perfect'])!r}, '--out', {str(tmp_path / 'r')!r}, '--resamples', '10']); "
        "heavy = [m for m in ('torch', 'transformers', 'vllm') if m in sys.modules]; "
        "assert rc == 0 and not heavy, (rc, heavy)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "r" / "fig_radar_csr_by_type.png").is_file()


# ---------------------------------------------------------------- real imported runs


def test_report_on_imported_gpt4o_matches_the_paper(shared_dir, tmp_path, capsys):
    upstream = shared_dir / "upstream-results"
    base, gt = tmp_path / "gpt4o", tmp_path / "gpt4o-gt"
    data = str(shared_dir / "sessions.json")
    for workbook, run in ((upstream / "gpt4o", base), (upstream / "with_gt_history_output" / "gpt4o", gt)):
        assert main(["import-upstream", str(workbook / "gpt4o_analysis.xlsx"), "--out", str(run), "--data", data]) == 0
    out = tmp_path / "report"
    rc = main(["report", str(base), "--out", str(out), "--gt-pair", f"{gt}={base}", "--no-figures", "--resamples=20"])
    assert rc == 0, capsys.readouterr().err
    overall = (out / "table2_overall.md").read_text(encoding="utf-8")
    assert [c.split(" [")[0] for c in _row(overall, "gpt4o")] == ["**87.1**", "**76.4**", "**54.4**"]
    assert "\\textbf{87.1} & \\textbf{76.4} & \\textbf{54.4}" in (out / "table2_overall.tex").read_text()
    by_type = _row((out / "table6_csr_by_type.md").read_text(encoding="utf-8"), "gpt4o")
    assert by_type[-1] == "**87.1**" and len(by_type) == 7
    gains = _row((out / "table_gt_history_gain.md").read_text(encoding="utf-8"), "gpt4o")
    assert abs(float(gains[0])) < 2.0  # turn 1: same history in both runs
    meta = json.loads((out / "report.json").read_text(encoding="utf-8"))
    pair = meta["gt_pairs"][0]
    assert pair["gt"]["label"] == "gpt4o-gt-history" and pair["base"]["label"] == "gpt4o"
    assert abs(pair["isr_gain_by_turn_points"][0]) <= pair["turn1_noise_band_points"]
    assert meta["runs"][0]["dataset_sha256"] == pair["gt"]["dataset_sha256"]
