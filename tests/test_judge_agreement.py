"""`judge agreement` and `judge --rejudge` on imported upstream runs."""

from __future__ import annotations

import json
import re

import pytest
from openai_stub import OpenAIStub, Reply

from sysbench_gpu import cli
from sysbench_gpu.benchmarks.registry import load_run_sessions
from sysbench_gpu.benchmarks.sysbench.agreement import cohens_kappa, compare_runs
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.rundir import RunDir

pytest.importorskip("openai")

SESSIONS = "289,461"
CURRENT = re.compile(
    r"# Current round\n<role: user>\n<content>\n(.*)\n</content>\n"
    r"<role: assistant>\n<content>\n(.*)\n</content>\n\n# Checklist",
    re.S,
)


@pytest.fixture(scope="module")
def imported(tmp_path_factory, shared_dir):
    from sysbench_gpu.benchmarks.sysbench.upstream import import_workbook

    root = tmp_path_factory.mktemp("imports")
    runs = {}
    for name in ("gpt4o", "qwen2_72b"):
        runs[name] = root / name
        import_workbook(shared_dir / "upstream-results" / name / f"{name}_analysis.xlsx", runs[name])
    return runs


def test_kappa_textbook_values():
    # 20 yes/yes, 5 yes/no, 10 no/yes, 15 no/no: po 0.7, pe 0.5 -> kappa 0.4
    pairs = [(True, True)] * 20 + [(True, False)] * 5 + [(False, True)] * 10 + [(False, False)] * 15
    assert cohens_kappa(pairs) == pytest.approx(0.4)
    assert cohens_kappa([(True, True)] * 3) is None  # chance agreement 1: undefined
    assert cohens_kappa([]) is None
    assert cohens_kappa([(True, False), (False, True)]) == pytest.approx(-1.0)


def test_different_responses_are_refused(imported, capsys):
    assert cli.main(["judge", "agreement", str(imported["gpt4o"]), str(imported["qwen2_72b"])]) == 2
    err = capsys.readouterr().err
    assert "judge different responses" in err and "session 1, turn 1" in err


class UpstreamEcho:
    """Answers with the imported run's own verdicts, optionally turning every verdict into 否."""

    def __init__(self, run: RunDir, flip: bool) -> None:
        gens, judg = run.generations.read(), run.judgments.read()
        self.by_answer = {(g.user, g.response): judg[k] for k, g in gens.items()}
        self.sessions = {s.system_id: s for s in load_run_sessions(run)}
        self.flip = flip

    def __call__(self, body: dict, number: int) -> Reply:
        user, answer = CURRENT.search(body["messages"][0]["content"]).groups()
        record = self.by_answer[(user, answer)]
        turn = self.sessions[record.system_id].turn(record.turn)
        verdicts = {}
        for c in turn.constraints:
            verdict = record.verdicts.get(str(c.id))
            verdicts[str(c.id)] = "no" if self.flip else (verdict.raw if verdict else "不适用")
        return Reply(text=json.dumps({"reasoning": "echo", "verdicts": verdicts}, ensure_ascii=False))


def _rejudge(source, out, stub) -> int:
    return cli.main([
        "judge", str(source), "--rejudge", "--out", str(out), "--sessions", SESSIONS, "--template", "en",
        "--judge", "openai", "--judge-model", "echo-judge", "--base-url", stub.base_url,
    ])  # fmt: skip


def test_rejudged_copy_agrees_with_its_source(imported, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    source = RunDir(imported["gpt4o"])
    with OpenAIStub(UpstreamEcho(source, flip=False)) as stub:
        assert _rejudge(source.path, tmp_path / "same", stub) == 0
        assert stub.request_count == 10
        # Rerunning the same rejudge resumes: the copy matches, nothing is sent again.
        assert _rejudge(source.path, tmp_path / "same", stub) == 0
        assert stub.request_count == 10
    capsys.readouterr()
    assert cli.main(["judge", "agreement", str(source.path), str(tmp_path / "same"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["turns_compared"] == report["turns_common"] == 10
    assert report["constraints"]["raw_agreement"] == 1.0 and report["turns"]["pass_agreement"] == 1.0
    assert report["metrics"]["sessions"] == 2
    assert report["metrics"]["b_minus_a"] == {"csr": 0.0, "isr": 0.0, "ssr": 0.0}
    assert cli.main(["judge", "agreement", str(source.path), str(tmp_path / "same")]) == 0
    text = capsys.readouterr().out
    assert "constraints" in text and "CSR" in text and "+0.0 pts" in text

    # A judge that says "no" to everything: agreement equals A's share of non-yes verdicts.
    with OpenAIStub(UpstreamEcho(source, flip=True)) as stub:
        assert _rejudge(source.path, tmp_path / "flipped", stub) == 0
    report = compare_runs(source.path, tmp_path / "flipped")
    sessions = {s.system_id: s for s in load_run_sessions(RunDir(tmp_path / "flipped"))}
    judged = source.judgments.read()
    values = [
        (
            judged[(sid, t.index)].verdicts.get(str(c.id)).value
            if judged[(sid, t.index)].verdicts.get(str(c.id))
            else "other"
        )
        for sid, s in sessions.items()
        for t in s.turns
        for c in t.constraints
    ]
    assert report["constraints"]["n"] == len(values)
    assert report["constraints"]["yes_agreement"] == pytest.approx(sum(v != "yes" for v in values) / len(values))
    assert report["constraints"]["raw_agreement"] == pytest.approx(sum(v == "no" for v in values) / len(values))
    assert report["metrics"]["b"]["csr"] == 0.0 and report["metrics"]["b"]["isr"] == 0.0
    assert report["metrics"]["b_minus_a"]["csr"] == pytest.approx(-report["metrics"]["a"]["csr"])
    per_type = report["by_type"]
    assert sum(block["n"] for block in per_type.values()) == len(values)


def test_rejudge_refuses_a_foreign_out_dir(imported, tmp_path):
    other = RunDir(imported["qwen2_72b"])
    with pytest.raises(SysbenchError, match="other generations"):
        from sysbench_gpu.judging.rejudge import prepare_rejudge

        prepare_rejudge(other, imported["gpt4o"], None)
