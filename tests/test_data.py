"""The SysBench loader: Table-1 statistics, validation errors that name where, and the CLI."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sysbench_gpu.benchmarks.registry import load_dataset
from sysbench_gpu.benchmarks.sysbench.data import (
    OFFICIAL_SHA256,
    TYPE_ORDER,
    dataset_stats,
    parse_sessions,
)
from sysbench_gpu.benchmarks.sysbench.download import download_official
from sysbench_gpu.core.errors import SysbenchError


def test_table1_statistics(dataset) -> None:
    stats = dataset_stats(dataset.sessions)
    assert stats["n_sessions"] == 500
    assert stats["n_turns"] == 2500
    assert (stats["n_aligned"], stats["n_misaligned"]) == (1951, 549)
    assert (stats["n_dependent"], stats["n_parallel"]) == (356, 144)
    assert stats["n_constraints"] == 5952
    assert round(stats["constraints_per_turn"]["mean"], 2) == 2.38
    assert (stats["constraints_per_turn"]["min"], stats["constraints_per_turn"]["max"]) == (1, 11)
    assert list(stats["constraints_by_type"]) == list(TYPE_ORDER)
    assert sum(stats["constraints_by_type"].values()) == 5952
    assert len(stats["sessions_by_domain"]) == 22
    assert sum(stats["turns_by_domain"].values()) == 2500


def test_records_keep_missing_references_apart_from_empty(dataset) -> None:
    first = dataset.sessions[0]
    assert first.system_id == 1
    assert isinstance(first.turn(1).reference, str) and first.turn(1).reference
    assert first.turn(3).reference is None  # known-missing in the shared file
    assert first.turn(1).constraints[0].type == "action"
    assert first.turn(1).constraints[0].type_raw == "动作约束"
    assert first.turn(1).alignment == "misaligned"
    assert first.group == "parallel"
    assert not dataset.is_official
    assert len(dataset.sha256) == 64


def test_directory_is_accepted(shared_dir: Path) -> None:
    assert load_dataset(shared_dir).path.name == "sessions.json"


def _one_session(dataset) -> list[dict]:
    from sysbench_gpu.benchmarks.sysbench.schema import session_to_upstream

    return [session_to_upstream(dataset.sessions[0])]


def test_round_trip_through_upstream_schema(dataset) -> None:
    raw = _one_session(dataset)
    assert parse_sessions(raw)[0] == dataset.sessions[0]


def _expect_error(raw, *fragments: str) -> str:
    with pytest.raises(SysbenchError) as caught:
        parse_sessions(raw, source="bad.json")
    message = str(caught.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_validation_errors_name_session_turn_and_field(dataset) -> None:
    base = _one_session(dataset)
    user3 = base[0]["messages"][5]["content"]

    missing = copy.deepcopy(base)
    del missing[0]["rounds_related"]
    _expect_error(missing, "bad.json", "session 1", "'rounds_related'")

    no_info = copy.deepcopy(base)
    del no_info[0]["prompt_infos"][user3]
    _expect_error(no_info, "session 1", "turn 3", "prompt_infos")

    unknown_type = copy.deepcopy(base)
    unknown_type[0]["prompt_infos"][user3]["criteria"]["1"]["criteria_type"] = "颜色约束"
    _expect_error(unknown_type, "session 1", "turn 3", "constraint 1", "unknown constraint type")

    bad_id = copy.deepcopy(base)
    criteria = bad_id[0]["prompt_infos"][user3]["criteria"]
    criteria["one"] = criteria.pop("1")
    _expect_error(bad_id, "turn 3", "not an integer")

    empty = copy.deepcopy(base)
    empty[0]["prompt_infos"][user3]["criteria"] = {}
    _expect_error(empty, "turn 3", "empty checklist")

    order = copy.deepcopy(base)
    messages = order[0]["messages"]
    messages[3], messages[4] = messages[4], messages[3]
    _expect_error(order, "session 1", "turn 2", "expected role 'user'")

    not_bool = copy.deepcopy(base)
    not_bool[0]["rounds_related"] = "yes"
    _expect_error(not_bool, "'rounds_related' should be bool")

    duplicate = copy.deepcopy(base) * 2
    _expect_error(duplicate, "duplicate system_id")

    _expect_error({"system_id": 1}, "expected a JSON array")


def test_truncated_json_is_one_clear_line(tmp_path: Path, sessions_file: Path) -> None:
    truncated = tmp_path / "truncated.json"
    truncated.write_bytes(sessions_file.read_bytes()[:5000])
    with pytest.raises(SysbenchError, match=r"truncated.json: not valid JSON.*truncated"):
        load_dataset(truncated)
    with pytest.raises(SysbenchError, match="no such data file"):
        load_dataset(tmp_path / "absent.json")


def test_download_offline_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SysbenchError, match="could not download"):
        download_official(tmp_path, url="http://127.0.0.1:9/nothing-listens-here.json", timeout=2)
    assert not any(tmp_path.iterdir())


def test_download_rejects_wrong_checksum(tmp_path: Path) -> None:
    served = tmp_path / "served.json"
    served.write_text("[]")
    with pytest.raises(SysbenchError, match=f"expected {OFFICIAL_SHA256}"):
        download_official(tmp_path / "out", url=served.as_uri())
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sysbench_gpu", *args], capture_output=True, text=True, timeout=120)


def test_cli_stats_json(sessions_file: Path) -> None:
    result = _cli("data", "stats", str(sessions_file), "--json")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    for key in (
        "n_sessions",
        "n_turns",
        "n_aligned",
        "n_misaligned",
        "n_dependent",
        "n_parallel",
        "n_constraints",
        "constraints_by_type",
        "turns_by_domain",
    ):
        assert key in stats
    assert stats["n_constraints"] == 5952
    assert stats["is_official"] is False


def test_cli_bad_file_is_one_line_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('[{"system_id": 1, "system_prompt": "x"')
    result = _cli("data", "stats", str(bad))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith("error: ") and "bad.json" in result.stderr


def test_light_commands_do_not_import_torch(sessions_file: Path) -> None:
    code = (
        "import sys; from sysbench_gpu.cli import main; "
        f"main(['data', 'stats', {str(sessions_file)!r}, '--json']); "
        "heavy = [m for m in ('torch', 'vllm', 'transformers', 'openai', 'matplotlib') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
