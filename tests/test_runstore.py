"""The run directory: atomic appends, torn last lines, keys, manifest and sessions snapshot."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from sysbench_gpu.benchmarks.registry import load_run_sessions, save_run_sessions
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord, Verdict
from sysbench_gpu.core.rundir import RunDir


def _generation(system_id: int, turn: int, response: str | None = "reply") -> GenerationRecord:
    return GenerationRecord(system_id=system_id, turn=turn, user=f"user {turn}", response=response, prompt_tokens=3)


def test_append_and_read_back(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    assert run.generations.append([_generation(1, 1), _generation(1, 2, "回答")]) == 2
    records = run.generations.read()
    assert list(records) == [(1, 1), (1, 2)]
    assert records[(1, 2)].response == "回答"
    assert records[(1, 2)].prompt_tokens == 3


def test_duplicate_key_is_refused(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.generations.append([_generation(7, 1)])
    with pytest.raises(SysbenchError, match="session 7, turn 1 already has a record"):
        run.generations.append([_generation(7, 1)])
    assert len(run.generations.read()) == 1


def test_torn_last_line_is_ignored_then_cut(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.generations.append([_generation(1, 1), _generation(1, 2)])
    path = run.generations.path
    whole = path.read_bytes()
    # A crash in the middle of writing a third record.
    path.write_bytes(whole + b'{"system_id": 1, "turn": 3, "user": "u", "resp')
    assert set(run.generations.read()) == {(1, 1), (1, 2)}
    run.generations.append([_generation(1, 3)])
    assert set(run.generations.read()) == {(1, 1), (1, 2), (1, 3)}
    assert path.read_bytes().count(b"\n") == 3
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_corrupt_middle_line_names_the_line(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.generations.append([_generation(1, 1)])
    path = run.generations.path
    path.write_bytes(path.read_bytes() + b"not json\n" + path.read_bytes())
    with pytest.raises(SysbenchError, match=r"generations.jsonl: line 2 is not a valid record"):
        run.generations.read()


def test_judgment_round_trip_and_pass_rule(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    record = JudgmentRecord(
        system_id=3,
        turn=2,
        verdicts={
            "1": Verdict(raw="是", value="yes", type="format"),
            "2": Verdict(raw="不适用", value="other", type="style"),
        },
        reasoning="理由",
        judge_model="stub",
    )
    unparsed = JudgmentRecord(system_id=3, turn=3, verdicts={}, parse_status="unparsed", raw_reply="garbage")
    run.judgments.append([record, unparsed])
    back = run.judgments.read()
    assert back[(3, 2)] == record
    assert back[(3, 2)].passed is True  # 'other' does not fail a turn
    assert back[(3, 3)].passed is None  # never silently passed or failed


def _append_many(path: str, worker: int) -> None:
    run = RunDir(path)
    for turn in range(1, 51):
        run.generations.append([_generation(worker, turn, "x" * 3000)], existing=set())


def test_concurrent_appends_never_interleave(tmp_path: Path) -> None:
    # Several processes appending long lines: every line must stay whole.
    context = multiprocessing.get_context("fork") if hasattr(os, "fork") else multiprocessing.get_context()
    workers = [context.Process(target=_append_many, args=(str(tmp_path), worker)) for worker in range(1, 4)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(60)
    records = RunDir(tmp_path).generations.read()
    assert len(records) == 150


def test_manifest_is_merged_per_stage(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    with pytest.raises(SysbenchError, match="no such run directory"):
        run.require()
    run.update_manifest("generate", model="m1", sampling={"temperature": 0})
    first = run.read_manifest()
    run.update_manifest("judge", judge_model="j1")
    manifest = run.require().read_manifest()
    assert manifest["created"] == first["created"]
    assert manifest["stages"]["generate"]["model"] == "m1"
    assert manifest["stages"]["judge"]["judge_model"] == "j1"
    assert "python" in manifest["versions"]
    assert not list((tmp_path / "run").glob("*.tmp"))


def test_sessions_snapshot_round_trip(tmp_path: Path, dataset) -> None:
    run = RunDir(tmp_path)
    chosen = dataset.select([5, 2], limit=None)
    save_run_sessions(run, chosen, dataset)
    assert load_run_sessions(run) == chosen
    assert run.read_manifest()["dataset"]["sha256"] == dataset.sha256
    with pytest.raises(SysbenchError, match="no session with system_id 9999"):
        dataset.select([9999])


@pytest.mark.parametrize(
    "name", ["follow-up_multi.jsonl", "recollection_multi_global-inst.jsonl", "refinement_single.jsonl"]
)
def test_mteval_snapshot_round_trip_keeps_ids_and_task(tmp_path: Path, mteval_data_dir: Path, name: str) -> None:
    from sysbench_gpu.benchmarks.registry import load_dataset

    source = load_dataset(mteval_data_dir / name)
    chosen = list(source.sessions)[3:6]  # a subset: ids 4-6, not 1-3, and a file name that names no task
    run = RunDir(tmp_path)
    save_run_sessions(run, chosen, source)
    assert load_run_sessions(run) == chosen
    assert [s.system_id for s in load_run_sessions(run)] == [4, 5, 6]
    assert run.sessions_path.read_text(encoding="utf-8").count("\n") == 3  # JSON Lines


def test_keys_are_checked_against_the_file_under_the_lock(tmp_path: Path) -> None:
    # Two writers that each read the file before the other wrote: the second is refused by the file itself.
    first, second = RunDir(tmp_path), RunDir(tmp_path)
    first.generations.append([_generation(1, 1)])
    second.generations.append([_generation(1, 2)], existing=set())
    first.generations.append([_generation(1, 3)])
    with pytest.raises(SysbenchError, match="session 1, turn 3 already has a record"):
        second.generations.append([_generation(1, 3)], existing=set())
    with pytest.raises(SysbenchError, match="session 2, turn 1 already has a record"):
        second.generations.append([_generation(2, 1), _generation(2, 1)])
    assert list(RunDir(tmp_path).generations.read()) == [(1, 1), (1, 2), (1, 3)]
    # An atomic rewrite (as --retry-unparsed does) is noticed: the index starts over.
    path = first.generations.path
    path.write_bytes(path.read_bytes().split(b"\n", 1)[1])
    first.generations.append([_generation(1, 1)])
    assert sorted(RunDir(tmp_path).generations.read()) == [(1, 1), (1, 2), (1, 3)]


@pytest.mark.parametrize(
    "store,change,message",
    [
        ("generations", {"system_id": "1"}, "field 'system_id' should be an integer, found a string"),
        ("generations", {"response": 7}, "field 'response' should be a string or null, found a number"),
        ("generations", {"status": "done"}, "field 'status' is 'done', expected one of ok, skipped"),
        ("generations", {"response": None}, "field 'response' is null but status is 'ok'"),
        ("generations", {"colour": "red"}, "field 'colour' is not a field of this record"),
        ("generations", {"turn": True}, "field 'turn' should be an integer, found a boolean"),
        (
            "judgments",
            {"parse_status": "fine"},
            "field 'parse_status' is 'fine', expected one of ok, unparsed, imported, skipped",
        ),
        (
            "judgments",
            {"verdicts": {"1": {"raw": "maybe", "value": "maybe", "type": "format"}}},
            "field 'verdicts.1.value' is 'maybe', expected one of yes, no, other",
        ),
        ("judgments", {"verdicts": {"1": "是"}}, "field 'verdicts.1' should be an object, found a string"),
        ("judgments", {"attempts": -1}, "field 'attempts' is -1, expected 0 or more"),
    ],
)
def test_record_types_are_validated_on_read(tmp_path: Path, store: str, change: dict, message: str) -> None:
    run = RunDir(tmp_path)
    records = getattr(run, store)
    if store == "generations":
        records.append([_generation(1, 1), _generation(1, 2)])
    else:
        verdicts = {"1": Verdict(raw="是", value="yes", type="format")}
        records.append([JudgmentRecord(system_id=1, turn=t, verdicts=verdicts) for t in (1, 2)])
    lines = records.path.read_text(encoding="utf-8").splitlines()
    lines[1] = json.dumps({**json.loads(lines[1]), **change}, ensure_ascii=False)
    records.path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(SysbenchError) as caught:
        records.read()
    where = "line 2" if set(change) & {"system_id", "turn"} else "line 2 (session 1, turn 2)"
    assert str(caught.value) == f"{records.path}: {where}, {message}"
