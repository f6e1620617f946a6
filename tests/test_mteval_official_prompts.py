"""The official judge prompts as we fill them, byte for byte against what the authors' ``evaluate.py`` builds.

``evaluate.py`` runs from a scratch copy of ``../shared/mteval/official`` (with ``prompts/``), with
``strictfire``, ``fastchat`` and ``utils.openai_generate`` stubbed; the stub's ``generate`` keeps
every prompt it is given. No prompt text is stored here: both sides read the shared files.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mteval_official import official_modules, punkt_tab_folder, scratch_official, stub_modules

from sysbench_gpu.benchmarks.mteval.data import parse_dialogues
from sysbench_gpu.benchmarks.mteval.official_prompts import (
    OFFICIAL_KINDS,
    load_official_prompts,
    official_kind,
    render_official_prompt,
)

pytest.importorskip("nltk")
pytest.importorskip("tqdm")


def reply(turn: int) -> str:
    """A reply with what filling must get right: outer blanks, abbreviations, braces, several lines."""
    return (
        f"  \n Reply {turn}. Dr. Smith met Mr. Jones at 3 p.m. on Jan. 5.\n\n"
        f"* a bullet with {{braces}} and {{num_words}} left as text\n"
        "Is it done? Yes! The end.  \n"
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
    prompts: list[str] = []

    def generate(model_name: str, prompt: str, temperature: float, max_tokens: int) -> tuple[str, int, float]:
        prompts.append(prompt)
        return '{"Rationale": "stub", "Score": 5}', 0, 0.0

    try:
        with official_modules(folder, stub_modules(generate)) as load:
            evaluate = load("evaluate.py")

            def run(task: str, setting: str, file: str, call: Any) -> tuple[list[str], list[Any], Any]:
                line = (mteval_data_dir / file).read_text("utf-8").splitlines()[0]
                dialogue = json.loads(line)
                for number, turn in enumerate(dialogue["conv"], 1):
                    if turn["do_inference"]:
                        turn["gen_resp"] = reply(number)
                path = Path("inference_outputs") / task / f"{setting}_mine.jsonl"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(dialogue, ensure_ascii=False) + "\n", "utf-8")
                prompts.clear()
                call(evaluate, str(path))
                session = parse_dialogues(line, source=file)[0]
                answered = [t.index for t in session.turns if t.answered]
                return list(prompts), answered, session

            yield run
    finally:
        nltk.data.path[:] = saved_path
        nltk.tokenize._get_punkt_tokenizer.cache_clear()


CASES = {
    "refinement_single": ("refinement", "single", "refinement_single.jsonl", "evaluate_refinement_single"),
    "refinement_multi": ("refinement", "multi", "refinement_multi.jsonl", "evaluate_refinement_multi"),
    "expansion_single": ("expansion", "single", "expansion_single.jsonl", "evaluate_expansion"),
    "expansion_multi": ("expansion", "multi", "expansion_multi.jsonl", "evaluate_expansion"),
    "follow-up_multi": ("follow-up", "multi", "follow-up_multi.jsonl", "evaluate_follow_up_multi"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_filled_prompts_are_byte_identical(case: str, captured: Any, mteval_data_dir: Path) -> None:
    task, setting, file, function = CASES[case]

    def call(evaluate: Any, path: str) -> None:
        if function == "evaluate_expansion":
            evaluate.evaluate_expansion(path, setting)
        else:
            getattr(evaluate, function)(path)

    theirs, answered, session = captured(task, setting, file, call)
    templates = load_official_prompts(mteval_data_dir.parent / "prompts")
    template = templates[official_kind(session)]
    ours = [render_official_prompt(template, session, turn, reply(turn)) for turn in answered]
    assert len(theirs) == len(answered) >= 1
    for turn, mine, official in zip(answered, ours, theirs, strict=True):
        assert mine.encode("utf-8") == official.encode("utf-8"), f"{case}, turn {turn}"


def test_every_official_prompt_is_exercised() -> None:
    used = {"refinement_single", "refinement_multi", "expansion", "follow-up"}
    assert used == set(OFFICIAL_KINDS)
