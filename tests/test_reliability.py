"""Locks, partial runs, the primary rank, and one clear line for every user mistake the probes found."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from openai_stub import OpenAIStub, Reply
from test_judge_support import good_reply, make_run, marker

from sysbench_gpu import cli
from sysbench_gpu.benchmarks.sysbench.judge_prompt import load_template
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.locks import StageBusy, StageLock, is_primary_rank, stage_lock
from sysbench_gpu.core.records import JudgmentRecord, Verdict
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.core.sessions import parse_session_ids
from sysbench_gpu.engines.base import Completion
from sysbench_gpu.judging.rounds import JudgeSettings
from sysbench_gpu.judging.stage import judge_run

REPO_ROOT = Path(__file__).resolve().parent.parent


def one_error_line(code: int, err: str) -> str:
    """The one ``error:`` line of a failed command (a progress bar may precede it), and no traceback."""
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def run_cli(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    code = cli.main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- locks


def test_stage_lock_names_its_holder_and_is_taken_over_after_a_kill(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with stage_lock(run, "judge") as held:
        assert held is not None and held.path == run / ".judge.lock"
        holder = json.loads(held.path.read_text())
        assert holder["pid"] == os.getpid() and holder["stage"] == "judge"
        with pytest.raises(StageBusy, match=rf"another `judge` \(pid {os.getpid()} on host .*\) is writing"):
            StageLock(run, "judge").acquire()
        with stage_lock(run, "generate"):  # another stage of the same directory is its own lock
            pass
    assert not (run / ".judge.lock").exists()
    # A lock file left by a killed process is not held: the next writer takes it over.
    (run / ".judge.lock").write_text(json.dumps({"pid": 999999, "host": "gone", "started": "then", "stage": "judge"}))
    with stage_lock(run, "judge") as held:
        assert json.loads(held.path.read_text())["pid"] == os.getpid()
    with stage_lock(run, "judge", enabled=False) as none:
        assert none is None and not (run / ".judge.lock").exists()


def test_a_lock_held_by_another_process_is_refused_until_it_dies(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "from sysbench_gpu.core.locks import StageLock\n"
        f"lock = StageLock({str(tmp_path)!r}, 'generate').acquire()\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    holder = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StageBusy, match=rf"pid {holder.pid} on host"):
            StageLock(tmp_path, "generate").acquire()
    finally:
        holder.kill()
        holder.wait()
    with stage_lock(tmp_path, "generate"):  # the kernel dropped the dead holder's lock
        pass


def test_only_rank_zero_of_an_external_launcher_is_primary(monkeypatch: pytest.MonkeyPatch) -> None:
    assert is_primary_rank({}) and is_primary_rank({"distributed_executor_backend": "mp"})
    monkeypatch.setenv("RANK", "1")
    assert not is_primary_rank({"distributed_executor_backend": "external_launcher"})
    monkeypatch.setenv("RANK", "0")
    assert is_primary_rank({"distributed_executor_backend": "external_launcher"})


# ---------------------------------------------------------------- the primary rank only writes (issue 8 item 6)


class SecondRankEngine:
    """A local judge engine on a non-primary torchrun rank: it computes, it must not write."""

    name = "fake"
    is_primary = False

    def __init__(self, dataset) -> None:
        self.sessions = dataset.by_id()
        self.calls = 0

    def chat(self, conversations, sampling):
        self.calls += 1
        out = []
        for conversation in conversations:
            _, sid, turn = marker(conversation[-1]["content"])
            out.append(Completion(good_reply(self.sessions[sid], turn), 100, 20, finish_reason="stop"))
        return out

    def count_prompt_tokens(self, conversation):
        return 500

    def context_length(self):
        return None

    def supports_system_role(self):
        return True

    def describe(self):
        return {"engine": "fake"}

    def close(self):
        pass


def test_judge_on_a_non_primary_rank_writes_nothing(tmp_path: Path, dataset) -> None:
    run = make_run(tmp_path / "run", dataset, [1, 2], lambda s, t: "skipped" if (s, t) == (2, 5) else "good")
    before = snapshot(run.path)
    settings = JudgeSettings(
        backend="hf",
        model="fake-judge",
        template=load_template("zh"),
        max_retries=2,
        cache_dir=run.path / "judge_cache",
    )
    engine = SecondRankEngine(dataset)
    summary = judge_run(run, settings, lambda: engine, show_progress=False)
    # One round: a call per distinct checklist (hf decodes under each checklist's schema).
    assert engine.calls >= 1 and summary.judged == 9 and summary.skipped == 1  # the work was done ...
    assert snapshot(run.path) == before  # ... and nothing was written: no records, ledger, cache, manifest
    assert sorted(p.name for p in run.path.iterdir()) == ["generations.jsonl", "manifest.json", "sessions.json"]
    # Told by the launcher (RANK != 0) it is not primary, a rank writes nothing even with nothing to judge.
    summary = judge_run(run, settings, lambda: engine, show_progress=False, primary=False, limit=0)
    assert snapshot(run.path) == before


# ---------------------------------------------------------------- partial runs


def _partial_run(tmp_path: Path, dataset) -> Path:
    """3 sessions selected, 6 of their 15 turns generated and judged, generation still 'running'."""
    run = make_run(tmp_path / "partial", dataset, [1, 2, 3])
    keep = {(1, t) for t in range(1, 6)} | {(2, 1)}
    lines = [
        line
        for line in run.generations.path.read_text().splitlines()
        if tuple(json.loads(line)[k] for k in ("system_id", "turn")) in keep
    ]
    run.generations.path.write_text("\n".join(lines) + "\n")
    run.update_manifest("generate", status="running", model="fake-model")
    sessions = dataset.by_id()
    run.judgments.append(
        JudgmentRecord(
            system_id=s,
            turn=t,
            judge_model="j",
            verdicts={str(c.id): Verdict(raw="是", value="yes", type=c.type) for c in sessions[s].turn(t).constraints},
        )
        for s, t in sorted(keep)
    )
    return run.path


def test_metrics_compare_and_report_refuse_a_partial_run_unless_allowed(tmp_path: Path, dataset, capsys) -> None:
    run = _partial_run(tmp_path, dataset)
    line = one_error_line(*run_cli(["metrics", str(run)], capsys)[::2])
    assert "9 turn(s) were never generated (session 2, turns 2-5; session 3, turns 1-5)" in line
    assert "`generate` is still running" in line and "--allow-partial" in line
    code, out, _ = run_cli(["metrics", str(run), "--allow-partial", "--json", "--resamples", "10"], capsys)
    result = json.loads(out)
    assert code == 0 and result["partial"] is True and result["n_ungenerated_turns"] == 9
    assert result["n_turns"] == 6 and result["unfinished_stages"] == ["generate"]
    code, out, _ = run_cli(["metrics", str(run), "--allow-partial", "--resamples", "10"], capsys)
    assert "PARTIAL: 9 turns not generated, 0 not judged, generate still running" in out
    assert "never generated" in one_error_line(*run_cli(["compare", str(run), str(run)], capsys)[::2])
    assert run_cli(["compare", str(run), str(run), "--allow-partial", "--resamples", "10"], capsys)[0] == 0
    report = ["report", str(run), "--out", str(tmp_path / "report"), "--no-figures", "--resamples", "10"]
    assert "never generated" in one_error_line(*run_cli(report, capsys)[::2])
    code, _, err = run_cli(report + ["--allow-partial"], capsys)
    assert code == 0 and "partial runs" in err


def test_readers_refuse_duplicate_keys_and_name_them(tmp_path: Path, dataset, capsys) -> None:
    run = make_run(tmp_path / "run", dataset, [1])
    lines = run.generations.path.read_bytes().splitlines(keepends=True)
    run.generations.path.write_bytes(b"".join(lines + [lines[1], lines[3]]))
    line = one_error_line(*run_cli(["metrics", str(run.path)], capsys)[::2])
    assert "2 key(s) have more than one record" in line
    assert "session 1, turn 2 on lines 2, 6" in line and "session 1, turn 4 on lines 4, 7" in line
    with pytest.raises(SysbenchError, match="more than one record"):
        run.generations.read()


# ---------------------------------------------------------------- one clear line


@pytest.fixture
def unwritable(tmp_path: Path):
    """Make a folder unwritable even for root (chattr +i), or skip where that is impossible."""
    made: list[Path] = []

    def make(path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o555)
        if os.access(path, os.W_OK) and shutil.which("chattr"):
            subprocess.run(["chattr", "+i", str(path)], capture_output=True)
        made.append(path)
        try:
            (path / ".probe").touch()
        except OSError:
            return path
        (path / ".probe").unlink()
        pytest.skip("cannot make a folder read-only here")

    yield make
    for path in made:
        if shutil.which("chattr"):
            subprocess.run(["chattr", "-i", str(path)], capture_output=True)
        os.chmod(path, 0o755)


def test_judge_into_a_read_only_run_is_refused_before_any_request(tmp_path, dataset, capsys, unwritable) -> None:
    run = make_run(tmp_path / "run", dataset, [1])
    rejudge_out = unwritable(tmp_path / "readonly-out")
    with OpenAIStub(lambda body, n: Reply(text="{}")) as stub:
        common = ["--judge", "openai", "--judge-model", "gpt-4o", "--base-url", stub.base_url]
        line = one_error_line(
            *run_cli(["judge", str(run.path), "--rejudge", "--out", str(rejudge_out), *common], capsys)[::2]
        )
        assert "readonly-out" in line and "not writable" in line
        unwritable(run.path)
        line = one_error_line(*run_cli(["judge", str(run.path), *common], capsys)[::2])
        assert str(run.path) in line and "not writable" in line
        assert stub.request_count == 0


def test_generate_checks_out_before_loading_a_model(tmp_path, sessions_file, capsys, unwritable) -> None:
    # A model path that cannot load: a check made after loading would report the model instead.
    common = [
        "generate",
        "--data",
        str(sessions_file),
        "--engine",
        "hf",
        "--model",
        str(tmp_path / "no-model"),
        "--limit",
        "1",
        "--no-progress",
    ]
    a_file = tmp_path / "out.txt"
    a_file.write_text("not a folder")
    line = one_error_line(*run_cli(common + ["--out", str(a_file)], capsys)[::2])
    assert "out.txt: is a file, not a run directory" in line
    readonly = unwritable(tmp_path / "readonly")
    line = one_error_line(*run_cli(common + ["--out", str(readonly)], capsys)[::2])
    assert "readonly" in line and "not writable" in line
    line = one_error_line(*run_cli(common + ["--out", str(tmp_path / "run"), "--sessions", "1-400000000"], capsys)[::2])
    assert "no session with system_id 501-400000000" in line


def test_huge_session_range_is_never_expanded() -> None:
    ids = parse_session_ids("7,1-400000000,3-4")
    assert 399999999 in ids and 0 not in ids and ids.size() == 400000000
    assert ids.missing_from(set(range(1, 501))) == "501-400000000"
    assert str(ids) == "7,1-400000000,3-4"
    assert parse_session_ids("1,2,5-7,2") == [1, 2, 5, 6, 7]


def test_deeply_nested_json_is_one_clear_line(tmp_path, dataset, capsys) -> None:
    deep = "[" * 200_000 + "]" * 200_000
    data = tmp_path / "deep.json"
    data.write_text(deep)
    line = one_error_line(*run_cli(["data", "validate", str(data)], capsys)[::2])
    assert "nested too deeply" in line
    lines = tmp_path / "refinement_multi.jsonl"  # JSON Lines: the MT-Eval reader
    lines.write_text('{"id": "a", "conv": []}\n' + '{"a": ' * 200_000 + "1" + "}" * 200_000 + "\n")
    assert "line 2: JSON nested too deeply" in one_error_line(*run_cli(["data", "validate", str(lines)], capsys)[::2])
    run = make_run(tmp_path / "run", dataset, [1])
    good = run.generations.path.read_bytes()
    run.generations.path.write_bytes(good + b'{"system_id": 1, "turn": 9, "extra": ' + deep.encode() + b"}\n")
    line = one_error_line(*run_cli(["metrics", str(run.path)], capsys)[::2])
    assert "generations.jsonl: line 6" in line and "nested too deeply" in line
    run.generations.path.write_bytes(good)
    manifest = run.manifest_path.read_text()
    run.manifest_path.write_text(deep)
    assert "manifest.json" in one_error_line(*run_cli(["metrics", str(run.path)], capsys)[::2])
    run.manifest_path.write_text(json.dumps([json.loads(manifest)]))
    line = one_error_line(*run_cli(["metrics", str(run.path)], capsys)[::2])
    assert "manifest.json: expected a JSON object, found an array" in line
    run.manifest_path.write_text(json.dumps({**json.loads(manifest), "stages": {"generate": []}}))
    assert "field 'stages.generate' should be an object" in one_error_line(
        *run_cli(["metrics", str(run.path)], capsys)[::2]
    )


def test_judge_cache_entry_of_the_wrong_type_is_one_clear_line(tmp_path, dataset, capsys) -> None:
    run = make_run(tmp_path / "run", dataset, [1])
    sessions = dataset.by_id()

    def responder(body: dict[str, Any], n: int) -> Reply:
        _, sid, turn = marker(body["messages"][-1]["content"])
        return Reply(text=good_reply(sessions[sid], turn))

    with OpenAIStub(responder) as stub:
        args = ["judge", str(run.path), "--judge", "openai", "--judge-model", "gpt-4o", "--base-url", stub.base_url]
        assert run_cli(args, capsys)[0] == 0
        run.judgments.path.unlink()
        entry = next((run.path / "judge_cache").glob("??/*.json"))
        entry.write_text(json.dumps({"text": 5}))
        line = one_error_line(*run_cli(args, capsys)[::2])
        assert entry.name in line and "field 'text' should be a string, found a number" in line
        entry.write_text(json.dumps(["a list"]))
        assert "should be a JSON object, found an array" in one_error_line(*run_cli(args, capsys)[::2])


def test_rejudge_set_up_interrupted_part_way_resumes(tmp_path, dataset, capsys, monkeypatch) -> None:
    source = make_run(tmp_path / "source", dataset, [1, 2])
    out = tmp_path / "copy"
    from sysbench_gpu.core import rundir as runstore

    real_append = runstore.JsonlStore.append

    def crash(self, records, existing=None):
        records = list(records)
        real_append(self, records[:3])  # part of the copy is written, then the process dies
        raise KeyboardInterrupt

    monkeypatch.setattr(runstore.JsonlStore, "append", crash)
    sessions = dataset.by_id()

    def responder(body: dict[str, Any], n: int) -> Reply:
        _, sid, turn = marker(body["messages"][-1]["content"])
        return Reply(text=good_reply(sessions[sid], turn))

    with OpenAIStub(responder) as stub:
        args = [
            "judge",
            str(source.path),
            "--rejudge",
            "--out",
            str(out),
            "--judge",
            "openai",
            "--judge-model",
            "gpt-4o",
            "--base-url",
            stub.base_url,
        ]
        code, _, err = run_cli(args, capsys)
        assert code == 130 and "interrupted" in err and stub.request_count == 0
        monkeypatch.setattr(runstore.JsonlStore, "append", real_append)
        assert RunDir(out).read_manifest()["rejudged_from"]["setup"] == "started"
        assert len(RunDir(out).generations.read()) == 3
        code, out_text, err = run_cli(args, capsys)
    assert code == 0, err
    assert "judged 10" in out_text
    copy = RunDir(out)
    assert copy.read_manifest()["rejudged_from"]["setup"] == "complete"
    assert {k: r.response for k, r in copy.generations.read().items()} == {
        k: r.response for k, r in source.generations.read().items()
    }
    # Once complete, another choice of sessions into the same copy is still refused.
    line = one_error_line(*run_cli(args + ["--limit", "1"], capsys)[::2])
    assert "other generations" in line


def test_ledger_journal_carries_old_totals_and_counts_before_caching(tmp_path: Path) -> None:
    from sysbench_gpu.judging.ledger import (
        LEDGER,
        LEDGER_JOURNAL,
        JudgeLedger,
        PaidReply,
    )

    (tmp_path / LEDGER).write_text(
        json.dumps(
            {"models": {"gpt-4o": {"requests": 7, "cache_hits": 2, "prompt_tokens": 700, "completion_tokens": 70}}}
        )
    )
    ledger = JudgeLedger.load(tmp_path, "gpt-4o")
    assert (ledger.current().requests, ledger.current().cache_hits) == (7, 2)
    ledger.paid([PaidReply(100, 10, "session 1, turn 1", 0), PaidReply(None, None, "session 1, turn 2", 0)])
    ledger.cache_hits(3)
    ledger.save()
    again = JudgeLedger.load(tmp_path, "gpt-4o")
    assert again.summary()["requests"] == 9 and again.summary()["cache_hits"] == 5
    assert again.summary()["prompt_tokens"] == 800
    assert json.loads((tmp_path / LEDGER).read_text())["models"]["gpt-4o"]["requests"] == 9
    events = [json.loads(line)["event"] for line in (tmp_path / LEDGER_JOURNAL).read_text().splitlines()]
    assert events == ["carried", "paid", "paid", "cache_hit"]
    (tmp_path / LEDGER_JOURNAL).write_text('{"event": "paid", "model": "gpt-4o", "prompt_tokens": "many"}\n')
    with pytest.raises(SysbenchError, match=r"judge_ledger.jsonl: line 1 is not a ledger entry .*prompt_tokens"):
        JudgeLedger.load(tmp_path, "gpt-4o")


def test_import_upstream_takes_its_lock_before_reading_anything(tmp_path: Path) -> None:
    from sysbench_gpu.benchmarks.sysbench.upstream import import_workbook

    out = tmp_path / "runs" / "gpt4o"
    with (
        stage_lock(out, "import-upstream", lock_file=out.parent / ".gpt4o.import.lock"),
        pytest.raises(StageBusy, match=r"another `import-upstream` \(pid \d+ on host"),
    ):
        import_workbook(tmp_path / "missing.xlsx", out)
    assert not out.exists() and not (out.parent / ".gpt4o.import.lock").exists()
