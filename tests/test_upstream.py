"""import-upstream on every published workbook, cross-checked by a plain recomputation from the rows."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

openpyxl = pytest.importorskip("openpyxl")

from sysbench_gpu import cli  # noqa: E402 (after importorskip: openpyxl is optional)
from sysbench_gpu.benchmarks.registry import load_dataset, load_run_sessions  # noqa: E402 (after importorskip: openpyxl is optional)
from sysbench_gpu.benchmarks.sysbench.upstream import import_workbook  # noqa: E402 (after importorskip: openpyxl is optional)
from sysbench_gpu.benchmarks.sysbench.upstream_records import parse_checklist  # noqa: E402 (after importorskip: openpyxl is optional)
from sysbench_gpu.benchmarks.sysbench.upstream_workbook import REQUIRED_COLUMNS  # noqa: E402 (after importorskip: openpyxl is optional)
from sysbench_gpu.core.rundir import RunDir  # noqa: E402 (after importorskip: openpyxl is optional)

SHARED = Path(os.environ.get("SYSBENCH_SHARED", Path(__file__).resolve().parents[2] / "shared" / "sysbench"))
UPSTREAM = SHARED / "upstream-results"
WORKBOOKS = sorted(p.relative_to(UPSTREAM).as_posix() for p in UPSTREAM.glob("**/*_analysis.xlsx"))
TYPES = {
    "动作约束": "action",
    "内容约束": "content",
    "背景约束": "background",
    "角色约束": "role",
    "格式约束": "format",
    "风格约束": "style",
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """Import each workbook once per test module: relative path -> run directory."""
    runs: dict[str, Path] = {}

    def get(relative: str) -> Path:
        if relative not in runs:
            out = tmp_path_factory.mktemp("imports") / relative.replace("/", "__").removesuffix(".xlsx")
            assert cli.main(["import-upstream", str(UPSTREAM / relative), "--out", str(out)]) == 0
            runs[relative] = out
        return runs[relative]

    return get


def metrics_json(run: Path, capsys) -> dict:
    capsys.readouterr()
    assert cli.main(["metrics", str(run), "--json", "--resamples", "100"]) == 0
    return json.loads(capsys.readouterr().out)


# ---------------------------------------------------------------- independent recomputation


def recompute(workbook: Path) -> tuple[dict, dict]:
    """The paper's metrics straight from the sheet's rows, written as simply as possible.

    Also returns upstream's own per-type CSR from the same workbook (sheet 不同约束类型遵循,
    row 遵循率: percent with 2 decimals, keyed by Chinese type and "total").
    """
    book = openpyxl.load_workbook(workbook, read_only=True)
    rows = book["详情"].iter_rows(values_only=True)
    header = next(rows)
    rows = [dict(zip(header, row, strict=False)) for row in rows]
    type_sheet = list(book["不同约束类型遵循"].iter_rows(values_only=True))
    published = dict(zip(type_sheet[0][1:], next(r for r in type_sheet if r[0] == "遵循率")[1:], strict=False))
    book.close()

    satisfied, total = defaultdict(int), defaultdict(int)
    verdict_counts = {"yes": 0, "no": 0, "other": 0}
    turn_ratios = []
    passes = defaultdict(list)  # system_id -> [pass of round 1..5]
    turns_by = defaultdict(list)  # (group, alignment) -> passes
    by_round = defaultdict(list)
    group_of = {}
    for row in sorted(rows, key=lambda r: (r["system_id"], r["round_index"])):
        types = [line.rsplit(" | ", 1)[1] for line in row["评判细则"].split("\n")]
        verdicts = [line.rsplit(" | ", 1)[1] for line in row["评判结果"].split("\n")]
        assert len(types) == len(verdicts)
        for kind, verdict in zip(types, verdicts, strict=False):
            total[TYPES[kind]] += 1
            satisfied[TYPES[kind]] += verdict == "是"
            verdict_counts["yes" if verdict == "是" else "no" if verdict == "否" else "other"] += 1
        turn_ratios.append(verdicts.count("是") / len(verdicts))
        passed = "否" not in verdicts
        group = "dependent" if row["multi_rounds_related"] in (True, "True") else "parallel"
        alignment = "aligned" if row["alignment"] == "align" else "misaligned"
        group_of[row["system_id"]] = group
        passes[row["system_id"]].append(passed)
        turns_by[(group, alignment)].append(passed)
        by_round[row["round_index"]].append(passed)

    def mean(values):
        return sum(values) / len(values) if values else None

    def leading(flags):
        count = 0
        for flag in flags:
            if not flag:
                break
            count += 1
        return count

    rounds = {}
    for group in ("dependent", "parallel", "all"):
        leads = [leading(p) for s, p in passes.items() if group in ("all", group_of[s])]
        rounds[group] = [mean([lead >= n for lead in leads]) for n in range(1, 6)]
    all_passes = [flag for flags in passes.values() for flag in flags]
    return published, {
        "n_sessions": len(passes),
        "n_turns": len(all_passes),
        "n_constraints": sum(total.values()),
        "csr": sum(satisfied.values()) / sum(total.values()),
        "csr_macro": mean(turn_ratios),
        "isr": mean(all_passes),
        "ssr": mean(rounds["all"]),
        "csr_by_type": {t: satisfied[t] / total[t] if total[t] else None for t in TYPES.values()},
        "n_constraints_by_type": {t: total[t] for t in TYPES.values()},
        "isr_by_alignment": {
            a: mean(turns_by[("dependent", a)] + turns_by[("parallel", a)]) for a in ("aligned", "misaligned")
        },
        "isr_by_group": {
            g: {
                "aligned": mean(turns_by[(g, "aligned")]),
                "misaligned": mean(turns_by[(g, "misaligned")]),
                "all": mean(turns_by[(g, "aligned")] + turns_by[(g, "misaligned")]),
            }
            for g in ("dependent", "parallel")
        },
        "rounds": rounds,
        "ssr_by_group": {g: mean(rounds[g]) for g in ("dependent", "parallel")},
        "isr_by_round": [mean(by_round[n]) for n in range(1, 6)],
        "verdict_counts": verdict_counts,
        "n_other_verdicts": verdict_counts["other"],
    }


def assert_close(actual, expected, where: str) -> None:
    """Nested dicts/lists of floats equal up to rounding; None only where None is expected."""
    if isinstance(expected, dict):
        assert set(actual) == set(expected), where
        for key in expected:
            assert_close(actual[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert len(actual) == len(expected), where
        for index, (a, e) in enumerate(zip(actual, expected, strict=False)):
            assert_close(a, e, f"{where}[{index}]")
    elif expected is None:
        assert actual is None, where
    else:
        assert actual == pytest.approx(expected, abs=1e-12), where


@pytest.mark.parametrize(
    "relative",
    WORKBOOKS,
    ids=lambda r: r.removesuffix("_analysis.xlsx").split("/")[-1] + ("-gt" if "with_gt_history_output" in r else ""),
)
def test_import_matches_recomputation(relative, imported, capsys):
    workbook = UPSTREAM / relative
    run = imported(relative)
    result = metrics_json(run, capsys)
    published, expected = recompute(workbook)
    for key, value in expected.items():
        assert_close(result[key], value, key)
    assert (result["n_missing_turns"], result["n_unparsed_turns"], result["partial"]) == (0, 0, False)
    assert all(low <= result[m] <= high for m, (low, high) in result["ci95"].items())

    # Upstream's own analysis sheet in the same workbook: CSR per type and in total, in percent.
    for chinese, english in TYPES.items():
        assert round(100 * result["csr_by_type"][english], 2) == pytest.approx(published[chinese])
    assert round(100 * result["csr"], 2) == pytest.approx(published["total"])

    manifest = RunDir(run).read_manifest()
    section = manifest["stages"]["import"]
    gt = relative.startswith("with_gt_history_output/")
    folder = relative.split("/")[-2]
    assert section["history"] == ("reference" if gt else "model")
    assert section["label"] == manifest["label"] == (f"{folder}-gt-history" if gt else folder)
    assert section["rows"] == 2500 and section["sheet"] == "详情" and len(section["workbook_sha256"]) == 64
    assert section["anomalies"]["counts"] == {} or set(section["anomalies"]["counts"]) == {"empty_answer"}
    assert len(RunDir(run).generations.read()) == len(RunDir(run).judgments.read()) == 2500


def test_gpt4o_reproduces_the_paper(imported, capsys):
    result = metrics_json(imported("gpt4o/gpt4o_analysis.xlsx"), capsys)
    assert (round(100 * result["csr"], 1), round(100 * result["isr"], 1), round(100 * result["ssr"], 1)) == (
        87.1,
        76.4,
        54.4,
    )
    assert result["model"] == "gpt4o"


def test_shifted_references_land_on_turns_one_and_two(imported, sessions_file):
    run = RunDir(imported("gpt4o/gpt4o_analysis.xlsx"))
    sessions = load_run_sessions(run)
    shared = load_dataset(sessions_file).sessions
    assert tuple(sessions) == shared  # the whole snapshot, references included
    first = sessions[0]
    assert first.turn(1).reference and first.turn(2).reference
    assert [t.reference for t in first.turns[2:]] == [None, None, None]
    # The cell on turn 1's own row holds the user prompt, not the reference.
    assert first.turn(1).reference != first.turn(1).user


def test_empty_answers_are_kept_and_counted(imported):
    run = RunDir(imported("moonshot/moonshot_analysis.xlsx"))
    counts = run.read_manifest()["stages"]["import"]["anomalies"]["counts"]
    empty = [g for g in run.generations.read().values() if not g.response.strip()]
    assert counts["empty_answer"] == len(empty) > 0


def test_import_with_data_checks_agreement(tmp_path, sessions_file, capsys):
    workbook = UPSTREAM / "with_gt_history_output/gpt4o/gpt4o_analysis.xlsx"
    out = tmp_path / "ok"
    assert (
        cli.main(["import-upstream", str(workbook), "--out", str(out), "--data", str(sessions_file), "--label", "mine"])
        == 0
    )
    manifest = RunDir(out).read_manifest()
    assert manifest["label"] == "mine" and manifest["dataset"]["sha256"] == load_dataset(sessions_file).sha256
    assert manifest["stages"]["import"]["sessions_from"] == str(sessions_file)

    raw = json.loads(sessions_file.read_text(encoding="utf-8"))
    session = next(s for s in raw if s["system_id"] == 7)
    user3 = session["messages"][5]["content"]
    session["prompt_infos"][user3]["criteria"]["1"]["criteria_content"] += "（改）"
    altered = tmp_path / "altered.json"
    altered.write_text(json.dumps(raw, ensure_ascii=False), encoding="utf-8")
    capsys.readouterr()
    code = cli.main(["import-upstream", str(workbook), "--out", str(tmp_path / "bad"), "--data", str(altered)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "session 7, turn 3, field 'criteria 1'" in err[0]
    assert not (tmp_path / "bad").exists()


# ---------------------------------------------------------------- small hand-made workbooks


def row(system_id, round_index, checklist, verdicts, **cells):
    prompts = [f"问题 {system_id}-{n}" for n in range(1, 6)]
    shifted = [prompts[0], "参考 1", prompts[1], "参考 2", prompts[2]]
    base = {
        "system_id": system_id,
        "领域": "测试",
        "场景": None,
        "multi_rounds_related": system_id % 2 == 1,
        "alignment": "align",
        "round_index": round_index,
        "system_prompt": f"系统 {system_id}",
        "prompt": prompts[round_index - 1],
        "referrence": shifted[round_index - 1],
        "answer": "回答",
        "infer_model": "toy",
        "评判细则": checklist,
        "评判理由": "理由",
        "评判结果": verdicts,
        "是否可用": int("否" not in verdicts),
    }
    base.update(cells)
    return base


def toy_rows() -> list[dict]:
    rows = []
    for system_id in (1, 2):
        for n in range(1, 6):
            rows.append(
                row(system_id, n, "1. 要礼貌 | 风格约束\n2. 用表格 | 格式约束", "1. 风格约束 | 是\n2. 格式约束 | 是")
            )
    return rows


def write_book(path: Path, rows: list[dict], columns=REQUIRED_COLUMNS, sheet="详情") -> Path:
    book = openpyxl.Workbook()
    book.active.title = sheet
    book.active.append(list(columns))
    for values in rows:
        book.active.append([values.get(c) for c in columns])
    book.save(path)
    return path


def test_toy_workbook_checklist_references_and_verdict_rule(tmp_path):
    rows = toy_rows()
    tricky = "1. 回答用 A | B 两栏\n第二行说明 | 仍是内容 | 格式约束\n2. 语气友好 | 风格约束\n3. 不谈政治 | 动作约束"
    rows[2] = row(1, 3, tricky, "1. 格式约束 | 是\n2. 内容约束 | 不适用\n3. 动作约束 | 否\n3. 动作约束 | 是")
    rows[3] = row(1, 4, "1. 要礼貌 | 风格约束\n2. 用表格 | 格式约束", "1. 风格约束 | 是")
    rows[6] = row(2, 2, "1. 要礼貌 | 风格约束\n2. 用表格 | 格式约束", "1. 风格约束 | 是\n2. 格式约束 | 否", 是否可用=1)
    result = import_workbook(write_book(tmp_path / "toy_analysis.xlsx", rows), tmp_path / "run")
    assert (result.rows, result.sessions, result.model, result.label) == (10, 2, "toy", tmp_path.name)
    assert result.anomalies == {
        "extra_verdict_line": 1,
        "missing_verdict": 1,
        "verdict_type_mismatch": 1,
        "usable_disagrees": 1,
    }
    run = RunDir(tmp_path / "run")
    session = load_run_sessions(run)[0]
    turn3 = session.turn(3)
    assert [(c.id, c.content, c.type) for c in turn3.constraints] == [
        (1, "回答用 A | B 两栏\n第二行说明 | 仍是内容", "format"),
        (2, "语气友好", "style"),
        (3, "不谈政治", "action"),
    ]
    assert [t.reference for t in session.turns] == ["参考 1", "参考 2", None, None, None]
    verdicts = run.judgments.read()[(1, 3)].verdicts
    assert {k: v.value for k, v in verdicts.items()} == {"1": "yes", "2": "other", "3": "no", "extra-4": "yes"}
    assert verdicts["2"].type == "style"  # the checklist's type wins over the line's
    assert run.judgments.read()[(1, 4)].verdicts.keys() == {"1"}


def one_error(args: list[str], capsys) -> str:
    capsys.readouterr()
    code = cli.main(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_bad_workbooks_give_one_clear_line(tmp_path, capsys):
    def attempt(book: Path) -> str:
        out = tmp_path / f"out-{book.stem}"
        line = one_error(["import-upstream", str(book), "--out", str(out)], capsys)
        assert not out.exists()
        return line

    text = tmp_path / "text.xlsx"
    text.write_text("not a workbook", encoding="utf-8")
    assert "not an .xlsx workbook" in attempt(text)
    assert "no such workbook" in attempt(tmp_path / "absent.xlsx")
    assert "no sheet '详情'" in attempt(write_book(tmp_path / "sheet.xlsx", toy_rows(), sheet="Sheet1"))
    columns = [c for c in REQUIRED_COLUMNS if c != "评判结果"]
    assert "lacks column(s) 评判结果" in attempt(write_book(tmp_path / "cols.xlsx", toy_rows(), columns=columns))
    rows = [r for r in toy_rows() if (r["system_id"], r["round_index"]) != (2, 3)]
    assert "session 2: rows hold rounds [1, 2, 4, 5]" in attempt(write_book(tmp_path / "shape.xlsx", rows))
    rows = toy_rows()
    rows[4] = row(1, 5, "1. 没有类型的约束", "1. 风格约束 | 是")
    line = attempt(write_book(tmp_path / "checklist.xlsx", rows))
    assert "row 6, session 1, turn 5, column '评判细则', constraint 1" in line
    rows = toy_rows()
    rows[0]["alignment"] = "sideways"
    assert "row 2, session 1, turn 1, column 'alignment'" in attempt(write_book(tmp_path / "align.xlsx", rows))
    assert not [p for p in tmp_path.iterdir() if ".import-" in p.name]  # no half-made staging left behind


def test_existing_directories(tmp_path, capsys):
    book = write_book(tmp_path / "toy_analysis.xlsx", toy_rows())
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine", encoding="utf-8")
    assert "not empty" in one_error(["import-upstream", str(book), "--out", str(busy)], capsys)
    assert [p.name for p in busy.iterdir()] == ["notes.txt"]

    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["import-upstream", str(book), "--out", str(empty)]) == 0
    before = (empty / "judgments.jsonl").read_bytes()
    capsys.readouterr()
    assert cli.main(["import-upstream", str(book), "--out", str(empty)]) == 0
    assert "already holds" in capsys.readouterr().out
    assert (empty / "judgments.jsonl").read_bytes() == before


def test_parse_checklist_rejects_unknown_type():
    with pytest.raises(Exception, match="constraint 2"):
        parse_checklist("1. 好 | 风格约束\n2. 坏 | 奇怪约束", "x")
