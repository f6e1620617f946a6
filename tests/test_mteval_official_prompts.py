"""The official judge prompts as we send them, byte for byte against what the authors' client sends.

``evaluate.py`` runs from a scratch copy of ``../shared/mteval/official`` (with ``prompts/``) and
calls the authors' own client, ``utils/openai_generate.py``, which rewrites each prompt before the
request; only ``openai`` 0.x, ``transformers``, ``strictfire`` and ``fastchat`` are stubbed, and the
stubbed ``ChatCompletion.create`` keeps every request. No prompt or article text is stored here:
both sides read the shared files.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mteval_official import client_stubs, official_modules, punkt_tab_folder, quiet_client, scratch_official

from sysbench_gpu.benchmarks.mteval.data import parse_dialogues
from sysbench_gpu.benchmarks.mteval.judge_prompt import dialogue_document
from sysbench_gpu.benchmarks.mteval.official_prompts import (
    OFFICIAL_KINDS,
    as_client_sends,
    load_official_prompts,
    official_document,
    official_kind,
    render_official_prompt,
)
from sysbench_gpu.core.errors import SysbenchError

pytest.importorskip("nltk")
pytest.importorskip("tqdm")

BACKSLASH = "\\"


def reply(turn: int) -> str:
    """A reply with what filling and sending must get right.

    Outer blanks; abbreviations; braces and placeholders of later replacements; a backslash-n
    spelled out (code), a doubled backslash before ``n``, other escapes spelled out; CRLF, a tab,
    a no-break space, a zero-width space, quotes and non-ASCII text.
    """
    return (
        f"  \n Reply {turn}. Dr. Smith met Mr. Jones at 3 p.m. on Jan. 5.\r\n\n"
        f"* a bullet with {{braces}} and {{num_words}} and {{constraints}} left as text\n"
        f'print("a{BACKSLASH}nb"); path = "C:{BACKSLASH}{BACKSLASH}new{BACKSLASH}table{BACKSLASH}t"\n'
        f'escapes: {BACKSLASH}u00e9 {BACKSLASH}r{BACKSLASH}n {BACKSLASH}{BACKSLASH}{BACKSLASH}n \\"quoted\\"\n'
        "\ttabbed\u00a0no-break\u200bzero-width café “curly” — dash\n"
        f"Is it done? Yes! The end.{BACKSLASH}n  \n"
    )


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory, mteval_data_dir: Path) -> Iterator[Any]:
    import nltk
    import nltk.tokenize

    tmp = tmp_path_factory.mktemp("official")
    folder = scratch_official(mteval_data_dir.parent, tmp)
    saved_path = list(nltk.data.path)
    nltk.data.path.insert(0, str(punkt_tab_folder(tmp)))
    nltk.tokenize._get_punkt_tokenizer.cache_clear()
    sent: list[dict[str, Any]] = []
    runs = iter(range(10_000))

    try:
        with official_modules(folder, client_stubs(sent, folder)) as load:
            evaluate = load("evaluate.py")
            quiet_client()

            def run(task: str, setting: str, file: str, line_no: int, call: Any) -> tuple[list[Any], list[int], Any]:
                line = (mteval_data_dir / file).read_text("utf-8").splitlines()[line_no - 1]
                dialogue = json.loads(line)
                for number, turn in enumerate(dialogue["conv"], 1):
                    if turn["do_inference"]:
                        turn["gen_resp"] = reply(number)
                # A new "model" name per run: evaluate.py skips ids already in its output file.
                path = Path("inference_outputs") / task / f"{setting}_run{next(runs)}.jsonl"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(dialogue, ensure_ascii=False) + "\n", "utf-8")
                sent.clear()
                call(evaluate, str(path))
                session = parse_dialogues(line, source=file)[0]
                answered = [t.index for t in session.turns if t.answered]
                return list(sent), answered, session

            yield run
    finally:
        nltk.data.path[:] = saved_path
        nltk.tokenize._get_punkt_tokenizer.cache_clear()


# case: (task, setting, file, line, evaluate.py's function). Refinement dialogue 24 and expansion
# lines 24 and 42 quote articles whose text in the dialogue differs from documents.jsonl.
CASES = {
    "refinement_single": ("refinement", "single", "refinement_single.jsonl", 1, "evaluate_refinement_single"),
    "refinement_multi": ("refinement", "multi", "refinement_multi.jsonl", 1, "evaluate_refinement_multi"),
    "refinement_multi_article_6": ("refinement", "multi", "refinement_multi.jsonl", 24, "evaluate_refinement_multi"),
    "expansion_single": ("expansion", "single", "expansion_single.jsonl", 1, "evaluate_expansion"),
    "expansion_single_article_4": ("expansion", "single", "expansion_single.jsonl", 24, "evaluate_expansion"),
    "expansion_single_article_6": ("expansion", "single", "expansion_single.jsonl", 42, "evaluate_expansion"),
    "expansion_multi": ("expansion", "multi", "expansion_multi.jsonl", 1, "evaluate_expansion"),
    "follow-up_multi": ("follow-up", "multi", "follow-up_multi.jsonl", 1, "evaluate_follow_up_multi"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sent_prompts_are_byte_identical(case: str, captured: Any, mteval_data_dir: Path) -> None:
    task, setting, file, line_no, function = CASES[case]

    def call(evaluate: Any, path: str) -> None:
        if function == "evaluate_expansion":
            evaluate.evaluate_expansion(path, setting)
        else:
            getattr(evaluate, function)(path)

    requests, answered, session = captured(task, setting, file, line_no, call)
    templates = load_official_prompts(mteval_data_dir.parent / "prompts")
    template = templates[official_kind(session)]
    ours = [render_official_prompt(template, session, turn, reply(turn)) for turn in answered]
    assert len(requests) == len(answered) >= 1
    for turn, mine, request in zip(answered, ours, requests, strict=True):
        assert request["model"] == "gpt-4-0613" and request["temperature"] == 0 and request["max_tokens"] == 1024
        assert len(request["messages"]) == 1 and request["messages"][0]["role"] == "user"
        assert mine.encode("utf-8") == request["messages"][0]["content"].encode("utf-8"), f"{case}, turn {turn}"
        # The client's rewrite did reach the reply: no backslash-n pair is left, the doubled one keeps one backslash.
        assert BACKSLASH + "n" not in mine and "C:" + BACKSLASH + "\new" in mine


def test_every_official_prompt_is_exercised() -> None:
    used = {"refinement_single", "refinement_multi", "expansion", "follow-up"}
    assert used == set(OFFICIAL_KINDS)


def test_the_client_turns_each_spelled_out_newline_into_one() -> None:
    assert as_client_sends("a\\nb") == "a\nb"
    assert as_client_sends("C:\\\\new") == "C:\\\new"  # the pair after the first backslash
    assert as_client_sends("\\t \\r \\u00e9 \n") == "\\t \\r \\u00e9 \n"  # nothing else is touched


def test_content_is_the_article_of_documents_jsonl(mteval_data_dir: Path) -> None:
    """Dialogue 24 of refinement_multi quotes article 6 with a no-break space that documents.jsonl lacks."""
    prompts = mteval_data_dir.parent / "prompts"
    templates = load_official_prompts(prompts)
    line = (mteval_data_dir / "refinement_multi.jsonl").read_text("utf-8").splitlines()[23]
    session = parse_dialogues(line, source="refinement_multi.jsonl")[0]
    turn = next(t.index for t in session.turns if t.answered)
    rows = [json.loads(row) for row in (prompts / "documents.jsonl").read_text("utf-8").splitlines()]
    article = rows[5]["gen_resp"].split("\n\n", 1)[1]
    template = templates["refinement_multi"]
    assert official_document(template, session, turn) == article
    assert dialogue_document(session) != article  # the dialogue's own copy differs
    prompt = render_official_prompt(template, session, turn, "A reply.")
    assert article in prompt and dialogue_document(session) not in prompt
    assert not templates["follow-up"].documents  # no {content} there


def test_a_turn_id_that_names_no_article_is_one_line(mteval_data_dir: Path) -> None:
    templates = load_official_prompts(mteval_data_dir.parent / "prompts")
    line = json.loads((mteval_data_dir / "expansion_multi.jsonl").read_text("utf-8").splitlines()[0])
    for turn in line["conv"]:
        turn["id"] = "101_" + turn["id"].split("_", 1)[1]
    session = parse_dialogues(json.dumps(line), source="expansion_multi.jsonl")[0]
    turn = next(t.index for t in session.turns if t.answered)
    with pytest.raises(SysbenchError, match=r"field 'id'.*names no article of documents\.jsonl \(1 to 100"):
        render_official_prompt(templates["expansion"], session, turn, "A reply.")


def test_the_irrelevant_context_ablation_takes_its_article_from_the_first_answered_turn(
    mteval_data_dir: Path,
) -> None:
    templates = load_official_prompts(mteval_data_dir.parent / "prompts")
    text = (mteval_data_dir / "refinement_ablation_irrelevant-front.jsonl").read_text("utf-8")
    session = parse_dialogues(text.splitlines()[1], source="refinement_ablation_irrelevant-front.jsonl")[0]
    answered = [t for t in session.turns if t.answered]
    assert not session.turns[0].answered and answered[0].mteval is not None
    number = int(answered[0].mteval.turn_id.split("_")[0])
    article = templates["refinement_multi"].documents[number - 1]
    assert official_document(templates["refinement_multi"], session, answered[-1].index) == article
