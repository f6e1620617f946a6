"""`generate --preset mteval-paper`, and the one warning line `metrics` and `report` give for another procedure."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from mteval_runs import make_mteval_run
from openai_stub import OpenAIStub, Reply

from sysbench_gpu import cli
from sysbench_gpu.benchmarks.mteval.procedure import PAPER_PRESET, procedure_warning
from sysbench_gpu.benchmarks.mteval.tasks import DEFAULT_SYSTEM_MESSAGE
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.engines.base import SamplingSpec

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
    assert section["sampling"]["repetition_penalty"] == 1.0
    assert section["system_message"] == DEFAULT_SYSTEM_MESSAGE
    assert requests[0]["temperature"] == 0 and requests[0]["max_tokens"] == 1024
    # A local OpenAI-compatible server (vLLM's) takes the field: it is sent, and the manifest says so.
    assert all(r["repetition_penalty"] == 1.0 for r in requests)
    described = section["engine_describe"]
    assert described["takes_repetition_penalty"] is True and described["repetition_penalty_sent"] == 1.0
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


def test_preset_refuses_another_repetition_penalty(tmp_path, mteval_data_dir, monkeypatch, capsys):
    code, requests = _generate(
        mteval_data_dir / CLS, tmp_path / "x", monkeypatch, "--preset", "mteval-paper", "--repetition-penalty", "1.05"
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and not requests
    assert "--preset mteval-paper sets --repetition-penalty 1.0; drop --repetition-penalty 1.05" in err


def test_a_penalty_openais_api_cannot_apply_is_refused_before_the_run_directory(
    tmp_path, mteval_data_dir, monkeypatch, capsys
):
    """Refused in one line before --out is made or a request is sent, not at the first request."""
    pytest.importorskip("openai")
    monkeypatch.setenv(KEY_ENV, "sk-paper-test")
    out = tmp_path / "x"
    code = cli.main(
        ["generate", "--data", str(mteval_data_dir / CLS), "--engine", "openai", "--model", "gpt-4o"]
        + ["--out", str(out), "--api-key-env", KEY_ENV, "--repetition-penalty", "1.05", "--no-progress"]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "api.openai.com takes no repetition_penalty" in err and "--repetition-penalty 1.05" in err
    assert not out.exists()


def _openai_engine(monkeypatch: pytest.MonkeyPatch, base_url: str | None) -> tuple[Any, list[dict[str, Any]]]:
    """An openai engine whose client keeps each request's arguments instead of sending them."""
    pytest.importorskip("openai")
    from sysbench_gpu.engines.openai_engine import OpenAIEngine

    monkeypatch.setenv(KEY_ENV, "sk-paper-test")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    engine = OpenAIEngine("gpt-test", base_url=base_url, api_key_env=KEY_ENV)
    sent: list[dict[str, Any]] = []

    def create(**kwargs: Any) -> Any:
        sent.append(kwargs)
        message = SimpleNamespace(content="ok")
        return SimpleNamespace(choices=[SimpleNamespace(message=message, finish_reason="stop")], usage=None, model=None)

    monkeypatch.setattr(engine._client.chat.completions, "create", create)
    return engine, sent


PAPER_SAMPLING = SamplingSpec(
    temperature=PAPER_PRESET.temperature,
    max_tokens=PAPER_PRESET.max_tokens,
    repetition_penalty=PAPER_PRESET.repetition_penalty,
)


@pytest.mark.parametrize("base_url", [None, "https://api.openai.com/v1", "https://API.openai.com/v1/"])
def test_openai_api_is_never_sent_a_repetition_penalty(monkeypatch, base_url) -> None:
    engine, sent = _openai_engine(monkeypatch, base_url)
    engine.chat_one([{"role": "user", "content": "hi"}], PAPER_SAMPLING)
    assert "repetition_penalty" not in sent[0] and "repetition_penalty" not in (sent[0].get("extra_body") or {})
    described = engine.describe()
    assert described["takes_repetition_penalty"] is False and described["repetition_penalty_sent"] is None
    # No penalty is what that API applies; another value cannot be had there, and says so in one line.
    with pytest.raises(
        SysbenchError, match=r"api\.openai\.com takes no repetition_penalty.*--repetition-penalty 1\.05"
    ):
        engine.chat_one([{"role": "user", "content": "hi"}], SamplingSpec(repetition_penalty=1.05))
    manifest = {
        "stages": {
            "generate": {
                "engine": "openai",
                "engine_describe": described,
                "sampling": {"temperature": 0.0, "max_tokens": 1024, "repetition_penalty": 1.0},
                "system_message": DEFAULT_SYSTEM_MESSAGE,
            }
        }
    }
    assert procedure_warning(manifest) is None


def test_a_vllm_server_is_sent_the_repetition_penalty(monkeypatch) -> None:
    engine, sent = _openai_engine(monkeypatch, "http://127.0.0.1:8000/v1")
    engine.chat_one([{"role": "user", "content": "hi"}], PAPER_SAMPLING)
    assert sent[0]["extra_body"]["repetition_penalty"] == 1.0
    assert engine.describe()["repetition_penalty_sent"] == 1.0
    engine.chat_one([{"role": "user", "content": "hi"}], SamplingSpec(temperature=0.0))
    assert "repetition_penalty" not in (sent[1].get("extra_body") or {})
    assert engine.describe()["repetition_penalty_sent"] is None


def test_hf_applies_the_presets_repetition_penalty_over_the_models_config() -> None:
    """Qwen2-Instruct's generation_config.json sets 1.05; the preset's 1.0 goes to generate() instead."""
    transformers = pytest.importorskip("transformers")
    from sysbench_gpu.engines.hf import HFEngine

    engine = HFEngine.__new__(HFEngine)  # generation_kwargs reads only these
    config = transformers.GenerationConfig(
        do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05
    )
    engine.hf_model = SimpleNamespace(generation_config=config)
    engine.tokenizer = SimpleNamespace(pad_token_id=0)
    engine.default_max_tokens, engine.ignore_eos = 512, False
    kwargs = engine.generation_kwargs(PAPER_SAMPLING)
    assert kwargs["repetition_penalty"] == 1.0 and kwargs["do_sample"] is False and kwargs["max_new_tokens"] == 1024
    assert "repetition_penalty" not in engine.generation_kwargs(SamplingSpec())  # left to the model's 1.05


def test_vllm_applies_the_presets_repetition_penalty_over_the_models_config() -> None:
    pytest.importorskip("vllm")
    from sysbench_gpu.engines.vllm_engine import LocalVLLM

    local = LocalVLLM.__new__(LocalVLLM)  # sampling_params reads only the model's defaults
    local.model_defaults = {"repetition_penalty": 1.05, "temperature": 0.7, "top_p": 0.8, "top_k": 20}
    params = local.sampling_params(PAPER_SAMPLING)
    assert params.repetition_penalty == 1.0 and params.temperature == 0.0 and params.max_tokens == 1024
    assert local.sampling_params(SamplingSpec()).repetition_penalty == 1.05


@pytest.mark.parametrize(
    ("generate", "named"),
    [
        ({"engine": "hf", "sampling_defaults": {"repetition_penalty": 1.05}}, "repetition penalty 1.05 (the model's"),
        ({"engine": "vllm", "sampling": {"repetition_penalty": 1.1}}, "repetition penalty 1.1, not 1"),
        ({"engine": "openai", "engine_describe": {"base_url": "http://h/v1"}}, "left to the server's default"),
        ({"engine": "hf", "engine_describe": {"dtype": "bfloat16"}}, "weights in bfloat16, not float16"),
        ({"engine": "vllm", "sampling_defaults": {"presence_penalty": 0.5}}, "presence penalty 0.5 (the model's"),
    ],
)
def test_the_warning_names_a_repetition_penalty_or_dtype_unlike_the_papers(generate, named) -> None:
    section = {"sampling": {"temperature": 0.0, "max_tokens": 1024}, "system_message": DEFAULT_SYSTEM_MESSAGE}
    for key, value in generate.items():
        section[key] = {**section.get(key, {}), **value} if isinstance(value, dict) else value
    line = procedure_warning({"stages": {"generate": section}})
    assert line is not None and named in line
    assert "greedy" not in line.split(": ", 1)[1] and "max new tokens" not in line


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
    # Judged before the articles came from documents.jsonl: the manifest names no documents.
    official = {"judge_model": "gpt-4-0613", "judge_prompts": "official", "rules": "official"}
    manifest["stages"]["judge"] = {**official, "score_templates": {"expansion": {}, "follow-up": {}}}
    assert "not documents.jsonl" in (procedure_warning(manifest) or "")
    manifest["stages"]["judge"]["documents"] = {"name": "official:documents.jsonl", "sha256": "..."}
    assert procedure_warning(manifest) is None
    manifest["stages"]["judge"] = {**official, "score_templates": {"follow-up": {}}}  # no {content} there
    assert procedure_warning(manifest) is None
    manifest["stages"]["judge"] = {"judge_model": "gpt-4-0613", "score_templates": {}}  # judged before the flags
    assert "our judge prompts, not the official ones (not recorded)" in (procedure_warning(manifest) or "")
