"""`generate --preset mteval-paper`, and the one warning line `metrics` and `report` give for another procedure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mteval_runs import make_mteval_run
from openai_stub import OpenAIStub, Reply

from sysbench_gpu import cli
from sysbench_gpu.benchmarks.mteval.procedure import PAPER_PRESET, procedure_warning
from sysbench_gpu.benchmarks.mteval.tasks import DEFAULT_SYSTEM_MESSAGE
from sysbench_gpu.core.rundir import RunDir

KEY_ENV = "MTEVAL_PAPER_TEST_KEY"
CLS = "recollection_single_cls.jsonl"


def _reply(body: dict[str, Any], n: int) -> Reply:
    return Reply(text="It is about food.", prompt_tokens=12, completion_tokens=6)


def _generate(data: Path, out: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> tuple[int, list[dict]]:
    pytest.importorskip("openai")
    monkeypatch.setenv(KEY_ENV, "sk-paper-test")
    with OpenAIStub(_reply) as stub:
        code = cli.main(
            [
                "generate",
                "--data",
                str(data),
                "--engine",
                "openai",
                "--model",
                "stub-model",
                "--out",
                str(out),
                "--base-url",
                stub.base_url,
                "--api-key-env",
                KEY_ENV,
                "--limit",
                "2",
                "--no-progress",
                *extra,
            ]
        )
        return code, list(stub.requests)


def test_preset_writes_greedy_1024_and_the_default_system_message(tmp_path, mteval_data_dir, monkeypatch, capsys):
    code, requests = _generate(mteval_data_dir / CLS, tmp_path / "paper", monkeypatch, "--preset", "mteval-paper")
    assert code == 0 and len(requests) == 2
    section = RunDir(tmp_path / "paper").read_manifest()["stages"]["generate"]
    assert section["preset"] == "mteval-paper"
    assert section["sampling"]["temperature"] == 0 and section["sampling"]["max_tokens"] == 1024
    assert section["system_message"] == DEFAULT_SYSTEM_MESSAGE
    assert requests[0]["temperature"] == 0 and requests[0]["max_tokens"] == 1024
    assert requests[0]["messages"][0] == {"role": "system", "content": DEFAULT_SYSTEM_MESSAGE}
    assert procedure_warning(RunDir(tmp_path / "paper").read_manifest()) is None  # no judge stage yet

    # Rule-scored with the authors' rules: the run is as the paper made it, and metrics says nothing.
    assert cli.main(["judge", str(tmp_path / "paper")]) == 0
    capsys.readouterr()
    assert cli.main(["metrics", str(tmp_path / "paper")]) == 0
    assert "warning" not in capsys.readouterr().err


def test_preset_refuses_a_conflicting_flag(tmp_path, mteval_data_dir, monkeypatch, capsys):
    code, requests = _generate(
        mteval_data_dir / CLS, tmp_path / "x", monkeypatch, "--preset", "mteval-paper", "--temperature", "0.7"
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and not requests and len(err.splitlines()) == 1
    assert "--preset mteval-paper sets --temperature 0.0; drop --temperature 0.7" in err


def test_report_and_metrics_name_each_difference(tmp_path, mteval_data_dir, capsys):
    run = make_mteval_run(tmp_path / "mine", mteval_data_dir / CLS, [1, 2], lambda s, t: "food")
    run.update_manifest(
        stage="generate",
        sampling={},
        sampling_defaults={"max_tokens": 512},
        system_message="",
    )
    assert cli.main(["judge", str(run.path), "--rules", "lenient"]) == 0
    assert run.read_manifest()["stages"]["judge"]["rules"] == "lenient"
    capsys.readouterr()

    assert cli.main(["metrics", str(run.path)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: mine: made unlike the MT-Eval paper")
    for named in (
        "decoding by the model's own generation config, not greedy",
        "max new tokens 512 (engine default), not 1,024",
        "system message none, not the authors' default",
        "lenient rules, not the authors'",
    ):
        assert named in err[0]

    out = tmp_path / "report"
    assert cli.main(["report", str(run.path), "--out", str(out), "--no-figures"]) == 0
    err = capsys.readouterr().err
    assert "max new tokens 512 (engine default), not 1,024" in err
    assert "max new tokens 512 (engine default), not 1,024" in (out / "report.md").read_text()
    assert any("lenient rules" in w for w in json.loads((out / "report.json").read_text())["warnings"])


def test_a_judge_other_than_the_papers_is_named() -> None:
    manifest = {
        "stages": {
            "generate": {
                "sampling": {"temperature": 0.0, "max_tokens": PAPER_PRESET.max_tokens},
                "system_message": DEFAULT_SYSTEM_MESSAGE,
            },
            "judge": {"judge_model": "gpt-4o-mini", "judge_prompts": "ours", "rules": "official"},
        }
    }
    line = procedure_warning(manifest)
    assert line is not None and "judge gpt-4o-mini, not gpt-4-0613" in line and "our judge prompts" in line
    assert "greedy" not in line.split(": ", 1)[1] and "max new tokens" not in line
    manifest["stages"]["judge"] = {"judge_model": "gpt-4-0613", "judge_prompts": "official", "rules": "official"}
    assert procedure_warning(manifest) is None
    manifest["stages"]["judge"] = {"judge_model": "gpt-4-0613", "score_templates": {}}  # judged before the flags
    assert "our judge prompts, not the official ones (not recorded)" in (procedure_warning(manifest) or "")
