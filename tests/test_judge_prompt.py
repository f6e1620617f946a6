"""Judge prompt templates: structure, safe substitution, hashing, schema, history."""

from __future__ import annotations

import pytest

from sysbench_gpu.benchmarks.judge_text import HistoryMessage, substitute, template_hash
from sysbench_gpu.benchmarks.sysbench.judge_plan import build_history, plan_judging
from sysbench_gpu.benchmarks.sysbench.judge_prompt import load_template, render_prompt, verdict_schema
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.records import GenerationRecord
from sysbench_gpu.core.sessions import Constraint, Session, Turn
from sysbench_gpu.judging.cache import CachedReply, JudgeCache, cache_key
from sysbench_gpu.judging.rounds import temperature_for


def _session() -> Session:
    c = (Constraint(1, "只谈{天气}", "content", "内容约束"), Constraint(2, "用表格", "format", "格式约束"))
    turns = (
        Turn(1, "第一问 {answer}", "参考一", "aligned", c[:1]),
        Turn(2, "第二问", None, "misaligned", c),
    )
    return Session(7, "系统 {user} {{x}}", turns, True, "d", "s")


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_builtin_templates_follow_the_paper_structure(lang):
    template = load_template(lang)
    session = _session()
    history = [HistoryMessage("user", "第一问 {answer}"), HistoryMessage("assistant", "回答一")]
    prompt = render_prompt(template, session, 2, history, "回答二 {checklist}")
    order = [
        prompt.index("<system prompt>\n系统 {user} {{x}}\n</system prompt>"),  # substituted text is not rescanned
        prompt.index("<role: user>\n<content>\n第一问 {answer}\n</content>"),
        prompt.index("<role: assistant>\n<content>\n回答一\n</content>"),
        prompt.index("<content>\n第二问\n</content>"),
        prompt.index("回答二 {checklist}"),
    ]
    assert order == sorted(order)
    if lang == "zh":
        assert "1. 只谈{天气} | 内容约束\n2. 用表格 | 格式约束" in prompt
        assert '"评判结果": {"1": "是/否", "2": "是/否"}' in prompt and "评判理由" in prompt
    else:
        assert "1. 只谈{天气} | content constraint\n2. 用表格 | format constraint" in prompt
        assert '"verdicts": {"1": "yes/no", "2": "yes/no"}' in prompt and '"reasoning"' in prompt
    assert template.sha256 == template_hash(template.text) and len(template.sha256) == 64
    assert load_template("zh").sha256 != load_template("en").sha256


def test_substitution_is_safe_and_strict(tmp_path):
    assert substitute("a {x} {{y}} }}", {"x": "{x}"}) == "a {x} {y} }"
    for text, message in [
        ("{answer} {checklist} {user.__class__}", "not a plain name"),
        ("{answer} {checklist} {0}", "not a plain name"),
        ("{answer} {checklist} {os}", "unknown placeholder"),
        ("{answer} {checklist} {", "single '{'"),
        ("{answer}", "lacks the {checklist}"),
    ]:
        path = tmp_path / "t.txt"
        path.write_text(text)
        with pytest.raises(SysbenchError, match=message) as error:
            load_template(str(path))
        assert str(path) in str(error.value)
    with pytest.raises(SysbenchError, match="no such template"):
        load_template(str(tmp_path / "missing.txt"))


def test_history_uses_the_runs_own_replies_or_references():
    session = _session()
    gens = {(7, 1): GenerationRecord(7, 1, "第一问", "模型回答一")}
    model = build_history(session, 2, gens, "model")
    reference = build_history(session, 2, gens, "reference")
    assert [m.content for m in model] == ["第一问 {answer}", "模型回答一"]
    assert [m.content for m in reference] == ["第一问 {answer}", "参考一"]
    assert build_history(session, 1, gens, "model") == []


def test_plan_skips_missing_responses_and_judged_turns():
    session = _session()
    template = load_template("zh")
    gens = {
        (7, 1): GenerationRecord(7, 1, "u", None, status="skipped", overflow="skipped"),
        (7, 2): GenerationRecord(7, 2, "u", "r"),
    }
    plan = plan_judging([session], gens, set(), template, judge_model="j")
    assert [t.key for t in plan.tasks] == [(7, 2)]
    assert [(r.key, r.parse_status, r.verdicts) for r in plan.skipped] == [((7, 1), "skipped", {})]
    assert plan.skipped[0].passed is None
    again = plan_judging([session], gens, {(7, 2)}, template)
    assert again.tasks == [] and again.already_judged == 1
    assert plan_judging([session], {}, set(), template).not_generated == 2


def test_temperature_schedule():
    assert [temperature_for(i, 10) for i in range(10)] == [0.0] * 5 + [0.5] * 5
    assert [temperature_for(i, 3) for i in range(3)] == [0.0, 0.0, 0.5]
    assert temperature_for(0, 1) == 0.0


def test_schema_forces_the_checklist_numbers():
    schema = verdict_schema([1, 3], "zh", max_reasoning_chars=100)
    verdicts = schema["properties"]["评判结果"]
    assert verdicts["required"] == ["1", "3"] and verdicts["additionalProperties"] is False
    assert verdicts["properties"]["3"]["enum"] == ["是", "否"]
    assert schema["properties"]["评判理由"]["maxLength"] == 100
    assert list(verdict_schema([2], "en")["properties"]) == ["reasoning", "verdicts"]


def test_cache_roundtrip_and_keys(tmp_path):
    cache = JudgeCache(tmp_path / "c")
    key = cache_key("openai", "m", "h", "prompt", {"temperature": 0.0, "attempt": 0})
    assert key != cache_key("openai", "m", "h", "prompt", {"temperature": 0.0, "attempt": 1})
    assert key == cache_key("openai", "m", "h", "prompt", {"attempt": 0, "temperature": 0.0})
    assert cache.get(key) is None
    cache.put(key, CachedReply("reply", 3, 4, "stop"))
    assert cache.get(key) == CachedReply("reply", 3, 4, "stop")
    assert cache.path_for(key).parent.name == key[:2] and len(cache) == 1
    cache.path_for(key).write_text("{torn")
    assert cache.get(key) is None  # a damaged entry is a miss, never a crash
    assert not list(cache.root.glob("??/*.tmp"))
