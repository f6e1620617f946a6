"""Rule scorers: recollection cls, the 14 verifiable instructions (pass and fail each), and the text counts."""

from __future__ import annotations

import json

import pytest

from sysbench_gpu.benchmarks.mteval.data import parse_dialogues
from sysbench_gpu.benchmarks.mteval.rules import (
    INSTRUCTION_NAMES,
    check_instruction,
    check_instruction_args,
    detect_language,
    normalize_label,
    rule_score,
    score_cls,
)
from sysbench_gpu.benchmarks.mteval.sentences import count_sentences, count_words
from sysbench_gpu.core.errors import SysbenchError


def test_word_and_sentence_counts() -> None:
    assert count_words("  one two\nthree\tfour  ") == 4
    assert count_words("") == 0
    for rules in ("official", "lenient"):
        assert count_sentences("", rules) == 0 and count_sentences("   ", rules) == 0
        assert count_sentences("No end mark", rules) == 1
        assert count_sentences("Hello there. I am Dr. Smith! Are you J. K. Rowling? Yes.", rules) == 4
        assert count_sentences("Pi is 3.14 today. OK", rules) == 2  # a decimal point ends nothing
    # The lenient regex splitter knows "e.g." and CJK end marks; Punkt (official) does not.
    assert count_sentences('He said "Stop." Then he left...', "lenient") == 2
    assert count_sentences("Wait?! Really. e.g. this one.", "lenient") == 3
    assert count_sentences("Wait?! Really. e.g. this one.", "official") == 4
    assert count_sentences("他很好。你好！", "lenient") == 2
    assert count_sentences("他很好。你好！", "official") == 1
    with pytest.raises(SysbenchError, match="unknown MT-Eval rule set"):
        count_sentences("x", "strict")


def test_cls_lenient_normalizes_case_and_punctuation() -> None:
    assert normalize_label("  Science-Fiction!! ") == "science fiction"
    assert score_cls("The category is: Medicine.", "medicine", "lenient") == 10
    assert score_cls("MEDICINE", "Medicine.", "lenient") == 10
    assert score_cls("science fiction", "science-fiction", "lenient") == 10
    assert score_cls("This document is about food.", "travel", "lenient") == 0
    assert score_cls("", "travel", "lenient") == 0
    # a plain substring test, as upstream: "art" is found inside "heart"
    assert score_cls("heart", "art", "lenient") == 10
    with pytest.raises(SysbenchError, match="empty after normalization"):
        score_cls("anything", "?!", "lenient")


def test_cls_official_lowercases_and_blanks_punctuation_only() -> None:
    assert score_cls("The category is: Medicine.", "medicine") == 10
    assert score_cls("MEDICINE", "Medicine") == 10
    assert score_cls("science fiction", "science-fiction") == 10
    assert score_cls("science  fiction", "science fiction") == 0  # no whitespace collapse
    assert score_cls("food", "food.") == 0  # the label's trailing blank must be there too
    assert score_cls("heart", "art") == 10
    with pytest.raises(SysbenchError, match="gold label is empty"):
        score_cls("anything", "")


# name -> (args, a response that follows it, one that does not)
CASES = {
    "change_case:capital_letter": ({}, "ALL CAPS HERE, 100%!", "Not all caps"),
    "change_case:lowercase": ({}, "all lower here.", "Almost all lower"),
    "combination:two_responses": ({}, "First answer.\n******\nSecond answer.", "Same.\n******\nSame."),
    "content:placeholder": ({"num_placeholder": 2}, "Dear [name], at [address].", "Dear [name]."),
    "format:bullet_list": ({"num_bullets": 2}, "* one\n- two", "* one\n* two\n* three"),
    "format:constrained_response": (
        {"response_options": ["My answer is yes.", "My answer is no."]},
        "Well. My answer is no.",
        "Maybe.",
    ),
    "format:json_format": ({}, '```json\n{"a": [1, 2]}\n```', "{'a': 1}"),
    "keywords:existence": ({"keywords": ["city", "garbage"]}, "The City has garbage.", "The city is clean."),
    "language:response_language": (
        {"lang": "Spanish"},
        "Hola, ¿cómo estás? Espero que tengas un buen día y que todo vaya muy bien en tu trabajo.",
        "Hello, how are you? I hope you have a good day and that everything goes well at work.",
    ),
    "length_constraints:number_sentences": (
        {"num_sentences": 4, "relation": "less than"},
        "One. Two. Three.",
        "One. Two. Three. Four.",
    ),
    "punctuation:no_comma": ({}, "No commas at all.", "Yes, one comma."),
    "startend:end_phrase": (
        {"end_phrase": "Is there anything else I can help with?"},
        "Done. is there anything else I can help with?'  ",
        "Is there anything else I can help with? Bye.",
    ),
    "startend:start_char": ({"letter": "o"}, "  Once upon a time.", "Upon a time, o."),
    "startend:start_emoji": ({}, "  😀 A smile first.", "Hi 😀"),
}


def test_cases_cover_every_instruction() -> None:
    assert sorted(CASES) == sorted(INSTRUCTION_NAMES) and len(INSTRUCTION_NAMES) == 14


@pytest.mark.parametrize("name", sorted(CASES))
def test_instruction_pass_and_fail(name: str) -> None:
    args, follows, breaks = CASES[name]
    assert check_instruction_args(name, args) is None
    assert check_instruction(name, args, follows) is True
    assert check_instruction(name, args, breaks) is False


def test_instruction_edge_cases() -> None:
    assert check_instruction("format:bullet_list", {"num_bullets": 0}, "* only bullets") is True  # 0: at least one
    assert check_instruction("format:bullet_list", {"num_bullets": 0}, "no bullets") is False
    assert check_instruction("format:bullet_list", {"num_bullets": 1}, "**bold** is not a bullet\n* but this is")
    assert check_instruction("startend:start_emoji", {}, "") is False
    # Officially only the first code point counts; lenient accepts a whole leading emoji sequence.
    assert check_instruction("startend:start_emoji", {}, "1️⃣ keycap") is False
    assert check_instruction("startend:start_emoji", {}, "1️⃣ keycap", "lenient") is True
    assert check_instruction("startend:start_emoji", {}, "🇺🇸 flag") is False
    assert check_instruction("startend:start_emoji", {}, "🇺🇸 flag", "lenient") is True
    assert check_instruction("startend:start_emoji", {}, "   ", "lenient") is False
    assert check_instruction("language:response_language", {"lang": "Bulgarian"}, "   ") is False
    # nothing to detect (digits only): not held against the response, as upstream
    assert check_instruction("language:response_language", {"lang": "Punjabi"}, "12345") is True
    assert check_instruction("combination:two_responses", {}, "A\n******\n\n******\nB") is False
    assert check_instruction("format:json_format", {}, "__import__('os')") is False  # never evaluated


@pytest.mark.parametrize("rules", ["official", "lenient"])
def test_json_format_strips_a_chain_of_opening_fences(rules: str) -> None:
    """As the authors' check: each opening spelling is removed in turn, then one closing fence."""
    chained = [
        '```Json```JSON{"a": 1}```',
        '```json```{"a": 1}```',
        '```json```JSON```{"a": 1}```',
        '  ```{"a": 1}```  ',
    ]
    for reply in chained:
        assert check_instruction("format:json_format", {}, reply, rules) is True, reply
    # The chain runs in the authors' order once: a spelling met after a later one stays, and so fails.
    for reply in ['```JSON```json{"a": 1}```', '```json\n```json\n{"a": 1}```', '{"a": 1}``````']:
        assert check_instruction("format:json_format", {}, reply, rules) is False, reply


def test_language_detection_is_deterministic() -> None:
    text = "Ово је кратак текст на српском или бугарском језику, тешко је рећи."
    assert len({detect_language(text) for _ in range(5)}) == 1
    assert detect_language("ਮੈਂ ਪੰਜਾਬੀ ਵਿੱਚ ਲਿਖ ਰਿਹਾ ਹਾਂ।") == "pa"


def test_instruction_args_are_checked() -> None:
    assert "needs 'letter'" in check_instruction_args("startend:start_char", {})
    assert "Klingon" in check_instruction_args("language:response_language", {"lang": "Klingon"})
    assert "relation" in check_instruction_args(
        "length_constraints:number_sentences", {"num_sentences": 3, "relation": "about"}
    )
    with pytest.raises(SysbenchError, match="unknown instruction"):
        check_instruction("startend:nothing", {}, "x")
    with pytest.raises(SysbenchError, match="num_placeholder"):
        check_instruction("content:placeholder", {"num_placeholder": "two"}, "x")


def _one(task: str, dialogue: dict):
    return parse_dialogues(json.dumps(dialogue), task=task)[0]


def test_rule_score_on_dialogues() -> None:
    cls = _one(
        "recollection-cls",
        {
            "id": "c",
            "conv": [
                {"user": "Classify. Reply OK.", "sys": "OK", "id": "instruction", "do_inference": False},
                {"user": "A text about soup.", "sys": "food", "id": "7", "do_inference": True},
            ],
        },
    )
    verdict = rule_score(cls, 2, "Food.", "lenient")
    assert (verdict.score, verdict.rule) == (10, "cls") and "'food' found" in verdict.detail
    assert rule_score(cls, 2, "Food.").score == 10
    assert rule_score(cls, 2, "travel").score == 0
    inst = _one(
        "recollection-global-inst",
        {
            "id": "g",
            "inst_name": "startend:start_char",
            "inst_args": {"letter": "o"},
            "conv": [
                {"user": "Begin with o.", "sys": "ok.", "id": "instruction", "do_inference": False},
                {"user": "Q?", "sys": "", "id": "1-2", "do_inference": True},
            ],
        },
    )
    assert rule_score(inst, 2, "Of course.").score == 10
    bad = rule_score(inst, 2, "Sure.")
    assert bad.score == 0 and bad.rule == "startend:start_char" and "not followed" in bad.detail
    with pytest.raises(SysbenchError, match="context turn"):
        rule_score(inst, 1, "x")
    judged = _one("follow-up", {"id": "f", "conv": [{"user": "Q", "sys": "A", "id": "1", "do_inference": True}]})
    with pytest.raises(SysbenchError, match="scored by the LLM judge"):
        rule_score(judged, 1, "x")


def test_every_gold_label_of_the_shared_cls_files_matches_itself() -> None:
    from pathlib import Path

    from sysbench_gpu.benchmarks.registry import load_dataset

    folder = Path(__file__).resolve().parent.parent.parent / "shared" / "mteval" / "data"
    files = sorted(folder.glob("*cls*.jsonl"))
    if not files:
        pytest.skip("shared MT-Eval data not found")
    scored = 0
    for path in files:
        for session in load_dataset(path).sessions:
            for turn in session.turns:
                if turn.answered:
                    shouted = f"Category: {turn.reference.upper()}!"
                    assert rule_score(session, turn.index, shouted, "lenient").score == 10
                    assert rule_score(session, turn.index, f"Category: {turn.reference}").score == 10
                    scored += 1
    assert scored == 100 + 100 + 4 * 100  # recollection multi and single, four cls ablations
