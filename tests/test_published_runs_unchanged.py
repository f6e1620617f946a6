"""``metrics``, ``compare`` and ``report`` on imported published runs give the same bytes as before the layered package.

The files in ``tests/golden/published_runs/`` were written by the flat package (commit
5ad4920) from upstream's GPT-4o and Qwen2-72B workbooks and GPT-4o's ground-truth-history
workbook, with the same commands as below. Only what changes by nature is normalised: the
report's creation time, absolute paths, and the imported runs' manifests (import times).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from sysbench_gpu import cli

GOLDEN = Path(__file__).parent / "golden" / "published_runs"
WORKBOOKS = {
    "gpt4o": ("gpt4o", "gpt4o_analysis.xlsx"),
    "qwen2_72b": ("qwen2_72b", "qwen2_72b_analysis.xlsx"),
    "gpt4o-gt": ("with_gt_history_output/gpt4o", "gpt4o_analysis.xlsx"),
}
TABLES = ["table2_overall", "table3_alignment", "table4_rounds", "table6_csr_by_type", "table_gt_history_gain"]


@pytest.fixture(scope="module")
def published(shared_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding ``runs/<name>`` for the three imported workbooks (cwd-relative paths, as the golden files)."""
    results = shared_dir / "upstream-results"
    if not results.is_dir():
        pytest.skip(f"{results} not found")
    home = tmp_path_factory.mktemp("published")
    for name, (folder, workbook) in WORKBOOKS.items():
        assert cli.main(["import-upstream", str(results / folder / workbook), "--out", str(home / "runs" / name)]) == 0
    return home


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert cli.main(argv) == 0
    return capsys.readouterr().out


def _normalised(value: Any, home: str) -> Any:
    if isinstance(value, dict):
        return {k: _normalised(v, home) for k, v in value.items() if k not in ("created", "manifest")}
    if isinstance(value, list):
        return [_normalised(v, home) for v in value]
    if isinstance(value, str) and value.startswith(home):
        return value[len(home) :].lstrip("/")
    return value


def test_metrics_and_compare_print_the_same_bytes(published: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(published)
    assert _run(["metrics", "runs/gpt4o"], capsys) == (GOLDEN / "metrics_gpt4o.txt").read_text(encoding="utf-8")
    assert _run(["metrics", "runs/qwen2_72b", "--json"], capsys) == (GOLDEN / "metrics_qwen2_72b.json").read_text(
        encoding="utf-8"
    )
    assert _run(["compare", "runs/gpt4o", "runs/qwen2_72b"], capsys) == (GOLDEN / "compare.txt").read_text(
        encoding="utf-8"
    )


def test_report_writes_the_same_tables_and_report(published: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(published)
    argv = ["report", "runs/gpt4o", "runs/qwen2_72b", "--gt-pair", "runs/gpt4o-gt=runs/gpt4o", "--sort", "ssr"]
    _run([*argv, "--no-figures", "--out", "report"], capsys)
    out = published / "report"
    for table in TABLES:
        for suffix in ("md", "tex"):
            name = f"{table}.{suffix}"
            assert (out / name).read_bytes() == (GOLDEN / name).read_bytes(), name
    report_md = re.sub(r" on \d{4}-\d\d-\d\dT[\d:+]+\.", " on <created>.", (out / "report.md").read_text("utf-8"))
    assert report_md == (GOLDEN / "report.md").read_text(encoding="utf-8")
    report_json = _normalised(json.loads((out / "report.json").read_text("utf-8")), str(published.resolve()))
    assert report_json == json.loads((GOLDEN / "report.json").read_text(encoding="utf-8"))
