"""The probes of issue 21 that used to end in a traceback, a wrong number or a silent pass.

Each now ends in one line naming the file and the field, and a non-zero exit. A run made
with the fake engine (no model) stands in for a generated run; ``profile`` reads it with
a packaged model config.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fake_engine import FakeEngine

from sysbench_gpu.cli import main
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.engines.base import SamplingSpec
from sysbench_gpu.generation.run import run_generation
from sysbench_gpu.generation.settings import GenerateSettings

PROFILE = ("--model-config", "qwen2-7b", "--device-spec", "cpu")


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory, dataset) -> Path:
    run = RunDir(tmp_path_factory.mktemp("probes") / "run")
    settings = GenerateSettings(model="smollm2", engine="hf", sampling=SamplingSpec(max_tokens=10))
    run_generation(FakeEngine(), dataset, dataset.select(limit=1), run, settings, progress=False)
    return run.path


def _edited(fake_run: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    run = tmp_path / "run"
    shutil.copytree(fake_run, run)
    stats = json.loads((run / "stats.json").read_text())
    edit(stats)
    (run / "stats.json").write_text(json.dumps(stats))
    return run


def _fails_in_one_line(capsys, argv: list[str], *expected: str) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in err, err
    return err


def _set_call(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(stats: dict[str, Any]) -> None:
        stats["calls"][0][field] = value

    return edit


def test_the_fake_run_profiles(fake_run, capsys):
    capsys.readouterr()
    assert main(["profile", str(fake_run), *PROFILE]) == 0


@pytest.mark.parametrize("value", ["x", [1], -3, True, 1.5])
def test_requests_that_are_not_a_count(fake_run, tmp_path, capsys, value):
    run = _edited(fake_run, tmp_path, _set_call("requests", value))
    _fails_in_one_line(capsys, ["profile", str(run), *PROFILE], "stats.json", "field 'calls[0].requests'")


def test_out_naming_an_existing_file(fake_run, tmp_path, capsys):
    target = tmp_path / "profile.txt"
    target.write_text("mine")
    _fails_in_one_line(capsys, ["profile", str(fake_run), *PROFILE, "--out", str(target)], str(target), "--out")
    assert target.read_text() == "mine"


@pytest.mark.parametrize("value", [-1, "abc", float("inf")])
def test_wall_time_that_is_not_a_duration(fake_run, tmp_path, capsys, value):
    run = _edited(fake_run, tmp_path, _set_call("wall_s", value))
    _fails_in_one_line(capsys, ["profile", str(run), *PROFILE], "stats.json", "field 'calls[0].wall_s'")


def test_a_turn_that_is_not_a_number(fake_run, tmp_path, capsys):
    def edit(stats: dict[str, Any]) -> None:
        stats.clear()
        stats["calls"] = [{"turn": "one"}]

    run = _edited(fake_run, tmp_path, edit)
    _fails_in_one_line(capsys, ["profile", str(run), *PROFILE], "stats.json", "field 'calls[0].turn'")


def test_calls_with_nothing_answered_name_the_file_and_field(fake_run, tmp_path, capsys):
    def edit(stats: dict[str, Any]) -> None:
        stats["calls"] = [{"turn": 1, "requests": 0}]

    run = _edited(fake_run, tmp_path, edit)
    _fails_in_one_line(capsys, ["profile", str(run), *PROFILE], "stats.json", "field 'calls'", "no work to bound")


def test_a_damaged_stats_file_stops_a_resume_before_any_work(fake_run, tmp_path, capsys, sessions_file):
    run = _edited(fake_run, tmp_path, _set_call("wall_s", "abc"))
    argv = ["generate", "--data", str(sessions_file), "--model", "smollm2", "--engine", "hf", "--out", str(run)]
    _fails_in_one_line(capsys, [*argv, "--limit", "2", "--max-tokens", "10"], "field 'calls[0].wall_s'")


def test_explore_refuses_a_negative_resample_count(fake_run, tmp_path, capsys):
    site = tmp_path / "site"
    _fails_in_one_line(capsys, ["explore", str(fake_run), "--out", str(site), "--resamples", "-5"], "--resamples")
    assert not site.exists()
