"""The 1-10 MT-Eval judge: what the prompt shows, the strict score parser, the guided-decoding schema, templates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sysbench_gpu.benchmarks.mteval.data import parse_dialogues
from sysbench_gpu.benchmarks.mteval.judge_prompt import (
    ScoreReply,
    dialogue_document,
    follow_up_conversation,
    judge_kind,
    load_score_template,
    parse_score_reply,
    render_score_prompt,
    score_prompts_needed,
    score_schema,
    turn_constraints,
)
from sysbench_gpu.core.errors import SysbenchError

DOC = "Once there was a chef.\n\nShe cooked soup."
REFINEMENT = {
    "id": "1_sum_ner",
    "conv": [
        {
            "user": f"Content: {DOC} \n\nInstruction: Summarize it.",
            "sys": "r1",
            "id": "1_sum_1",
            "do_inference": True,
            "inst": "Summarize it.",
        },
        {
            "user": "Use at most 5 words.",
            "sys": "r2",
            "id": "1_sum_2",
            "do_inference": True,
            "inst": "Use at most 5 words.",
        },
        {"user": "List the persons.", "sys": "r3", "id": "1_ner_1", "do_inference": True, "inst": "List the persons."},
        {"user": "One per line.", "sys": "r4", "id": "1_ner_2", "do_inference": True, "inst": "One per line."},
    ],
}
FOLLOW_UP = {
    "id": "81",
    "conv": [
        {"user": "Write a post.", "sys": "A post.", "id": "1", "do_inference": False},
        {"user": "Start every sentence with A.", "sys": "A post, again.", "id": "2", "do_inference": False},
        {"user": "Add a personal touch.", "sys": "Gold three.", "id": "3", "do_inference": True},
        {"user": "Swap the palace for the memorial.", "sys": "Gold four.", "id": "4", "do_inference": True},
    ],
}


def _one(task: str, dialogue: dict):
    return parse_dialogues(json.dumps(dialogue), task=task)[0]


def test_document_and_refinement_constraints_accumulate_within_a_task_type() -> None:
    session = _one("refinement", REFINEMENT)
    assert judge_kind(session) == "refinement"
    assert dialogue_document(session) == DOC
    assert turn_constraints(session, 1) == ["Summarize it."]
    assert turn_constraints(session, 2) == ["Summarize it.", "Use at most 5 words."]
    assert turn_constraints(session, 3) == ["List the persons."]  # a new task type restarts the list
    assert turn_constraints(session, 4) == ["List the persons.", "One per line."]
    expansion = _one("expansion", REFINEMENT)
    assert judge_kind(expansion) == "expansion" and turn_constraints(expansion, 2) == ["Use at most 5 words."]


def test_refinement_prompt_shows_document_reply_counts_and_numbered_constraints() -> None:
    session = _one("refinement", REFINEMENT)
    prompt = render_score_prompt(load_score_template("refinement"), session, 2, "  A chef cooks. Soup!  ")
    assert f"# Document\n{DOC}\n" in prompt
    assert "# Reply to grade\nA chef cooks. Soup!\n" in prompt
    assert "Words in the reply: 4\nSentences in the reply: 2" in prompt
    assert "# Constraints\n1. Summarize it.\n2. Use at most 5 words.\n" in prompt
    assert '{"rationale": "<why the reply earns this score>", "score": <an integer from 1 to 10>}' in prompt
    assert "{" not in prompt.replace('{"rationale"', "")  # no placeholder left unrendered


def test_reply_text_with_braces_is_not_rescanned() -> None:
    session = _one("expansion", REFINEMENT)
    prompt = render_score_prompt(load_score_template("expansion"), session, 1, "{response} {document} {{x}}")
    assert "# Reply to grade\n{response} {document} {{x}}\n" in prompt


def test_follow_up_prompt_shows_previous_exchange_with_its_reference() -> None:
    session = _one("follow-up", FOLLOW_UP)
    assert [(m.role, m.content) for m in follow_up_conversation(session, 4)] == [
        ("user", "Add a personal touch."),
        ("assistant", "Gold three."),
        ("user", "Swap the palace for the memorial."),
    ]
    assert follow_up_conversation(session, 4, previous_reply="Mine.")[1].content == "Mine."
    prompt = render_score_prompt(load_score_template("follow-up"), session, 4, "Done, swapped.")
    assert (
        "# Conversation before the reply\n<role: user>\n<content>\nAdd a personal touch.\n</content>\n"
        "<role: assistant>\n<content>\nGold three.\n</content>\n<role: user>\n<content>\n"
        "Swap the palace for the memorial.\n</content>\n"
    ) in prompt
    assert "# Reply to grade\nDone, swapped.\n" in prompt and "Words in the reply: 2" in prompt


def test_kind_mismatch_and_rule_tasks_are_errors() -> None:
    session = _one("follow-up", FOLLOW_UP)
    with pytest.raises(SysbenchError, match="a follow-up dialogue, but the template is for refinement"):
        render_score_prompt(load_score_template("refinement"), session, 4, "x")
    cls = _one(
        "recollection-cls", {"id": "c", "conv": [{"user": "Doc", "sys": "food", "id": "1", "do_inference": True}]}
    )
    with pytest.raises(SysbenchError, match="not scored by the LLM judge"):
        judge_kind(cls)
    assert score_prompts_needed([cls, session]) == [(1, 3), (1, 4)]
    irrelevant = _one("refinement-irrelevant-front", {**REFINEMENT, "n_distracts": 1})
    assert judge_kind(irrelevant) == "refinement"


# ------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    ("reply", "score", "rationale"),
    [
        ('{"rationale": "Good.", "score": 8}', 8, "Good."),
        ('Sure.\n```json\n{"Rationale": "Fine", "Score": 10}\n```', 10, "Fine"),  # upstream's capitalized keys
        ("{'rationale': 'single quotes', 'score': 1,}", 1, "single quotes"),  # the documented repair
        ('An example {"score": 99} first, then {"rationale": "real", "score": 3}', 3, "real"),
        ('{"reasoning": "alias", "score": 7}', 7, "alias"),
        # Only the score, as the authors' parser takes it (it reads "Score" alone).
        ('{"Score": 7}', 7, None),
        ('```json\n{"score": 5}\n```', 5, None),
        ('{"Rationale": ["not", "a", "string"], "Score": 4}', 4, None),
        ('{"Rationale": "one", "reason": "two", "Score": 6}', 6, None),
    ],
)
def test_valid_replies(reply: str, score: int, rationale: str | None) -> None:
    parsed = parse_score_reply(reply)
    assert parsed.ok and (parsed.score, parsed.rationale) == (score, rationale)


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ("", "empty reply"),
        ("I give it an 8.", "no JSON object found"),
        ('{"rationale": "x", "score": 11}', "score 11 is outside 1..10"),
        ('{"rationale": "x", "score": 0}', "score 0 is outside 1..10"),
        ('{"rationale": "x", "score": 7.5}', "score 7.5 is not an integer"),
        ('{"rationale": "x", "score": 8.0}', "score 8.0 is not an integer"),
        ('{"rationale": "x", "score": "8"}', 'score "8" is not an integer'),
        ('{"rationale": "x", "score": true}', "score true is not an integer"),
        ('{"rationale": "x"}', "no 'score' key"),
        ('{"rationale": "x", "score": 5, "Score": 6}', "two spellings"),
        ('{"rationale": "x", "score": 5, "score": 6}', "no JSON object found"),  # duplicate key: not accepted
        ('{"rationale": "x", "score": __import__("os").getpid()}', "no JSON object found"),  # never evaluated
    ],
)
def test_invalid_replies(reply: str, error: str) -> None:
    parsed = parse_score_reply(reply)
    assert not parsed.ok and parsed.score is None and error in parsed.error


def test_a_score_only_reply_is_read_as_a_score_with_no_rationale() -> None:
    reading = ScoreReply().read('{"Score": 9}')
    assert reading.ok and reading.score == 9.0 and reading.reasoning is None
    # The integer 1-10 check stays: the authors' int() would take these, we do not.
    for reply in ('{"Score": "9"}', '{"Score": 9.5}', '{"Score": 12}', '{"Score": 0}'):
        assert not ScoreReply().read(reply).ok, reply


def test_schema_keeps_the_score_an_integer_from_1_to_10() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = score_schema()
    jsonschema.validate({"rationale": "ok", "score": 1}, schema)
    jsonschema.validate({"rationale": "ok", "score": 10}, schema)
    for bad in (
        {"rationale": "x", "score": 0},
        {"rationale": "x", "score": 11},
        {"rationale": "x", "score": 5.5},
        {"rationale": "x", "score": "5"},
        {"score": 5},
        {"rationale": "x", "score": 5, "extra": 1},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    assert list(schema["properties"]) == ["rationale", "score"]  # the rationale comes first
    assert score_schema(None)["properties"]["rationale"] == {"type": "string"}


def test_template_files_are_checked(tmp_path: Path) -> None:
    template = load_score_template("follow-up")
    assert template.name == "follow-up" and len(template.sha256) == 64
    own = tmp_path / "mine.txt"
    own.write_text("Grade {response} after {conversation}; {num_words} words.", encoding="utf-8")
    assert load_score_template("follow-up", own).kind == "follow-up"
    with pytest.raises(SysbenchError, match=r"a refinement template needs \{document\}, \{constraints\}"):
        load_score_template("refinement", own)
    own.write_text("{response} {conversation} {secret.attr}", encoding="utf-8")
    with pytest.raises(SysbenchError, match="not a plain name"):
        load_score_template("follow-up", own)
    own.write_text("{response} {conversation} {system_prompt}", encoding="utf-8")
    with pytest.raises(SysbenchError, match=r"unknown placeholder\(s\) \{system_prompt\}"):
        load_score_template("follow-up", own)
    with pytest.raises(SysbenchError, match="unknown MT-Eval judge kind"):
        load_score_template("recollection")
