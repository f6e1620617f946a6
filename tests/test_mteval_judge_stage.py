"""The judge stage on MT-Eval runs: rule scoring without a judge model, the 1-10 judge through the SysBench
judge's machinery (stub server, batched local engine), typed and validated scores in judgments.jsonl."""

from __future__ import annotations

import json
import threading
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from mteval_runs import make_mteval_run, marked
from openai_stub import OpenAIStub, Reply
from test_judge_support import make_run, marker

from sysbench_gpu import cli
from sysbench_gpu.benchmarks.mteval.judge_prompt import (
    load_score_template,
    score_schema,
)
from sysbench_gpu.benchmarks.mteval.official_prompts import load_official_prompts
from sysbench_gpu.benchmarks.mteval.tasks import SCORERS
from sysbench_gpu.benchmarks.registry import load_run_sessions
from sysbench_gpu.benchmarks.sysbench.judge_prompt import load_template
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.records import SCORERS as STORED_SCORERS
from sysbench_gpu.core.records import JudgmentRecord
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.engines.base import Completion
from sysbench_gpu.judging.ledger import LEDGER
from sysbench_gpu.judging.rounds import JudgeSettings
from sysbench_gpu.judging.stage import judge_run

GLOBAL_INST = "recollection_multi_global-inst.jsonl"
CLS = "recollection_multi_cls.jsonl"
FOLLOW_UP = "follow-up_multi.jsonl"


def _global_inst_reply(session, turn: int) -> str:
    """Hand-written replies: dialogue 1 (start with 'o') follows on turns 2-4, dialogue 21 (no commas) on
    turns 2-7, dialogue 17 (all capitals) on every turn: 3 + 6 + 10 = 19 of 30 turns follow."""
    sid = session.system_id
    if sid == 1:
        return "Of course: laws deserve thought." if turn <= 4 else "Sure. Laws deserve thought."
    if sid == 21:
        return "Sports bring people together" if turn <= 7 else "Sports, clearly, bring people together."
    if sid == 17:
        return "BLACK HOLES ARE NOT GATEWAYS."
    raise AssertionError(sid)


def test_scorers_are_one_list():
    assert STORED_SCORERS == SCORERS


def test_global_inst_is_scored_without_a_judge(tmp_path, mteval_data_dir, capsys):
    run = make_mteval_run(tmp_path / "gi", mteval_data_dir / GLOBAL_INST, [1, 17, 21], _global_inst_reply)
    assert cli.main(["judge", str(run.path)]) == 0
    out = capsys.readouterr().out
    assert "judged 0, unparsed 0, skipped 0, already judged 0, not generated 0; scored by rule 30; requests 0" in out
    records = run.judgments.read()
    assert len(records) == 30 and all(r.parse_status == "ok" and r.scorer == "ifeval" for r in records.values())
    assert sum(r.score == 10.0 for r in records.values()) == 19
    assert sum(r.score == 0.0 for r in records.values()) == 11
    first = records[(1, 2)]
    assert (
        first.judge_model is None
        and first.attempts == 0
        and first.extra == {"rule": "startend:start_char", "rules": "official"}
    )
    assert "followed" in first.reasoning and "not followed" in records[(1, 5)].reasoning
    assert not (run.path / "judge_cache").exists() and not (run.path / LEDGER).exists()
    section = run.read_manifest()["stages"]["judge"]
    assert section["backend"] == "rules" and section["scorers"] == ["ifeval"] and section["status"] == "complete"
    # The context turn (turn 1, the instruction) is never scored; a second call has nothing to do.
    assert (1, 1) not in records
    assert cli.main(["judge", str(run.path)]) == 0
    assert "already judged 30" in capsys.readouterr().out


def test_cls_labels_are_matched_without_a_judge(tmp_path, mteval_data_dir):
    # Dialogue 1's answered turns have the labels medicine, technology, economics, sports, ...
    def reply(session, turn):
        gold = session.turn(turn).reference
        return f"The category is: {gold.upper()}." if turn % 2 == 0 else "I cannot tell."

    run = make_mteval_run(tmp_path / "cls", mteval_data_dir / CLS, [1], reply)
    summary = judge_run(run, None, None, show_progress=False)
    records = run.judgments.read()
    answered = sorted(records)
    assert summary.scored_by_rule == len(answered) == 10
    assert {r.scorer for r in records.values()} == {"cls"}
    assert [records[k].score for k in answered] == [10.0 if t % 2 == 0 else 0.0 for _, t in answered]
    assert answered[0] == (1, 2)  # turn 1 gives the instruction: a context turn
    assert records[(1, 2)].reasoning == "gold label 'medicine' found in the response"
    assert records[(1, 3)].reasoning == "gold label 'technology' not found in the response"


def test_a_judge_task_without_judge_options_is_one_line(tmp_path, mteval_data_dir, dataset, capsys):
    run = make_mteval_run(tmp_path / "fu", mteval_data_dir / FOLLOW_UP, [1, 2], marked())
    assert cli.main(["judge", str(run.path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "task follow-up is scored by an LLM judge" in err[0] and "--judge" in err[0]
    assert "6 turn(s)" in err[0]
    assert not run.judgments.path.exists() and "judge" not in run.read_manifest()["stages"]
    assert cli.main(["judge", str(run.path), "--judge", "openai"]) == 2
    assert "both --judge" in capsys.readouterr().err
    assert cli.main(["judge", str(run.path), "--template", "en", "--judge", "openai", "--judge-model", "m"]) == 2
    assert "--mteval-template" in capsys.readouterr().err
    sysbench = make_run(tmp_path / "sb", dataset, [1])
    assert cli.main(["judge", str(sysbench.path)]) == 2
    assert "judge needs --judge" in capsys.readouterr().err


# ---------------------------------------------------------------- the 1-10 judge against the loopback stub


def _score(value, rationale: str = "fits the request") -> str:
    return json.dumps({"rationale": rationale, "score": value})


class ScoreScript:
    """Replies by the marker kind of the reply under evaluation."""

    def __init__(self) -> None:
        self.per_turn: Counter = Counter()
        self.temperatures: dict[tuple[int, int], list[float]] = defaultdict(list)
        self._lock = threading.Lock()

    def __call__(self, body: dict, number: int) -> Reply:
        kind, sid, turn = marker(body["messages"][-1]["content"])
        with self._lock:
            self.per_turn[(sid, turn)] += 1
            n = self.per_turn[(sid, turn)]
            self.temperatures[(sid, turn)].append(body.get("temperature"))
        if kind == "range_once" and n == 1:
            text = _score(11)
        elif kind == "range":
            text = _score(0)
        elif kind == "prose":
            text = "A fine reply; I would give it an eight."
        elif kind == "float_once" and n == 1:
            text = _score(7.5)
        elif kind == "float_once":
            text = "```json\n" + _score(6) + "\n```"
        elif kind == "range_once":
            text = _score(7)
        else:
            text = _score(8)
        return Reply(text=text, prompt_tokens=700, completion_tokens=40)


FAULTS = {(1, 4): "range_once", (1, 5): "range", (2, 3): "prose", (2, 4): "float_once", (2, 5): None}


def _fault_reply(session, turn):
    kind = FAULTS.get((session.system_id, turn), "good")
    return None if kind is None else f"ANSWER {kind} s{session.system_id} t{turn}. Two sentences here."


def _engine(url: str, concurrency: int = 3):
    from sysbench_gpu.engines.openai_engine import OpenAIEngine

    return OpenAIEngine(
        "gpt-4o-mini",
        base_url=url,
        api_key_env="SYSBENCH_TEST_NO_SUCH_KEY",
        concurrency=concurrency,
        max_retries=2,
        timeout=5.0,
        backoff_base_s=0.01,
        backoff_max_s=0.05,
    )


def _settings(run: RunDir, max_retries: int = 4, cache: bool = True, backend: str = "openai") -> JudgeSettings:
    return JudgeSettings(
        backend=backend,
        model="gpt-4o-mini" if backend == "openai" else "fake-judge",
        template=load_template("zh"),
        max_retries=max_retries,
        max_tokens=256,
        max_reasoning_chars=300,
        cache_dir=run.path / "judge_cache" if cache else None,
        concurrency=3,
    )


def test_one_to_ten_judge_retries_records_unparsed_resumes_and_counts_once(tmp_path, mteval_data_dir):
    pytest.importorskip("openai")
    run = make_mteval_run(tmp_path / "fu", mteval_data_dir / FOLLOW_UP, [1, 2], _fault_reply)
    script = ScoreScript()
    with OpenAIStub(script) as stub:
        summary = judge_run(run, _settings(run), lambda: _engine(stub.base_url), show_progress=False)
        sent = stub.request_count
        records = run.judgments.read()
        assert len(records) == 6 and (summary.judged, summary.unparsed, summary.skipped) == (3, 2, 1)
        # A valid reply: a typed score and the rationale; scorer judge, the follow-up template's hash.
        good = records[(1, 3)]
        assert good.score == 8.0 and good.scorer == "judge" and good.reasoning == "fits the request"
        assert good.verdicts == {} and good.template_hash == load_official_prompts()["follow-up"].sha256
        # Out of range once: retried, then the valid score; never stored as 11.
        assert records[(1, 4)].score == 7.0 and records[(1, 4)].attempts == 2
        assert "score 11 is outside 1..10" in records[(1, 4)].extra["failures"][0]
        # Out of range every time: unparsed after every attempt, no score, upstream's temperature schedule.
        bad = records[(1, 5)]
        assert bad.parse_status == "unparsed" and bad.score is None and bad.scorer == "judge" and bad.attempts == 4
        assert bad.raw_reply == _score(0) and len(bad.extra["failures"]) == 4
        assert script.temperatures[(1, 5)] == [0.0, 0.0, 0.5, 0.5]
        prose = records[(2, 3)]
        assert prose.parse_status == "unparsed" and "no JSON object" in prose.extra["failures"][0]
        assert records[(2, 4)].score == 6.0 and "is not an integer" in records[(2, 4)].extra["failures"][0]
        assert records[(2, 5)].parse_status == "skipped" and script.per_turn[(2, 5)] == 0
        # Every score on disk is in range and typed.
        assert all(r.score is None or 1 <= r.score <= 10 for r in records.values())
        assert all(isinstance(r.score, float) for r in records.values() if r.score is not None)

        # The ledger counts each paid reply once: 1 + 2 + 4 + 4 + 2 = 13 requests.
        ledger = json.loads((run.path / LEDGER).read_text())["models"]["gpt-4o-mini"]
        assert sent == 13 and ledger["requests"] == sent and ledger["prompt_tokens"] == 700 * sent
        journal = [json.loads(line) for line in (run.path / "judge_ledger.jsonl").read_text().splitlines()]
        assert sum(e["event"] == "paid" for e in journal) == sent

        # Resume: nothing pending, nothing sent.
        again = judge_run(run, _settings(run), lambda: _engine(stub.base_url), show_progress=False)
        assert again.already_judged == 6 and stub.request_count == sent
        # Lost judgments come back from the cache: no request, counted as cache hits, not paid twice.
        run.judgments.path.unlink()
        replay = judge_run(run, _settings(run), lambda: _engine(stub.base_url), show_progress=False)
        assert stub.request_count == sent and replay.requests == 0 and replay.cache_hits == 13
        assert {k: (r.parse_status, r.score) for k, r in run.judgments.read().items()} == {
            k: (r.parse_status, r.score) for k, r in records.items()
        }
        ledger = json.loads((run.path / LEDGER).read_text())["models"]["gpt-4o-mini"]
        assert ledger["requests"] == sent and ledger["cache_hits"] == 13

        # --retry-unparsed asks the two unparsed turns anew (not from the cache).
        before = stub.request_count
        retried = judge_run(
            run, _settings(run), lambda: _engine(stub.base_url), show_progress=False, retry_unparsed=True
        )
        assert retried.retried_unparsed == 2 and stub.request_count - before == 8
    section = run.read_manifest()["stages"]["judge"]
    assert section["score_templates"]["follow-up"]["sha256"] == load_official_prompts()["follow-up"].sha256
    assert "template" not in section and section["scorers"] == ["judge"]
    assert (section["judge_prompts"], section["rules"]) == ("official", "official")


def test_score_only_replies_are_scores_and_the_sent_prompt_quotes_documents_jsonl(tmp_path, mteval_data_dir):
    """Expansion dialogue 4 of expansion_single quotes article 4, whose copy in the dialogue differs from
    documents.jsonl; the judge answers with the score alone, as the authors' parser allows."""
    pytest.importorskip("openai")
    run = make_mteval_run(tmp_path / "ex", mteval_data_dir / "expansion_single.jsonl", [24], marked())
    with OpenAIStub(lambda body, n: Reply(text='{"Score": 9}')) as stub:
        summary = judge_run(run, _settings(run), lambda: _engine(stub.base_url), show_progress=False)
        (prompt,) = [body["messages"][-1]["content"] for body in stub.requests]
    (record,) = run.judgments.read().values()
    assert summary.judged == 1 and record.parse_status == "ok" and record.score == 9.0 and record.reasoning is None
    article = load_official_prompts()["expansion"].documents[3]
    assert article in prompt and "it’s straight out of a science fiction novel" in prompt
    section = run.read_manifest()["stages"]["judge"]
    assert section["documents"]["name"] == "official:documents.jsonl" and len(section["documents"]["sha256"]) == 64


def test_cli_judges_and_refuses_a_second_judge(tmp_path, mteval_data_dir, capsys, monkeypatch):
    pytest.importorskip("openai")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    run = make_mteval_run(tmp_path / "fu", mteval_data_dir / FOLLOW_UP, [3], marked())
    with OpenAIStub(ScoreScript()) as stub:
        common = ["judge", str(run.path), "--judge", "openai", "--judge-model", "gpt-4o", "--base-url", stub.base_url]
        common += ["--judge-prompts", "ours"]
        assert cli.main(common + ["--dry-run", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["requests"] == 3 and report["turns_scored_by_rule"] == 0 and stub.request_count == 0
        assert cli.main(common) == 0
        assert "judged 3, unparsed 0" in capsys.readouterr().out and stub.request_count == 3
        prompt = stub.requests[0]["messages"][0]["content"]
        assert "Words in the reply: 4" in prompt and "Sentences in the reply: 1" in prompt
        other = ["judge", str(run.path), "--judge", "openai", "--judge-model", "gpt-4.1", "--base-url", stub.base_url]
        other += ["--judge-prompts", "ours"]
        assert cli.main(other) == 2  # another judge would mix scores
        assert "--rejudge" in capsys.readouterr().err
        out = tmp_path / "rejudged"
        assert cli.main(other + ["--rejudge", "--out", str(out)]) == 0
        capsys.readouterr()
    copy = RunDir(out)
    assert [s.system_id for s in load_run_sessions(copy)] == [3] and load_run_sessions(copy)[0].task == "follow-up"
    assert (out / "sessions.json").read_text().startswith("{")  # MT-Eval JSON Lines, not a SysBench array
    assert {r.judge_model for r in copy.judgments.read().values()} == {"gpt-4.1"}


def test_custom_template_file(tmp_path, mteval_data_dir, capsys, monkeypatch):
    pytest.importorskip("openai")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    run = make_mteval_run(tmp_path / "fu", mteval_data_dir / FOLLOW_UP, [4], marked())
    mine = tmp_path / "mine.txt"
    mine.write_text('CONV {conversation}\nREPLY {response} ({num_words} words)\nJSON {{"rationale": "..", "score": 1}}')
    with OpenAIStub(ScoreScript()) as stub:
        base = ["judge", str(run.path), "--judge", "openai", "--judge-model", "m", "--base-url", stub.base_url]
        assert cli.main(base + ["--mteval-template", "follow-up=" + str(mine)]) == 2  # official prompts by default
        assert "pass --judge-prompts ours" in capsys.readouterr().err
        base += ["--judge-prompts", "ours"]
        assert cli.main(base + ["--mteval-template", "sideways=" + str(mine)]) == 2
        assert "unknown kind 'sideways'" in capsys.readouterr().err
        assert cli.main(base + ["--mteval-template", "follow-up=" + str(mine)]) == 0
        assert stub.requests[0]["messages"][0]["content"].startswith("CONV ")
    assert {r.template_hash for r in run.judgments.read().values()} == {load_score_template("follow-up", mine).sha256}


# ---------------------------------------------------------------- batched local judges


class FakeScoreEngine:
    name = "fake"
    is_primary = True

    def __init__(self) -> None:
        self.calls: list[tuple[int, object]] = []

    def chat(self, conversations, sampling):
        self.calls.append((len(conversations), sampling))
        out = []
        for conversation in conversations:
            kind, _, _ = marker(conversation[-1]["content"])
            first = len(self.calls) == 1
            text = _score(12) if kind == "range_once" and first else _score(5)
            out.append(Completion(text, 500, 30, finish_reason="stop"))
        return out

    def count_prompt_tokens(self, conversation):
        return 500

    def context_length(self):
        return 8192

    def describe(self):
        return {"engine": "fake"}

    def close(self):
        pass


def test_vllm_judge_uses_the_integer_score_schema_in_one_call_per_round(tmp_path, mteval_data_dir):
    kinds = {(5, 4): "range_once"}
    run = make_mteval_run(
        tmp_path / "fu",
        mteval_data_dir / FOLLOW_UP,
        [5, 6],
        lambda s, t: f"ANSWER {kinds.get((s.system_id, t), 'good')} s{s.system_id} t{t}",
    )
    engine = FakeScoreEngine()
    summary = judge_run(run, _settings(run, backend="vllm"), lambda: engine, show_progress=False)
    assert [n for n, _ in engine.calls] == [6, 1]
    for _, sampling in engine.calls:
        assert sampling.json_schema == score_schema(300)
        assert sampling.json_schema["properties"]["score"]["enum"] == list(range(1, 11))
    records = run.judgments.read()
    assert summary.judged == 6 and {r.score for r in records.values()} == {5.0}
    assert records[(5, 4)].attempts == 2


# ---------------------------------------------------------------- secrets


def test_a_key_echoed_by_the_server_lands_in_no_file(tmp_path, mteval_data_dir):
    pytest.importorskip("openai")
    from test_secrets import KEY, _judge_args, files_holding, run_cli

    run = make_mteval_run(tmp_path / "fu", mteval_data_dir / FOLLOW_UP, [7], marked())
    echo = "Incorrect API key provided: {authorization}"
    with OpenAIStub(lambda body, n: Reply(status=503, message=echo)) as stub:
        code, stdout, stderr = run_cli(*_judge_args(run.path, stub.base_url))
    assert code == 2 and KEY not in stdout + stderr and "[REDACTED]" in stderr
    with OpenAIStub(lambda body, n: Reply(text=_score(9, "checked with {authorization}"))) as stub:
        code, stdout, stderr = run_cli(*_judge_args(run.path, stub.base_url))
    assert code == 0, stderr
    records = run.judgments.read()
    assert all(r.score == 9.0 and "Bearer [REDACTED]" in r.reasoning for r in records.values())
    assert list((run.path / "judge_cache").rglob("*.json"))
    assert KEY not in stdout + stderr and files_holding(run.path, KEY) == []


# ---------------------------------------------------------------- the score field on disk


def _scored(turn: int = 2, **fields) -> JudgmentRecord:
    base = dict(system_id=1, turn=turn, verdicts={}, score=10.0, scorer="cls", attempts=0)
    return JudgmentRecord(**{**base, **fields})


def test_sysbench_records_keep_their_format(tmp_path):
    run = RunDir(tmp_path)
    run.judgments.append([JudgmentRecord(system_id=1, turn=1, verdicts={}, parse_status="unparsed")])
    line = json.loads(run.judgments.path.read_text())
    assert "score" not in line and "scorer" not in line
    run.judgments.append([_scored(), _scored(turn=3, score=7.0, scorer="judge", judge_model="j")])
    back = run.judgments.read()
    assert back[(1, 2)] == _scored() and back[(1, 3)].score == 7.0


@pytest.mark.parametrize(
    "change,message",
    [
        ({"score": 11}, "field 'score' is 11, expected a number from 0 to 10"),
        ({"score": -0.5}, "field 'score' is -0.5, expected a number from 0 to 10"),
        ({"score": "8"}, "field 'score' should be a number from 0 to 10 or null, found a string"),
        ({"score": True}, "field 'score' should be a number from 0 to 10 or null, found a boolean"),
        ({"scorer": "vibes"}, "field 'scorer' is 'vibes', expected one of judge, cls, ifeval or null"),
        ({"scorer": None}, "field 'scorer' is missing: a record with a score names its scorer"),
        (
            {"parse_status": "unparsed"},
            "field 'score' is 10 but parse_status is 'unparsed': only an ok record has a score",
        ),
        ({"score": None}, "field 'score' is missing but parse_status is 'ok' and scorer is 'cls'"),
    ],
)
def test_scores_are_validated_on_read(tmp_path, change, message):
    run = RunDir(tmp_path)
    run.judgments.append([_scored(turn=2), _scored(turn=3)])
    lines = run.judgments.path.read_text().splitlines()
    lines[1] = json.dumps({**json.loads(lines[1]), **change})
    run.judgments.path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SysbenchError) as caught:
        run.judgments.read()
    assert str(caught.value) == f"{run.judgments.path}: line 2 (session 1, turn 3), {message}"


def test_nan_score_is_refused(tmp_path):
    run = RunDir(tmp_path)
    run.judgments.path.parent.mkdir(parents=True, exist_ok=True)
    run.judgments.path.write_text('{"system_id":1,"turn":2,"verdicts":{},"score":NaN,"scorer":"judge"}\n')
    with pytest.raises(SysbenchError, match=r"line 1 \(session 1, turn 2\), field 'score' is nan"):
        run.judgments.read()


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_cpu_score_schema_gives_integer_scores(tmp_path, mteval_data_dir):
    """A real vLLM judge under the score schema: every reply is a JSON integer score from 1 to 10 (no unparsed)."""
    import importlib.util
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed")
    run = make_mteval_run(tmp_path / "fu", mteval_data_dir / FOLLOW_UP, [1], marked())
    command = [
        sys.executable, "-m", "sysbench_gpu", "judge", str(run.path), "--judge", "vllm", "--judge-model", "smollm2",
        "--max-tokens", "160", "--max-reasoning-chars", "80", "--max-retries", "2",
        "--engine-option", "gpu_memory_utilization=0.3", "--engine-option", "max_model_len=4096",
        "--engine-option", "enforce_eager=true",
    ]  # fmt: skip
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    done = subprocess.run(
        command, cwd=Path(__file__).resolve().parent.parent, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = run.judgments.read()
    assert len(records) == 3 and all(r.parse_status == "ok" and r.attempts == 1 for r in records.values())
    assert all(r.score in {float(k) for k in range(1, 11)} for r in records.values())
