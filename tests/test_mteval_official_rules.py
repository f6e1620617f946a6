"""Our rule verdicts against the authors' own code, in official mode: every instruction type and cls.

The reference is ``../shared/mteval/official``: ``calculate_score.evaluate_recollection_global_inst``
and ``evaluate_recollection_cls`` run on inference files we write with our own replies, so their
whole path (argument filtering, the instruction classes of ``utils/global_inst.py``, the cls
preprocessing) decides. NLTK's ``sent_tokenize`` there loads NLTK's English Punkt model (written
from the package we ship, after its tables are checked against the digests of NLTK's own files)
through NLTK's own ``punkt_tab`` loader; langdetect's shared factory is seeded as ours is.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mteval_official import (
    NLTK_ENGLISH_PUNKT_SHA256,
    official_modules,
    punkt_tab_folder,
    punkt_tab_tables,
    scratch_official,
    stub_modules,
)

from sysbench_gpu.benchmarks.mteval.rules import INSTRUCTION_NAMES, check_instruction, score_cls

pytest.importorskip("nltk")
pytest.importorskip("punkt")

# Replies tried against every dialogue, whatever its instruction.
POOL = [
    "Of course. I am Dr. Smith. Is there anything else I can help with?",
    "OK",
    "😀 Hello there, friend.",
    "🇺🇸 Flags come first.",
    "1️⃣ keycap first",
    "☺ a smile without its selector",
    "  ✨ spaced sparkle",
    "ALL CAPS, HERE! 100%",
    "all lower here. no caps at all",
    '```json\n{"a": [1, 2]}\n```',
    '```JSON\n{"answer": "yes"}```',
    '```Json```JSON{"chained": "fences"}```',
    '```json```{"b": 2}```',
    '```json\n```\n{"c": 3}\n```',
    '``````{"d": 4}``````',
    "{'single': 'quotes'}",
    "* one\n* two\n- three",
    "* alone",
    "**bold** text\n* real bullet\n  - nested dash",
    "Dear [name], meet me at [address] on [date].",
    "My answer is yes.",
    "my answer is maybe.",
    "Answer one.\n******\nAnswer two.",
    "Same.\n******\nSame.",
    "A\n******\n\n******\nB",
    "Hola, ¿cómo estás? Espero que tengas un buen día y que todo vaya muy bien en tu trabajo.",
    "Bonjour, je suis très heureux de vous rencontrer aujourd'hui dans cette belle ville.",
    "Guten Tag, ich hoffe, dass es Ihnen heute gut geht und die Arbeit Spaß macht.",
    "これは日本語の文章です。今日はとても良い天気ですね。",
    "Привет, как у тебя дела? Надеюсь, что всё хорошо и работа идёт отлично.",
    "Mr. Brown went to Washington D.C. on Jan. 5. He met the U.S. president at 3 p.m. It rained.",
    "One. Two. Three. Four. Five. Six. Seven.",
    'He said "Stop." Then he left... Really?! Yes.',
    "First sentence here.\n\nSecond one follows.\n- a bullet without a period\nLast line",
    "Pi is 3.14 today. The end",
    "12345",
    "No commas here at all",
    "Closing. Is there anything else I can help with?'",
    "Text. IS THERE ANYTHING ELSE I CAN HELP WITH?",
    "  ",
]


def _targeted(name: str, args: dict[str, Any]) -> list[str]:
    """Replies aimed at one instruction's edge: just meeting it, just missing it."""
    if name == "startend:start_char":
        letter = args["letter"]
        return [f"{letter}nce upon a time.", f"  {letter.upper()}ver there.", f"x {letter}"]
    if name == "startend:end_phrase":
        phrase = args["end_phrase"]
        return [f"Done. {phrase}", f"Done. {phrase.lower()}'", f"Done. {phrase} Bye.", f"'{phrase}'  "]
    if name == "keywords:existence":
        words = args["keywords"]
        return [" and ".join(words), " ".join(w.upper() for w in words), " ".join(words[1:]) or "none"]
    if name == "format:constrained_response":
        options = args["response_options"]
        return [options[0], f"Well... {options[-1]}", options[0].lower(), options[0].upper()]
    if name == "content:placeholder":
        n = args["num_placeholder"]
        return [" ".join("[x]" for _ in range(n)), " ".join("[x]" for _ in range(max(n - 1, 0))) or "none", "[a [b] c]"]
    if name == "format:bullet_list":
        n = args["num_bullets"]
        return ["\n".join(f"* point {i}" for i in range(n)), "\n".join(f"- point {i}" for i in range(n + 1))]
    if name == "length_constraints:number_sentences":
        n = args["num_sentences"]
        return [
            " ".join(f"Sentence {i}." for i in range(n - 1)),
            " ".join(f"Sentence {i}." for i in range(n)),
            " ".join(f"Dr. No met Mr. X {i}." for i in range(n - 1)),
            " ".join(f"Wait?! Item {i} e.g. this." for i in range(n - 1)),
        ]
    return []


PER_TYPE = 6  # dialogues (and so argument sets) per instruction type, to keep the test to seconds


def _dialogues(data_dir: Path) -> list[dict[str, Any]]:
    rows, taken = [], Counter()
    for name in ("recollection_single_global-inst.jsonl", "recollection_multi_global-inst.jsonl"):
        for line in (data_dir / name).read_text("utf-8").splitlines():
            row = json.loads(line)
            if line.strip() and taken[row["inst_name"]] < PER_TYPE:
                taken[row["inst_name"]] += 1
                rows.append(row)
    return rows


@pytest.fixture(scope="module")
def official(tmp_path_factory: pytest.TempPathFactory, mteval_data_dir: Path) -> Iterator[Any]:
    import langdetect
    import nltk
    import nltk.tokenize

    tmp = tmp_path_factory.mktemp("official")
    folder = scratch_official(mteval_data_dir.parent, tmp)
    nltk_data = punkt_tab_folder(tmp)
    saved_path, saved_seed = list(nltk.data.path), langdetect.DetectorFactory.seed
    nltk.data.path.insert(0, str(nltk_data))
    nltk.tokenize._get_punkt_tokenizer.cache_clear()
    langdetect.DetectorFactory.seed = 0
    try:
        with official_modules(folder, stub_modules()) as load:
            yield load("calculate_score.py")
    finally:
        nltk.data.path[:] = saved_path
        nltk.tokenize._get_punkt_tokenizer.cache_clear()
        langdetect.DetectorFactory.seed = saved_seed


def _write(path: Path, dialogues: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in dialogues), "utf-8")


def test_the_shipped_punkt_model_is_nltks_english_model() -> None:
    """Its four tables hash as NLTK's own punkt_tab/english files do (pinned from NLTK's data, see mteval_official)."""
    import hashlib

    tables = punkt_tab_tables()
    assert {name: hashlib.sha256(text.encode("utf-8")).hexdigest() for name, text in tables.items()} == (
        NLTK_ENGLISH_PUNKT_SHA256
    )


def test_the_reference_splits_with_nltks_loader(official: Any) -> None:
    import nltk

    text = "Mr. Brown went to Washington D.C. on Jan. 5. He met the U.S. president at 3 p.m. It rained."
    from sysbench_gpu.benchmarks.mteval.sentences import punkt_sentences

    assert nltk.tokenize.sent_tokenize(text) == punkt_sentences(text) and len(punkt_sentences(text)) == 3


def test_global_inst_verdicts_match_the_official_code(official: Any, mteval_data_dir: Path) -> None:
    cases: list[tuple[str, dict[str, Any], str]] = []
    dialogues = []
    for index, dialogue in enumerate(_dialogues(mteval_data_dir)):
        name, args = dialogue["inst_name"], dialogue["inst_args"]
        replies = list(dict.fromkeys([*POOL, *_targeted(name, args)]))
        if name == "startend:start_emoji":
            replies = [r for r in replies if r.strip()]  # the official check raises IndexError on a blank reply
        conv = []
        for number, reply in enumerate(replies):
            conv.append({"user": "u", "sys": "", "id": str(number), "do_inference": True, "gen_resp": reply})
            cases.append((name, args, reply))
        dialogues.append({"id": f"d{index}", "inst_name": name, "inst_args": args, "conv": conv})
    _write(Path("inference_outputs/recollection/multi_global-inst_mine.jsonl"), dialogues)
    theirs = {row["id"]: row["score"] for row in official.evaluate_recollection_global_inst()}
    assert len(theirs) == len(cases)

    mismatches, per_type, lenient_differs = [], Counter(), Counter()
    at = 0
    for dialogue in dialogues:
        for turn in dialogue["conv"]:
            name, args, reply = cases[at]
            at += 1
            ours = 10 if check_instruction(name, args, reply) else 0
            per_type[name] += 1
            if ours != theirs[f"{dialogue['id']}#{turn['id']}"]:
                mismatches.append((name, args, reply, ours))
            lenient_differs[name] += (10 if check_instruction(name, args, reply, "lenient") else 0) != ours
    print(f"\nglobal-inst: {len(cases)} verdicts over {len(per_type)} instruction types, {len(mismatches)} differ")
    print(f"lenient rules differ from official on {dict(+lenient_differs)}")
    assert sorted(per_type) == sorted(INSTRUCTION_NAMES)
    assert not mismatches, mismatches[:5]


def test_cls_verdicts_match_the_official_code(official: Any, mteval_data_dir: Path) -> None:
    labels = set()
    for name in ("recollection_single_cls.jsonl", "recollection_multi_cls.jsonl"):
        for line in (mteval_data_dir / name).read_text("utf-8").splitlines():
            labels |= {t["sys"] for t in json.loads(line)["conv"] if t["do_inference"]}
    labels |= {"science-fiction", "U.S. politics", "art"}
    dialogues, cases = [], []
    for index, label in enumerate(sorted(labels)):
        replies = [
            label,
            f"The category is: {label}.",
            label.upper(),
            label.title(),
            f"Category:{label.replace(' ', '  ')}",
            label.replace("-", " "),
            f"heart and {label[::-1]}",
            f"'{label}'",
            "",
        ]
        conv = [
            {"user": "u", "sys": label, "id": str(n), "do_inference": True, "gen_resp": r}
            for n, r in enumerate(replies)
        ]
        cases += [(label, r) for r in replies]
        dialogues.append({"id": f"c{index}", "conv": conv})
    _write(Path("inference_outputs/recollection/multi_cls_mine.jsonl"), dialogues)
    theirs = [row["score"] for row in official.evaluate_recollection_cls()]
    ours = [score_cls(reply, label) for label, reply in cases]
    lenient = sum(score_cls(reply, label, "lenient") != o for (label, reply), o in zip(cases, ours, strict=True))
    print(f"\ncls: {len(cases)} verdicts over {len(labels)} labels, lenient differs on {lenient}")
    assert ours == theirs
