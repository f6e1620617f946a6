"""The judge against a fault-injecting OpenAI-compatible server on loopback."""

from __future__ import annotations

import json
import threading
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from openai_stub import OpenAIStub, Reply
from test_judge_support import good_reply, make_run, marker

from sysbench_gpu import cli
from sysbench_gpu.benchmarks.sysbench.judge_prompt import load_template
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.judging.ledger import LEDGER
from sysbench_gpu.judging.rounds import JudgeSettings
from sysbench_gpu.judging.stage import judge_run

pytest.importorskip("openai")

# Replies that would run code if a parser evaluated them. Each names its own marker file.
# The builtin's name is spelled in two pieces so that grepping for a call of the builtin finds only real calls.
EVAL = "ev" + "al"
EVIL = {
    "evil1": "{{\"评判结果\": __import__('os').system('touch {path}')}}",
    "evil2": '{{"评判理由": "x", "评判结果": {{"1": ' + EVAL + "(\"__import__('os').system('touch {path}')\")}}}}",
    "evil3": "```json\n{{'评判结果': {{1: (lambda: __import__('os').system('touch {path}'))()}}}}\n```",
    "evil4": (
        "```python\nimport os\nos.system('touch {path}')\n```\n"
        '{{"评判结果": {{"1": "是"}}, "x": open(\'{path}\', \'w\')}}'
    ),
}


def _reply(text: str, **options) -> Reply:
    return Reply(text=text, prompt_tokens=1000, completion_tokens=50, **options)


class Scripted:
    """Stub responder: the reply depends on the marker kind of the turn being judged."""

    def __init__(self, dataset, pwned_dir: Path) -> None:
        self.sessions = dataset.by_id()
        self.pwned_dir = pwned_dir
        self.per_turn: Counter = Counter()
        self.temperatures: dict[tuple[int, int], list[float]] = defaultdict(list)
        self.dead_healed = False
        self._lock = threading.Lock()

    def __call__(self, body: dict, number: int) -> Reply:
        prompt = body["messages"][-1]["content"]
        kind, sid, turn = marker(prompt)
        with self._lock:
            self.per_turn[(sid, turn)] += 1
            n = self.per_turn[(sid, turn)]
            self.temperatures[(sid, turn)].append(body.get("temperature"))
        session = self.sessions[sid]
        good = _reply(good_reply(session, turn, "否" if turn == 5 else "是"))
        if kind == "r429" and n == 1:
            return Reply(status=429, headers={"Retry-After": "0"})
        if kind == "err500" and n <= 2:
            return Reply(status=500)
        if kind == "slow" and n == 1:
            return _reply("late", delay_s=1.5)
        if kind == "dead" and not self.dead_healed:
            return Reply(status=500)
        if kind == "notjson_once" and n == 1:
            return _reply("The answer follows the rules, I would say yes.")
        if kind == "wrongkeys":
            return _reply(json.dumps({"评判理由": "r", "评判结果": {"99": "是"}}, ensure_ascii=False))
        if kind == "odd":
            numbers = [c.id for c in session.turn(turn).constraints]
            values = {str(k): ("不适用" if i == 0 else "N/A") for i, k in enumerate(numbers)}
            return _reply(json.dumps({"reasoning": "r", "verdicts": values}, ensure_ascii=False))
        if kind in EVIL:
            return _reply(EVIL[kind].format(path=self.pwned_dir / f"PWNED_{kind}"))
        return good


def _engine(url: str, concurrency: int = 4):
    from sysbench_gpu.engines.openai_engine import OpenAIEngine

    return OpenAIEngine(
        "gpt-4o-mini",
        base_url=url,
        api_key_env="SYSBENCH_TEST_NO_SUCH_KEY",
        concurrency=concurrency,
        max_retries=3,
        timeout=1.0,
        backoff_base_s=0.01,
        backoff_max_s=0.05,
    )


def _settings(run: RunDir, max_retries: int = 4, cache: bool = True, concurrency: int = 4) -> JudgeSettings:
    return JudgeSettings(
        backend="openai",
        model="gpt-4o-mini",
        template=load_template("zh"),
        max_retries=max_retries,
        max_tokens=256,
        cache_dir=run.path / "judge_cache" if cache else None,
        concurrency=concurrency,
    )


FAULTS = {
    (1, 1): "r429",
    (1, 2): "notjson_once",
    (1, 3): "wrongkeys",
    (1, 4): "odd",
    (1, 5): "err500",
    (2, 1): "slow",
    (2, 2): "evil1",
    (2, 3): "evil2",
    (2, 4): "evil3",
    (2, 5): "skipped",
    (3, 1): "evil4",
}


def test_faults_end_to_end_resume_and_cache(tmp_path, dataset):
    run = make_run(tmp_path / "run", dataset, [1, 2, 3], lambda s, t: FAULTS.get((s, t), "good"))
    pwned = tmp_path / "pwned"
    pwned.mkdir()
    script = Scripted(dataset, pwned)
    with OpenAIStub(script) as stub:
        summary = judge_run(run, _settings(run), lambda: _engine(stub.base_url), show_progress=False)
        sent = stub.request_count

        judgments = run.judgments.read()
        assert len(judgments) == 15  # every turn has exactly one record
        status = {k: r.parse_status for k, r in judgments.items()}
        unparsed = {(1, 3), (2, 2), (2, 3), (2, 4), (3, 1)}
        assert {k for k, s in status.items() if s == "unparsed"} == unparsed
        assert status[(2, 5)] == "skipped" and judgments[(2, 5)].attempts == 0
        assert script.per_turn[(2, 5)] == 0  # a turn without a response is never sent
        assert sum(s == "ok" for s in status.values()) == 9
        assert (summary.judged, summary.unparsed, summary.skipped) == (9, 5, 1)

        # Nothing a reply said was executed.
        assert list(pwned.iterdir()) == []

        # Unparsed: empty verdicts, the last reply, every attempt, on upstream's schedule.
        bad = judgments[(1, 3)]
        assert bad.verdicts == {} and bad.attempts == 4 and "99" in bad.raw_reply
        assert len(bad.extra["failures"]) == 4 and "differ from the checklist" in bad.extra["failures"][0]
        assert script.temperatures[(1, 3)] == [0.0, 0.0, 0.5, 0.5]
        assert judgments[(2, 2)].raw_reply.startswith('{"评判结果": __import__')

        # Transient faults were retried by the engine; parse failures by the judge.
        assert judgments[(1, 1)].attempts == 1 and script.per_turn[(1, 1)] == 2
        assert judgments[(1, 5)].attempts == 1 and script.per_turn[(1, 5)] == 3
        assert judgments[(2, 1)].attempts == 1 and script.per_turn[(2, 1)] == 2
        assert judgments[(1, 2)].attempts == 2 and "no JSON object" in judgments[(1, 2)].extra["failures"][0]

        # Not-applicable values are kept raw and are neither yes nor no.
        odd = judgments[(1, 4)]
        assert odd.parse_status == "ok"
        assert {v.value for v in odd.verdicts.values()} == {"other"}
        assert {v.raw for v in odd.verdicts.values()} <= {"不适用", "N/A"}
        # Turn 5 replies say 否: a failing turn, judged as such.
        assert judgments[(3, 5)].passed is False and judgments[(3, 4)].passed is True
        assert all(r.template_hash == load_template("zh").sha256 for r in judgments.values())

        # The ledger counts completions (HTTP failures are the engine's retries), tokens and cost.
        ledger = json.loads((run.path / LEDGER).read_text())["models"]["gpt-4o-mini"]
        assert ledger["requests"] == sent - 4  # one 429, two 500s, one timeout
        assert ledger["prompt_tokens"] == 1000 * ledger["requests"]
        assert ledger["estimated_cost_usd"] == pytest.approx(
            (ledger["prompt_tokens"] * 0.15 + ledger["completion_tokens"] * 0.60) / 1e6
        )
        manifest = run.read_manifest()["stages"]["judge"]
        assert manifest["template"]["sha256"] == load_template("zh").sha256
        assert manifest["judgments_by_status"] == {"ok": 9, "unparsed": 5, "skipped": 1}

        # Resume: nothing pending, nothing sent, with and without the cache.
        judge_run(run, _settings(run), lambda: _engine(stub.base_url), show_progress=False)
        judge_run(run, _settings(run, cache=False), lambda: _engine(stub.base_url), show_progress=False)
        assert stub.request_count == sent

        # Lost judgments are rebuilt from the cache without a single request.
        before = {k: (r.parse_status, r.verdicts, r.attempts) for k, r in judgments.items()}
        run.judgments.path.unlink()
        replay = judge_run(run, _settings(run), lambda: _engine(stub.base_url), show_progress=False)
        assert stub.request_count == sent and replay.requests == 0 and replay.cache_hits > 0
        after = {k: (r.parse_status, r.verdicts, r.attempts) for k, r in run.judgments.read().items()}
        assert after == before

    # The metrics stage counts unparsed and skipped turns and refuses each unless told to exclude it.
    from sysbench_gpu.reporting import metrics

    with pytest.raises(SysbenchError, match="unparsed"):
        metrics.run_metrics(run.path, exclude_skipped=True)
    with pytest.raises(SysbenchError, match="skipped at generation"):
        metrics.run_metrics(run.path, exclude_unparsed=True)
    result = metrics.run_metrics(run.path, exclude_unparsed=True, exclude_skipped=True, resamples=10)
    assert result["n_unparsed_turns"] == 5 and result["n_skipped_turns"] == 1
    assert result["n_turns"] == 9


def test_interrupted_run_resumes_without_asking_twice(tmp_path, dataset):
    kinds = {(1, 2): "notjson_once", (2, 3): "wrongkeys"}
    whole = make_run(tmp_path / "whole", dataset, [1, 2], lambda s, t: kinds.get((s, t), "good"))
    parts = make_run(tmp_path / "parts", dataset, [1, 2], lambda s, t: kinds.get((s, t), "good"))
    with OpenAIStub(Scripted(dataset, tmp_path)) as stub:
        judge_run(whole, _settings(whole), lambda: _engine(stub.base_url), show_progress=False)
        uninterrupted = stub.request_count
    with OpenAIStub(Scripted(dataset, tmp_path)) as stub:
        first = judge_run(parts, _settings(parts), lambda: _engine(stub.base_url), limit=1, show_progress=False)
        assert first.judged == 5 and len(parts.judgments.read()) == 5
        second = judge_run(parts, _settings(parts), lambda: _engine(stub.base_url), show_progress=False)
        assert second.already_judged == 5
        assert stub.request_count == uninterrupted
        prompts = Counter((r["messages"][0]["content"], r.get("temperature")) for r in stub.requests)
    # Only the retries of a failing turn repeat a prompt (same text, same temperature, next attempt).
    repeated = {marker(p)[1:] for (p, _), n in prompts.items() if n > 1}
    assert repeated <= {(1, 2), (2, 3)}
    assert {k: r.parse_status for k, r in parts.judgments.read().items()} == {
        k: r.parse_status for k, r in whole.judgments.read().items()
    }


def test_persistent_api_error_stops_cleanly_and_resumes(tmp_path, dataset):
    run = make_run(tmp_path / "run", dataset, [1], lambda s, t: "dead" if t == 3 else "good")
    script = Scripted(dataset, tmp_path)
    with OpenAIStub(script) as stub:
        with pytest.raises(SysbenchError, match=r"session 1, turn 3"):
            judge_run(run, _settings(run, concurrency=1), lambda: _engine(stub.base_url, 1), show_progress=False)
        assert script.per_turn[(1, 3)] == 4  # the engine's bounded retries, then a clear failure
        done = run.judgments.read()
        assert set(done) == {(1, 1), (1, 2)} and all(r.parse_status == "ok" for r in done.values())
        script.dead_healed = True
        before = stub.request_count
        summary = judge_run(run, _settings(run, concurrency=1), lambda: _engine(stub.base_url, 1), show_progress=False)
        assert summary.judged == 3 and stub.request_count - before == 3
        assert script.per_turn[(1, 1)] == 1
    assert len(run.judgments.read()) == 5


def test_cli_dry_run_then_judge(tmp_path, dataset, capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    run = make_run(tmp_path / "run", dataset, [4, 5])
    with OpenAIStub(Scripted(dataset, tmp_path)) as stub:
        common = ["judge", str(run.path), "--judge", "openai", "--judge-model", "gpt-4o", "--base-url", stub.base_url]
        assert cli.main(common + ["--dry-run", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert stub.request_count == 0
        assert report["requests"] == 10 and report["estimated_prompt_tokens"] > 1000
        assert report["estimated_cost_usd"] > 0
        assert not run.judgments.path.exists()

        assert cli.main(common + ["--template", "en", "--concurrency", "3"]) == 0
        out = capsys.readouterr().out
        assert "judged 10, unparsed 0" in out and stub.request_count == 10
        assert "# Current round" in stub.requests[0]["messages"][0]["content"]
        assert cli.main(common + ["--template", "zh"]) == 2  # another template would mix judges
        assert "--rejudge" in capsys.readouterr().err
        assert cli.main(common + ["--template", "en", "--dry-run"]) == 0
        assert "turns to judge      0" in capsys.readouterr().out


def test_cli_custom_template_file(tmp_path, dataset, capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    run = make_run(tmp_path / "run", dataset, [6])
    good = tmp_path / "mine.txt"
    good.write_text(
        "Sys: {system_prompt}\n{history}\nQ: {user}\nA: {answer}\n{checklist}\n"
        'JSON {{"评判结果": {verdict_example}}} for {checklist_numbers}\n'
    )
    bad = tmp_path / "bad.txt"
    bad.write_text("{answer} {checklist} {answer.__class__}")
    unknown = tmp_path / "unknown.txt"
    unknown.write_text("{answer} {checklist} {secret}")
    with OpenAIStub(Scripted(dataset, tmp_path)) as stub:
        common = ["judge", str(run.path), "--judge", "openai", "--judge-model", "my-judge", "--base-url", stub.base_url]
        assert cli.main(common + ["--template", str(bad)]) == 2
        assert "is not a plain name" in capsys.readouterr().err
        assert cli.main(common + ["--template", str(unknown)]) == 2
        assert "unknown placeholder(s) {secret}" in capsys.readouterr().err
        assert stub.request_count == 0
        assert cli.main(common + ["--template", str(good)]) == 0
        assert stub.request_count == 5
        first = stub.requests[0]["messages"][0]["content"]
        assert first.startswith("Sys: ") and 'JSON {"评判结果": {"1": "是/否"' in first
    ledger = json.loads((run.path / LEDGER).read_text())["models"]["my-judge"]
    assert ledger["estimated_cost_usd"] is None and ledger["requests"] == 5  # unknown model: cost unknown


LIVE = {
    1: [["不是", "不", "NO.", "No, it does not", "未满足"]],  # every negative form is no: the turn fails
    2: [["不适用", "无法判断"]],  # the not-applicable family is other: the turn passes
    3: [["是", "maybe", "是"], ["是", "是", "是"]],  # off-vocabulary: retried, then a valid reply
    4: [["是", "`print('x')`", "部分"]],  # off-vocabulary every time: unparsed
    5: [["是的", "Yes - fine", "满足", "yes", "是"]],
}


def test_live_judge_vocabulary_never_passes_an_off_vocabulary_verdict(tmp_path, dataset):
    run = make_run(tmp_path / "run", dataset, [2])
    asked: Counter = Counter()

    def responder(body: dict, n: int) -> Reply:
        _, sid, turn = marker(body["messages"][-1]["content"])
        asked[turn] += 1
        script = LIVE[turn]
        values = script[min(asked[turn], len(script)) - 1]
        verdicts = {str(i): value for i, value in enumerate(values, start=1)}
        return _reply(json.dumps({"评判理由": "r", "评判结果": verdicts}, ensure_ascii=False))

    with OpenAIStub(responder) as stub:
        summary = judge_run(run, _settings(run, max_retries=3), lambda: _engine(stub.base_url), show_progress=False)
    records = run.judgments.read()
    assert (summary.judged, summary.unparsed) == (4, 1)
    assert {v.value for v in records[(2, 1)].verdicts.values()} == {"no"} and records[(2, 1)].passed is False
    assert {v.value for v in records[(2, 2)].verdicts.values()} == {"other"} and records[(2, 2)].passed is True
    assert records[(2, 3)].attempts == 2 and 'verdict 2 is "maybe"' in records[(2, 3)].extra["failures"][0]
    assert records[(2, 4)].parse_status == "unparsed" and records[(2, 4)].attempts == 3 and asked[4] == 3
    assert {v.value for v in records[(2, 5)].verdicts.values()} == {"yes"}
    for record in records.values():
        if record.parse_status == "ok":
            assert all(v.raw not in ("maybe", "`print('x')`", "部分") for v in record.verdicts.values())
