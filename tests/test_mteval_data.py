"""MT-Eval loading: counts of every shared file, the id mapping, format detection, errors, stats and download."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sysbench_gpu.benchmarks.mteval.data import answered_ordinal, dialogue_to_json, mteval_stats, parse_dialogues
from sysbench_gpu.benchmarks.mteval.tasks import DEFAULT_SYSTEM_MESSAGE, task_from_name
from sysbench_gpu.benchmarks.registry import REGISTRY, load_dataset
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.sessions import NO_ALIGNMENT

REPO_ROOT = Path(__file__).resolve().parent.parent
MTEVAL_DIR = Path(os.environ.get("MTEVAL_SHARED", REPO_ROOT.parent / "shared" / "mteval")) / "data"

# file -> (dialogues, turns in all, answered turns, task, setting): the shared README's table.
SHARED_FILES = {
    "refinement_multi.jsonl": (40, 480, 480, "refinement", "multi"),
    "refinement_single.jsonl": (200, 200, 200, "refinement", "single"),
    "expansion_multi.jsonl": (10, 70, 70, "expansion", "multi"),
    "expansion_single.jsonl": (70, 70, 70, "expansion", "single"),
    "follow-up_multi.jsonl": (80, 400, 240, "follow-up", "multi"),
    "recollection_multi_cls.jsonl": (10, 110, 100, "recollection-cls", "multi"),
    "recollection_single_cls.jsonl": (100, 100, 100, "recollection-cls", "single"),
    "recollection_multi_global-inst.jsonl": (28, 308, 280, "recollection-global-inst", "multi"),
    "recollection_single_global-inst.jsonl": (280, 280, 280, "recollection-global-inst", "single"),
    "cls_ablation_gold.jsonl": (100, 850, 100, "cls-ablation-gold", "ablation"),
    "cls_ablation_dgc.jsonl": (100, 850, 100, "cls-ablation-dgc", "ablation"),
    "cls_ablation_sgc.jsonl": (100, 850, 100, "cls-ablation-sgc", "ablation"),
    "cls_ablation_rc.jsonl": (100, 850, 100, "cls-ablation-rc", "ablation"),
    "refinement_ablation_irrelevant-front.jsonl": (120, 1120, 720, "refinement-irrelevant-front", "ablation"),
}


def _shared(name: str) -> Path:
    path = MTEVAL_DIR / name
    if not path.is_file():
        pytest.skip(f"shared MT-Eval data not found at {MTEVAL_DIR}")
    return path


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sysbench_gpu", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def detect_format(text: str) -> str:
    """The name of the benchmark whose format ``text`` is (the registry's content detection)."""
    return REGISTRY.detect(text, Path("<text>")).name


def test_every_shared_file_is_listed() -> None:
    if not MTEVAL_DIR.is_dir():
        pytest.skip(f"shared MT-Eval data not found at {MTEVAL_DIR}")
    assert sorted(p.name for p in MTEVAL_DIR.glob("*.jsonl")) == sorted(SHARED_FILES)


@pytest.mark.parametrize("name", sorted(SHARED_FILES))
def test_shared_file_counts(name: str) -> None:
    dialogues, all_turns, answered, task, setting = SHARED_FILES[name]
    dataset = load_dataset(_shared(name))
    stats = mteval_stats(dataset.sessions)
    assert dataset.benchmark == "mteval" and not dataset.is_official
    assert (stats["n_sessions"], stats["n_conversation_turns"], stats["n_turns"]) == (dialogues, all_turns, answered)
    assert list(stats["tasks"]) == [task]
    assert stats["tasks"][task]["setting"] == [setting]
    assert [s.system_id for s in dataset.sessions] == list(range(1, dialogues + 1))  # 1-based line numbers
    assert {s.system_prompt for s in dataset.sessions} == {DEFAULT_SYSTEM_MESSAGE}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("refinement_multi.jsonl", (40, 480)),
        ("follow-up_multi.jsonl", (80, 240)),
        ("recollection_multi_global-inst.jsonl", (28, 280)),
        ("expansion_multi.jsonl", (10, 70)),
    ],
)
def test_cli_stats_json_done_when(name: str, expected: tuple[int, int]) -> None:
    result = _cli("data", "stats", str(_shared(name)), "--json")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert (stats["n_sessions"], stats["n_turns"]) == expected
    assert stats["benchmark"] == "mteval" and len(stats["sha256"]) == 64
    (task,) = stats["tasks"].values()
    assert (task["n_sessions"], task["n_turns"]) == expected


def test_cli_stats_text_names_the_task() -> None:
    result = _cli("data", "stats", str(_shared("follow-up_multi.jsonl")))
    assert result.returncode == 0, result.stderr
    assert "answered turns  240  (context turns 160, 400 in all)" in result.stdout
    assert "task follow-up" in result.stdout and "80 dialogues, 240 answered turns (3-3 per dialogue)" in result.stdout
    result = _cli("data", "validate", str(_shared("follow-up_multi.jsonl")))
    assert result.returncode == 0 and ": 80 MT-Eval dialogues (follow-up), valid (sha256 " in result.stdout


def test_turn_mapping_of_a_follow_up_dialogue() -> None:
    session = load_dataset(_shared("follow-up_multi.jsonl")).sessions[0]
    assert session.mteval.dialogue_id == "81" and session.task == "follow-up" and session.benchmark == "mteval"
    assert [t.answered for t in session.turns] == [False, False, True, True, True]
    assert [t.index for t in session.turns] == [1, 2, 3, 4, 5]
    assert session.turn(1).reference.startswith("Title: Aloha, Hawaii!")  # context: sys goes into the history
    assert session.turn(3).alignment == NO_ALIGNMENT and session.turn(3).constraints == ()
    assert [answered_ordinal(session, i) for i in (3, 4, 5)] == [1, 2, 3]
    with pytest.raises(SysbenchError, match="context turn"):
        answered_ordinal(session, 1)


def test_ids_repeat_in_cls_ablation_so_line_numbers_are_the_key() -> None:
    sessions = load_dataset(_shared("cls_ablation_gold.jsonl")).sessions
    ids = [s.mteval.dialogue_id for s in sessions]
    assert len(set(ids)) < len(ids)
    assert len({s.system_id for s in sessions}) == len(sessions)


def test_global_inst_and_single_turns_have_no_reference() -> None:
    session = load_dataset(_shared("recollection_multi_global-inst.jsonl")).sessions[0]
    assert session.mteval.inst_name == "startend:start_char" and session.mteval.inst_args == {"letter": "o"}
    assert session.turn(1).reference == "ok." and not session.turn(1).answered
    assert all(t.reference is None for t in session.turns if t.answered)  # empty sys of an answered turn


def test_task_from_names() -> None:
    assert task_from_name("refinement_multi") == ("refinement", "multi")
    assert task_from_name("/x/follow-up_single.jsonl") == ("follow-up", "single")
    assert task_from_name("recollection_multi_global-inst.jsonl") == ("recollection-global-inst", "multi")
    assert task_from_name("recollection_single_cls") == ("recollection-cls", "single")
    assert task_from_name("cls_ablation_sgc.jsonl") == ("cls-ablation-sgc", "ablation")
    assert task_from_name("refinement_ablation_irrelevant-between.jsonl") == (
        "refinement-irrelevant-between",
        "ablation",
    )
    assert task_from_name("expansion") == ("expansion", "")
    assert task_from_name("sessions.jsonl") is None


DIALOGUE = {
    "id": "d1",
    "conv": [
        {"user": "Context question", "sys": "Context answer", "id": "c", "do_inference": False},
        {"user": "Question one", "sys": "Gold one", "id": "a1", "do_inference": True},
        {"user": "Question two", "sys": "Gold two", "id": "a2", "do_inference": True},
    ],
}


def _lines(*objects: dict) -> str:
    return "\n".join(json.dumps(o) for o in objects) + "\n"


def test_system_message_default_override_and_none() -> None:
    text = _lines(DIALOGUE)
    assert parse_dialogues(text, task="follow-up")[0].system_prompt == DEFAULT_SYSTEM_MESSAGE
    assert parse_dialogues(text, task="follow-up", system_message="Be brief.")[0].system_prompt == "Be brief."
    assert parse_dialogues(text, task="follow-up", system_message="")[0].system_prompt == ""


def test_snapshot_round_trip_keeps_ids_task_and_system_message() -> None:
    sessions = load_dataset(_shared("refinement_ablation_irrelevant-front.jsonl"), system_message="S").sessions
    subset = [sessions[4], sessions[90]]
    text = _lines(*(dialogue_to_json(s) for s in subset))
    again = parse_dialogues(text, source="run/sessions.jsonl")  # the file name says nothing: the snapshot does
    assert again == subset
    assert [s.system_id for s in again] == [5, 91]


def test_format_detection() -> None:
    assert detect_format('[{"system_id": 1}]') == "sysbench"
    assert detect_format(_lines(DIALOGUE, DIALOGUE)) == "mteval"
    assert detect_format(json.dumps(DIALOGUE)) == "mteval"
    assert detect_format('\ufeff  {"conv": []}') == "mteval"
    assert detect_format('{\n  "system_id": 1\n}') == "sysbench"  # one pretty-printed object, not a dialogue


def _load_error(tmp_path: Path, text: str, name: str = "follow-up_multi.jsonl", **kwargs) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SysbenchError) as caught:
        load_dataset(path, **kwargs)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message
    return message


def test_errors_name_file_line_dialogue_turn_and_field(tmp_path: Path) -> None:
    def changed(turn: int, **fields) -> dict:
        dialogue = json.loads(json.dumps(DIALOGUE))
        dialogue["conv"][turn - 1].update(fields)
        return dialogue

    good = json.dumps(DIALOGUE)
    assert "line 2: not valid JSON" in _load_error(tmp_path, good + "\n{broken\n")
    assert "line 2: is list" in _load_error(tmp_path, good + "\n[1, 2]\n")
    message = _load_error(tmp_path, _lines(DIALOGUE, changed(2, do_inference="yes")))
    assert "line 2, dialogue 'd1', turn 2, field 'do_inference'" in message
    assert "turn 3, field 'sys'" in _load_error(tmp_path, _lines(changed(3, sys=None)))
    assert "turn 1, field 'user'" in _load_error(tmp_path, _lines(changed(1, user="  ")))
    no_conv = {"id": "x", "conv": []}
    assert "line 1, dialogue 'x', field 'conv'" in _load_error(tmp_path, _lines(no_conv))
    nothing_answered = {"id": "y", "conv": [DIALOGUE["conv"][0]]}
    assert "no turn has do_inference true" in _load_error(tmp_path, _lines(nothing_answered))
    assert "field 'id': missing" in _load_error(tmp_path, _lines({"conv": DIALOGUE["conv"]}))
    # task-specific needs: a cls turn needs its gold label, a refinement turn its instruction
    assert "field 'sys': a classification turn needs its gold label" in _load_error(
        tmp_path, _lines(changed(2, sys="")), name="recollection_multi_cls.jsonl"
    )
    assert "turn 2, field 'inst'" in _load_error(tmp_path, _lines(DIALOGUE), name="refinement_multi.jsonl")
    bad_inst = {**DIALOGUE, "inst_name": "startend:nothing", "inst_args": {}}
    assert "field 'inst_name'" in _load_error(tmp_path, _lines(bad_inst), name="recollection_multi_global-inst.jsonl")
    bad_args = {**DIALOGUE, "inst_name": "language:response_language", "inst_args": {"lang": "Klingon"}}
    assert "field 'inst_args'" in _load_error(tmp_path, _lines(bad_args), name="recollection_multi_global-inst.jsonl")
    repeated = {**DIALOGUE, "system_id": 1}
    assert "field 'system_id' 1 repeats line 1" in _load_error(tmp_path, _lines(repeated, repeated))


def test_unknown_task_and_undecidable_file(tmp_path: Path) -> None:
    assert "cannot tell the MT-Eval task" in _load_error(tmp_path, _lines(DIALOGUE), name="mystery.jsonl")
    assert "unknown MT-Eval task 'poetry'" in _load_error(tmp_path, _lines(DIALOGUE), name="x.jsonl", task="poetry")
    path = tmp_path / "mystery.jsonl"
    assert load_dataset(path, task="follow-up_multi").sessions[0].task == "follow-up"
    assert "neither a SysBench file" in _load_error(tmp_path, '{\n "a": 1\n}\n', name="object.json")
    assert "neither a SysBench file" in _load_error(tmp_path, json.dumps([DIALOGUE]), name="array.json")


def test_sysbench_files_refuse_mteval_options(sessions_file: Path) -> None:
    with pytest.raises(SysbenchError, match="--system-message applies to MT-Eval files only"):
        load_dataset(sessions_file, system_message="x")


def test_download_offline_is_one_line(tmp_path: Path) -> None:
    result = _cli(
        "data",
        "download",
        "--benchmark",
        "mteval",
        "--out",
        str(tmp_path / "never-written"),
        env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")},
    )
    assert result.returncode == 2
    assert result.stderr.startswith(
        "error: could not download refinement_multi.jsonl of the Hugging Face dataset "
        "wckwan/MT-Eval: HF_HUB_OFFLINE is set"
    )
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert not (tmp_path / "never-written").exists()


def test_download_refuses_unknown_config(tmp_path: Path) -> None:
    result = _cli("data", "download", "--benchmark", "mteval", "--tasks", "poetry_multi", "--out", str(tmp_path))
    assert result.returncode == 2 and "unknown MT-Eval config(s) poetry_multi" in result.stderr


def test_mteval_stats_do_not_import_torch() -> None:
    code = (
        "import sys; from sysbench_gpu.cli import main; "
        f"main(['data', 'stats', {str(_shared('expansion_multi.jsonl'))!r}, '--json']); "
        "heavy = [m for m in ('torch', 'vllm', 'transformers', 'openai', 'matplotlib') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
