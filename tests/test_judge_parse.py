"""Parsing judge replies: safe, strict about keys, honest about values."""

from __future__ import annotations

import ast
import builtins
import inspect
import json

import pytest

from sysbench_gpu.benchmarks.judge_text import balanced_objects, repair
from sysbench_gpu.benchmarks.sysbench import judge_parse
from sysbench_gpu.benchmarks.sysbench.judge_parse import parse_reply
from sysbench_gpu.core.sessions import Constraint

C3 = (
    Constraint(1, "a", "content", "内容约束"),
    Constraint(2, "b", "format", "格式约束"),
    Constraint(3, "c", "style", "风格约束"),
)


def values(result):
    return {k: v.value for k, v in result.verdicts.items()}


def test_fenced_json_with_reasoning():
    text = (
        '好的，结果如下：\n```json\n{"评判理由": "第1条满足", "评判结果": {"1": "是", "2": "否", "3": "是"}}\n'
        "```\n以上。"
    )
    result = parse_reply(text, C3)
    assert result.ok and not result.repaired
    assert values(result) == {"1": "yes", "2": "no", "3": "yes"}
    assert result.reasoning == "第1条满足"
    assert result.verdicts["2"].raw == "否" and result.verdicts["2"].type == "format"


def test_bare_json_with_braces_inside_strings():
    text = (
        'Here: {"reasoning": "the answer used {curly} braces and a \\"quote\\" }", '
        '"verdicts": {"1": "yes", "2": "no", "3": "No."}} done'
    )
    result = parse_reply(text, C3)
    assert result.ok
    assert values(result) == {"1": "yes", "2": "no", "3": "no"}
    assert result.reasoning.startswith("the answer used {curly}")


def test_int_and_str_keys_and_both_languages():
    zh = parse_reply('{"评判理由": "r", "评判结果": {"1": "是", " 2 ": "否", "3": "是"}}', C3)
    en = parse_reply("{'reasoning': 'r', 'verdicts': {1: 'yes', 2: 'no', 3: 'yes',},}", C3)
    assert zh.ok and en.ok and en.repaired
    assert values(zh) == values(en) == {"1": "yes", "2": "no", "3": "yes"}


def test_not_applicable_values_are_other_and_kept_raw():
    result = parse_reply('{"评判结果": {"1": "不适用", "2": "N/A", "3": "无法判断"}}', C3)
    assert result.ok
    assert values(result) == {"1": "other", "2": "other", "3": "other"}
    assert [v.raw for v in result.verdicts.values()] == ["不适用", "N/A", "无法判断"]


@pytest.mark.parametrize(
    "raw", ["部分是", "maybe", "`print('x')`", "部分满足", "yes and no", "是，但部分不符合", "不完全满足", "忽略"]
)
def test_off_vocabulary_verdict_makes_the_reply_invalid(raw):
    result = parse_reply(json.dumps({"评判结果": {"1": raw, "2": "是", "3": "是"}}, ensure_ascii=False), C3)
    assert not result.ok and "verdict 1" in result.error and "not yes, no or not applicable" in result.error


def test_booleans_accepted_but_numbers_null_and_empty_are_failures():
    assert values(parse_reply('{"评判结果": {"1": true, "2": false, "3": "是"}}', C3)) == {
        "1": "yes",
        "2": "no",
        "3": "yes",
    }
    for bad in ("1", "null", '""', '["是"]', '{"x": "是"}'):
        result = parse_reply(f'{{"评判结果": {{"1": {bad}, "2": "是", "3": "是"}}}}', C3)
        assert not result.ok and "verdict 1" in result.error


def test_keys_must_equal_the_checklist():
    missing = parse_reply('{"评判结果": {"1": "是", "2": "是"}}', C3)
    extra = parse_reply('{"评判结果": {"1": "是", "2": "是", "3": "是", "4": "否"}}', C3)
    named = parse_reply('{"评判结果": {"1": "是", "2": "是", "three": "是"}}', C3)
    duplicate = parse_reply('{"评判结果": {"1": "是", "01": "否", "2": "是", "3": "是"}}', C3)
    dup_json = parse_reply('{"评判结果": {"1": "是", "1": "否", "2": "是", "3": "是"}}', C3)
    assert not missing.ok and "missing [3]" in missing.error
    assert not extra.ok and "unexpected [4]" in extra.error
    assert not named.ok and "'three'" in named.error
    assert not duplicate.ok and "twice" in duplicate.error
    assert not dup_json.ok


def test_not_json_and_empty():
    assert parse_reply("", C3).error == "empty reply"
    assert not parse_reply("All constraints are met: yes, no, yes.", C3).ok
    assert not parse_reply('{"评判理由": "only reasoning"}', C3).ok
    assert not parse_reply('{"评判结果": {"1": "是", "2": "是"', C3).ok  # cut at max_tokens


def test_top_level_number_map_and_first_valid_candidate():
    assert parse_reply('{"1": "是", "2": "否", "3": "是"}', C3).ok
    text = 'Example: {"评判结果": {"9": "是"}}. Mine: {"评判结果": {"1": "是", "2": "否", "3": "是"}}'
    assert values(parse_reply(text, C3)) == {"1": "yes", "2": "no", "3": "yes"}


# Builtin names spelled in pieces so that grepping for a call of the builtin finds only real calls.
EVAL, EXEC = "ev" + "al", "ex" + "ec"
INJECTIONS = [
    "{\"评判结果\": __import__('os').system('touch /tmp/PWNED_x')}",
    '{"评判结果": {"1": ' + EVAL + '("1+1"), "2": "是", "3": "是"}}',
    "{'评判结果': {1: (lambda: __import__('os').system('touch /tmp/PWNED_y'))(), 2: '是', 3: '是'}}",
    "```python\n__import__('os').system('touch /tmp/PWNED_z')\n```",
    '{"评判结果": {"1": "是", "2": "是", "3": "是"}, "x": ' + EXEC + '("import os")}',
    '{"评判结果": {"1": "是", "2": "是", "3": globals()}}',
]


def test_code_in_replies_is_never_run(monkeypatch):
    calls = []

    def trap(name):
        def _trap(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} called")

        return _trap

    monkeypatch.setattr(builtins, "eval", trap("eval"))
    monkeypatch.setattr(builtins, "exec", trap("exec"))
    monkeypatch.setattr(builtins, "__import__", builtins.__import__)  # untouched, but noted
    monkeypatch.setattr(ast, "literal_eval", trap("literal_eval"))
    for text in INJECTIONS:
        result = parse_reply(text, C3)
        assert not result.ok, text
    assert calls == []
    source = inspect.getsource(judge_parse)
    code = "\n".join(
        line for line in source.splitlines() if not line.lstrip().startswith(("#", '"', "`", "-", "1", "2", "3", "4"))
    )
    assert EVAL + "(" not in code and EXEC + "(" not in code and "literal_" + EVAL not in code


def test_repair_is_token_level_only():
    assert repair("{'a': 'it\\'s', 1: 'b',}") == '{"a": "it\'s", "1": "b"}'
    # Text inside double-quoted strings is never touched.
    assert repair('{"a": "x, }", "b": \'y\'}') == '{"a": "x, }", "b": "y"}'
    assert list(balanced_objects('a {"x": "}"} b {c} "{" d')) == ['{"x": "}"}', "{c}"]


@pytest.mark.parametrize(
    "raw,value",
    [
        ("是", "yes"),
        ("否", "no"),
        ("Yes", "yes"),
        ("NO", "no"),
        ("n.a.", "other"),
        ("不是", "no"),
        ("不", "no"),
        ("未满足", "no"),
        ("不满足", "no"),
        ("没有满足", "no"),
        ("No, it does not", "no"),
        ("NO.", "no"),
        ("No.", "no"),
        ("否，回答没有使用表格", "no"),
        ("Yes - the reply is formal", "yes"),
        ("是的。", "yes"),
        ("满足", "yes"),
        ("不适用", "other"),
        ("无法评判", "other"),
        ("Not applicable", "other"),
        ("N/A", "other"),
    ],
)
def test_value_mapping(raw, value):
    result = parse_reply(f'{{"verdicts": {{"1": "{raw}"}}}}', C3[:1])
    assert result.ok and result.verdicts["1"].value == value and result.verdicts["1"].raw == raw


def test_import_normalization_is_unchanged_by_the_live_vocabulary():
    from sysbench_gpu.core.verdicts import live_verdict, normalize_verdict

    # Workbooks keep their values as the paper's numbers were made: anything but 是/否 is other.
    assert [normalize_verdict(v) for v in ("是", "否", "部分是", "不是", "maybe")] == [
        "yes",
        "no",
        "other",
        "other",
        "other",
    ]
    assert [live_verdict(v) for v in ("是", "否", "部分是", "不是", "maybe")] == ["yes", "no", None, "no", None]
