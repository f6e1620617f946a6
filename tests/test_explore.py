"""explore: the static site's data (runs, sessions, attention tokens), the CLI, report's link, and a real browser.

Fixture: GPT-4o's published run (import-upstream) beside a small SmolLM2 run (two
sessions, hand-written replies and verdicts, one turn not judged) with attention
measured in both arms at layers 2 and 5 (early layers keep the CPU forwards short).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from mteval_runs import judge_with_markers, make_mteval_run
from test_mteval_judge_stage import _global_inst_reply

from sysbench_gpu.benchmarks.registry import load_run_sessions, save_run_sessions
from sysbench_gpu.cli import main
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord, Verdict
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.explore import scripts
from sysbench_gpu.explore import site as explore
from sysbench_gpu.explore.arena import ARENA_ASSETS
from sysbench_gpu.judging.stage import judge_run

ASSETS = Path(explore.__file__).resolve().parent / "assets"
HOSTILE = '</script><script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"> & <b>'
EMOJI_REPLY = "好的，明白了 😀\n第二行  两个空格"


def _reply(system_id: int, turn: int) -> str:
    if (system_id, turn) == (1, 2):
        return "Sure. " + HOSTILE
    if (system_id, turn) == (1, 3):
        return EMOJI_REPLY
    return f"Reply {turn} of session {system_id}."


def _verdict(system_id: int, turn: int, constraint) -> Verdict:
    if (system_id, turn) == (1, 2) and constraint.id == 1:
        return Verdict(raw="否", value="no", type=constraint.type)
    if (system_id, turn) == (1, 3) and constraint.id == 1:
        return Verdict(raw="不适用", value="other", type=constraint.type)
    return Verdict(raw="是", value="yes", type=constraint.type)


def short(session):
    """Shortened texts keep the CPU forwards of the attention stage small (the explorer shows them as the run's own)."""
    turns = tuple(dataclasses.replace(t, user=t.user[:40]) for t in session.turns)
    return dataclasses.replace(session, system_prompt=session.system_prompt[:90], turns=turns)


def make_small_run(path: Path, dataset, sessions) -> Path:
    """Session 1 fails turn 2 (constraint 1); session 2 passes but its turn 5 is not judged: a partial run."""
    run = RunDir(path)
    run.update_manifest(stage="generate", model="smollm2")
    save_run_sessions(run, sessions, dataset)
    run.generations.append(
        GenerationRecord(
            system_id=s.system_id,
            turn=t.index,
            user=t.user,
            response=_reply(s.system_id, t.index),
            model="smollm2",
            finish_reason="stop",
        )
        for s in sessions
        for t in s.turns
    )
    run.judgments.append(
        JudgmentRecord(
            system_id=s.system_id,
            turn=t.index,
            verdicts={str(c.id): _verdict(s.system_id, t.index, c) for c in t.constraints},
            reasoning=f"Reasoning for turn {t.index}: " + ("<b>not bold</b>" if t.index == 2 else "fine"),
            judge_model="stub-judge",
        )
        for s in sessions
        for t in s.turns
        if (s.system_id, t.index) != (2, 5)
    )
    return path


@pytest.fixture(scope="module")
def fixture_runs(tmp_path_factory, shared_dir, dataset, smollm2_path):
    root = tmp_path_factory.mktemp("explore")
    upstream = root / "gpt4o"
    workbook = shared_dir / "upstream-results" / "gpt4o" / "gpt4o_analysis.xlsx"
    assert main(["import-upstream", str(workbook), "--out", str(upstream)]) == 0
    small = make_small_run(root / "smol", dataset, [short(s) for s in dataset.select(limit=2)])
    attention = root / "attn"
    assert (
        main(
            [
                "attention",
                str(small),
                "--model",
                "smollm2",
                "--out",
                str(attention),
                "--control",
                "--layers",
                "2,5",
                "--no-figures",
                "--bootstrap",
                "20",
            ]
        )
        == 0
    )  # early layers: short forwards
    site = root / "site"
    summary = explore.build_site([upstream, small], site, [attention], resamples=200, progress=False)
    return {
        "root": root,
        "upstream": upstream,
        "small": small,
        "attention": attention,
        "site": site,
        "summary": summary,
    }


def _index(site: Path) -> dict:
    return scripts.read_data_file(site / "data" / "index.js")


def _session(site: Path, kind: str, system_id: int | str, benchmark: str = "sysbench") -> dict:
    """A session's data file by its id (with its scope, e.g. ``refinement-1``) and benchmark."""
    return scripts.read_data_file(site / explore.session_file(kind, f"{benchmark}-{system_id}"))


# ---------------------------------------------------------------- data


def test_index_lists_every_session_under_its_system_id(fixture_runs, dataset):
    site = fixture_runs["site"]
    index = _index(site)
    assert set(index["sessions"]) == {f"sysbench-{s.system_id}" for s in dataset.sessions}
    assert index["order"] == [f"sysbench-{i}" for i in sorted(s.system_id for s in dataset.sessions)]
    gpt4o, small = index["runs"]
    assert (gpt4o["label"], gpt4o["status"]) == ("gpt4o", "complete")
    assert round(100 * gpt4o["metrics"]["csr"], 1) == 87.1 and round(100 * gpt4o["metrics"]["ssr"], 1) == 54.4
    low, high = gpt4o["metrics"]["ci95"]["isr"]
    assert low < gpt4o["metrics"]["isr"] < high
    # The small run misses a judgment: shown as partial, with the reason, not a crash.
    assert small["status"] == "partial" and "session 2, turn 5" in small["note"]
    assert small["metrics"]["n_turns"] == 9 and small["judge_model"] == "stub-judge"

    row = index["sessions"]["sysbench-1"]
    session = dataset.by_id()[1]
    assert row["id"] == 1 and row["group"] == session.group and row["domain"] == session.domain
    assert row["alignment"] == "".join("M" if t.alignment == "misaligned" else "A" for t in session.turns)
    assert row["attention"] == ["system", "control"]
    assert row["runs"][1] == {
        "judged": 5,
        "passed": 4,
        "generated": 5,
        "first_fail": 2,
        "leading": 1,
        "failed_types": [session.turn(2).constraints[0].type],
    }
    assert index["sessions"]["sysbench-2"]["runs"][1]["judged"] == 4
    assert index["sessions"]["sysbench-3"]["runs"][1] is None and index["sessions"]["sysbench-3"]["attention"] == []
    assert fixture_runs["summary"]["n_sessions_with_attention"] == 2
    assert not (site / "data" / "attention" / "sysbench-3.js").exists()


def test_session_file_has_texts_replies_and_verdicts_of_each_run(fixture_runs, dataset):
    detail = _session(fixture_runs["site"], "sessions", 1)
    session = dataset.by_id()[1]
    assert detail["id"] == 1 and detail["system"] == session.system_prompt
    # The small run stores shortened texts: flagged, with its own system and user messages kept.
    assert detail["runs_with_other_text"] == ["smol"]
    assert detail["system_by_run"] == [None, short(session).system_prompt]
    turn2 = detail["turns"][1]
    assert turn2["user"] == session.turn(2).user and turn2["runs"][1]["user"] == session.turn(2).user[:40]
    assert "user" not in turn2["runs"][0]
    assert [c["content"] for c in turn2["constraints"]] == [c.content for c in session.turn(2).constraints]
    upstream, small = turn2["runs"]
    gpt4o_generation = RunDir(fixture_runs["upstream"]).generations.read()[(1, 2)]
    assert upstream["reply"] == gpt4o_generation.response and upstream["judgment"]["parse"] == "imported"
    assert small["reply"] == "Sure. " + HOSTILE
    assert small["judgment"]["passed"] is False
    assert small["judgment"]["verdicts"][0] == {"id": "1", "value": "no"}  # raw 否 and the checklist's type
    assert small["judgment"]["reasoning"].endswith("<b>not bold</b>")
    assert detail["turns"][2]["runs"][1]["judgment"]["verdicts"][0] == {"id": "1", "value": "other", "raw": "不适用"}
    assert small["finish"] == "stop" and "status" not in small and "finish" not in upstream
    assert _session(fixture_runs["site"], "sessions", 2)["turns"][4]["runs"][1]["judgment"] is None


def test_attention_tokens_decode_and_values_match_the_stored_shares(fixture_runs, smollm2_path):
    from transformers import AutoTokenizer

    from sysbench_gpu.attention.files.store import load_session, session_path
    from sysbench_gpu.attention.files.turn_table import token_series, turn_shares
    from sysbench_gpu.explore.attention import dequantize, utf16_length

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    data = _session(fixture_runs["site"], "attention", 1)
    index = _index(fixture_runs["site"])
    (entry,) = data["sources"]
    source = index["attention"][entry["source"]]
    assert source["run"] == "smol" and [layer["label"] for layer in source["layers"]] == ["layer2", "layer5"]
    assert set(entry["arms"]) == {"system", "control"}
    for arm_name, arm in entry["arms"].items():
        stored = load_session(session_path(fixture_runs["attention"], 1, arm_name))
        ids = stored["token_ids"].tolist()
        assert arm["text"] == tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        assert len(arm["lengths"]) == len(ids) and sum(arm["lengths"]) == utf16_length(arm["text"])
        assert EMOJI_REPLY in arm["text"] and HOSTILE in arm["text"]
        for position, layer in enumerate(source["layers"]):
            share, excl = token_series(stored["shares"][position])
            assert np.max(np.abs(dequantize(arm["values"][layer["label"]]["share"]) - share)) <= 0.5 / 255 + 1e-9
            assert np.max(np.abs(dequantize(arm["values"][layer["label"]]["excl"]) - excl)) <= 0.5 / 255 + 1e-9
            rows = [r for r in turn_shares(stored) if r.layer == layer["index"]]
            means = arm["turn_means"][layer["label"]]
            assert [m["turn"] for m in means] == [r.turn for r in rows] == [1, 2, 3, 4, 5]
            assert np.allclose([m["reply_excl"] for m in means], [r.reply_share_excl_lead for r in rows], atol=1e-5)
        assert arm["system"] == stored["system"].tolist() and arm["turns"] == stored["turns"].tolist()
    # The system span holds the system text: as the system message, and inside the first user message in the control.
    system_prompt = load_run_sessions(RunDir(fixture_runs["small"]))[0].system_prompt
    for arm_name, role in (("system", "system"), ("control", "user")):
        arm = entry["arms"][arm_name]
        offsets = np.concatenate([[0], np.cumsum(arm["lengths"])])
        start, end = arm["system"]
        assert system_prompt.strip()[:40] in arm["text"][offsets[start] : offsets[end]]
        assert arm["text"][: offsets[start]].rstrip().endswith(role)


def test_token_pieces_keep_multibyte_characters_whole(smollm2_path):
    from sysbench_gpu.explore.attention import TokenText

    text = TokenText(smollm2_path)
    sample = "<|im_start|>system\n武汉美食 😀 café  two  spaces\n\n<|im_end|>"
    ids = text.tokenizer(sample, add_special_tokens=False)["input_ids"]
    for pieces in (text.pieces(ids), text.incremental_pieces(ids)):
        assert "".join(pieces) == sample and len(pieces) == len(ids)
        assert not any("\ufffd" in piece for piece in pieces)
        # Byte-level tokens inside one character own nothing; the character stays whole in one token.
        assert sum("😀" in piece for piece in pieces) == 1 and "" in pieces


def test_data_files_are_inert_scripts():
    payload = {"reply": HOSTILE + "\u2028\u2029", "n": 1}
    script = scripts.keyed_assignment(explore.SESSIONS_GLOBAL, 7, payload).decode("utf-8")
    assert "</script" not in script.lower() and "\u2028" not in script
    assert script.startswith(f"window.{explore.SESSIONS_GLOBAL} = window.{explore.SESSIONS_GLOBAL} || {{}};\n")
    path = Path(tempfile.mkdtemp()) / "7.js"
    path.write_text(script, encoding="utf-8")
    assert scripts.read_data_file(path) == payload
    # The pages put data into the document as text only.
    asset_scripts = sorted(ASSETS.glob("*.js"))
    shipped = {*explore.ASSETS, *ARENA_ASSETS}
    assert [p.name for p in asset_scripts] == sorted(n for n in shipped if n.endswith(".js"))
    for script in asset_scripts:
        code = script.read_text(encoding="utf-8")
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in code, f"{script.name} uses {sink}"
    for page in ("index.html", "session.html", "arena.html"):
        assert "Content-Security-Policy" in (ASSETS / page).read_text(encoding="utf-8")


def test_cli_rebuild_removes_stale_sessions_and_refuses_foreign_folders(fixture_runs, tmp_path, capsys):
    site = tmp_path / "site"
    shutil.copytree(fixture_runs["site"], site)
    assert main(["explore", str(fixture_runs["small"]), "--out", str(site), "--resamples", "50"]) == 0
    printed = capsys.readouterr().out
    assert "1 run(s), 2 sessions (0 with attention)" in printed
    assert sorted(p.name for p in (site / "data" / "sessions").iterdir()) == ["sysbench-1.js", "sysbench-2.js"]
    assert list((site / "data" / "attention").iterdir()) == []
    manifest = json.loads((site / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["runs"][0]["status"] == "partial" and manifest["metrics"]["resamples"] == 50
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep", encoding="utf-8")
    assert main(["explore", str(fixture_runs["small"]), "--out", str(foreign)]) == 2
    assert "is not empty and is not an earlier explorer site" in capsys.readouterr().err
    assert (foreign / "mine.txt").read_text(encoding="utf-8") == "keep"
    assert main(["explore", str(tmp_path / "missing"), "--out", str(tmp_path / "s2")]) == 2
    assert "no such run directory" in capsys.readouterr().err


def test_missing_tokenizer_is_one_line_and_writes_nothing(fixture_runs, tmp_path):
    attention = tmp_path / "attn"
    shutil.copytree(fixture_runs["attention"], attention)
    manifest = json.loads((attention / "manifest.json").read_text(encoding="utf-8"))
    (tmp_path / "no-model").mkdir()
    manifest.update(model_path=str(tmp_path / "no-model"), model=str(tmp_path / "no-model"))
    (attention / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(SysbenchError) as error:
        explore.build_site([fixture_runs["small"]], tmp_path / "site", [attention], resamples=20, progress=False)
    assert "could not load the tokenizer" in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "site").exists()


def test_unjudged_run_is_shown_not_fatal(tmp_path, dataset):
    run = RunDir(tmp_path / "fresh")
    sessions = dataset.select(limit=1)
    run.update_manifest(stage="generate", model="m")
    save_run_sessions(run, sessions, dataset)
    run.generations.append([GenerationRecord(system_id=sessions[0].system_id, turn=1, user="u", response="r")])
    explore.build_site([run.path], tmp_path / "site", resamples=20, progress=False)
    index = _index(tmp_path / "site")
    (summary,) = index["runs"]
    assert summary["status"] in ("partial", "unscored") and summary["note"]
    assert index["sessions"][f"sysbench-{sessions[0].system_id}"]["runs"][0]["judged"] == 0


def test_report_links_an_explorer_built_beside_it(fixture_runs, tmp_path):
    report_dir = tmp_path / "report"
    assert (
        main(["report", str(fixture_runs["upstream"]), "--out", str(report_dir), "--no-figures", "--resamples", "20"])
        == 0
    )
    assert "Explorer" not in (report_dir / "report.md").read_text(encoding="utf-8")
    shutil.copytree(fixture_runs["site"], tmp_path / explore.EXPLORER_DIRNAME)
    assert (
        main(["report", str(fixture_runs["upstream"]), "--out", str(report_dir), "--no-figures", "--resamples", "20"])
        == 0
    )
    text = (report_dir / "report.md").read_text(encoding="utf-8")
    assert "Explorer: [../explore/index.html](../explore/index.html)" in text
    assert (report_dir / "../explore/index.html").resolve().is_file()
    assert json.loads((report_dir / "report.json").read_text(encoding="utf-8"))["explorer"] == "../explore/index.html"


# ---------------------------------------------------------------- MT-Eval beside SysBench


def _marked_score(session, turn: int) -> str:
    """A refinement reply the marker judge scores 2..10 by its turn: turn t gets (t % 9) + 2."""
    return f"A reply. SCORE{turn % 9 + 2}"


@pytest.fixture(scope="module")
def mixed_site(tmp_path_factory, dataset, mteval_data_dir):
    """The small SysBench run beside two MT-Eval runs whose dialogue ids (1, 17, 21; 1, 2) meet session 1."""
    root = tmp_path_factory.mktemp("explore-mixed")
    small = make_small_run(root / "smol", dataset, [short(s) for s in dataset.select(limit=2)])
    recollection = make_mteval_run(
        root / "gi",
        mteval_data_dir / "recollection_multi_global-inst.jsonl",
        [1, 17, 21],
        _global_inst_reply,
        model="toy",
    )
    judge_run(recollection, None, None, show_progress=False)  # rules: 10 or 0, no judge
    refinement = make_mteval_run(
        root / "ref", mteval_data_dir / "refinement_multi.jsonl", [1, 2], _marked_score, model="toy"
    )
    judge_with_markers(refinement)
    site = root / "site"
    explore.build_site([small, recollection.path, refinement.path], site, resamples=50, progress=False)
    return {"site": site, "gi": recollection, "ref": refinement}


def test_mteval_run_shows_its_scores_per_task_and_turn(mixed_site):
    site = mixed_site["site"]
    index = _index(site)
    smol, gi, ref = index["runs"]
    assert [r["benchmark"] for r in index["runs"]] == ["sysbench", "mteval", "mteval"]
    assert gi["status"] == "complete" and ref["status"] == "complete"
    assert gi["metrics"]["tasks"]["recollection-global-inst"]["score"] == pytest.approx(190 / 30)
    cells = {cell["label"]: cell for cell in gi["cells"]}
    assert cells["Overall"]["value"] == pytest.approx(190 / 30) and cells["Overall"]["kind"] == "score"
    assert cells["recollection-global-inst"]["detail"].startswith("by turn: 10 · 10 · 10 · 6.7 · 6.7 · 6.7 · 3.3")
    assert "recollection (category)" not in cells  # its one task here
    assert "CSR" not in cells and "CSR" in {cell["label"] for cell in smol["cells"]}
    assert index["benchmarks"]["mteval"]["outcome"] == "score" and index["benchmarks"]["mteval"]["unit"] == "dialogue"
    assert index["benchmarks"]["sysbench"]["outcome"] == "checklist"

    # Dialogue 1 follows the instruction on 3 of its 10 answered turns, dialogue 17 on all of them.
    row = index["sessions"]["mteval-recollection-global-inst-1"]
    assert row["task"] == "recollection-global-inst" and row["category"] == "recollection" and row["n_answered"] == 10
    summary = row["runs"][1]
    assert summary["judged"] == 10 and summary["generated"] == 10
    assert summary["scores"] == [10.0] * 3 + [0.0] * 7 and summary["score"] == 3.0 and summary["lowest"] == 0.0
    assert index["sessions"]["mteval-recollection-global-inst-17"]["runs"][1]["score"] == 10.0
    assert index["sessions"]["mteval-refinement-2"]["runs"][2]["judged"] > 0

    # Each answered turn's record carries the score judgments.jsonl holds, and who gave it.
    runs = ((mixed_site["gi"], "recollection-global-inst-1", 1), (mixed_site["ref"], "refinement-1", 2))
    for run, key, position in runs:
        detail = _session(site, "sessions", key, "mteval")
        stored = run.judgments.read()
        answered = [turn for turn in detail["turns"] if turn.get("answered", True)]
        assert len(answered) == len([k for k in stored if k[0] == 1]) > 0
        for turn in answered:
            judgment = turn["runs"][position]["judgment"]
            record = stored[(1, turn["turn"])]
            assert judgment["score"] == record.score and judgment["scale"] == 10.0
            assert judgment["reasoning"] == record.reasoning and "verdicts" not in judgment
        for turn in detail["turns"]:
            if turn.get("answered", True) is False:
                assert turn["runs"][position]["judgment"] is None and turn["context"][0]["label"] == "Context turn"
    gi_turn = _session(site, "sessions", "recollection-global-inst-1", "mteval")["turns"][1]
    assert gi_turn["runs"][1]["judgment"]["scorer"].startswith("rule ifeval")
    assert gi_turn["context"][0]["label"] == "Instruction of every answered turn"
    ref_turn = next(t for t in _session(site, "sessions", "refinement-1", "mteval")["turns"] if t.get("answered", True))
    assert ref_turn["runs"][2]["judgment"]["scorer"] == "judge" and ref_turn["runs"][2]["judgment"]["score"] >= 2
    assert ref_turn["runs"][2]["judgment"]["reasoning_title"] == "Judge's rationale"
    assert ref_turn["context"][0]["label"] == "Judged against"


def test_sysbench_session_and_mteval_dialogue_with_one_id_stay_apart(mixed_site, dataset):
    site = mixed_site["site"]
    index = _index(site)
    assert index["order"] == [
        "sysbench-1",
        "sysbench-2",
        "mteval-recollection-global-inst-1",
        "mteval-recollection-global-inst-17",
        "mteval-recollection-global-inst-21",
        "mteval-refinement-1",
        "mteval-refinement-2",
    ]
    assert sorted(p.name for p in (site / "data" / "sessions").iterdir()) == sorted(f"{k}.js" for k in index["order"])
    session, dialogue, other = (
        index["sessions"][k] for k in ("sysbench-1", "mteval-recollection-global-inst-1", "mteval-refinement-1")
    )
    assert (session["id"], dialogue["id"], other["id"]) == (1, 1, 1)
    assert [r is not None for r in session["runs"]] == [True, False, False]
    assert [r is not None for r in dialogue["runs"]] == [False, True, False]
    assert [r is not None for r in other["runs"]] == [False, False, True]
    # SysBench shows as it does alone: verdicts per constraint, pass or fail, failed types, first failing turn.
    assert session["runs"][0] == {
        "judged": 5,
        "passed": 4,
        "generated": 5,
        "first_fail": 2,
        "leading": 1,
        "failed_types": [dataset.by_id()[1].turn(2).constraints[0].type],
    }
    assert session["domain"] == dataset.by_id()[1].domain and "task" not in session
    sysbench_page = _session(site, "sessions", 1)
    assert sysbench_page["benchmark"] == "sysbench" and sysbench_page["runs_with_other_text"] == []
    assert sysbench_page["turns"][1]["runs"][0]["judgment"]["verdicts"][0] == {"id": "1", "value": "no"}
    assert "score" not in sysbench_page["turns"][1]["runs"][0]["judgment"]
    assert [r is None for r in sysbench_page["turns"][0]["runs"]] == [False, True, True]
    mteval_page = _session(site, "sessions", "recollection-global-inst-1", "mteval")
    assert mteval_page["benchmark"] == "mteval" and mteval_page["system"] != sysbench_page["system"]
    assert [r is None for r in mteval_page["turns"][1]["runs"]] == [True, False, True]


def test_explore_never_asks_a_benchmark_its_name():
    pattern = re.compile(r"""["'](sysbench|mteval)["']""")
    folder = Path(explore.__file__).resolve().parent
    for path in [*folder.glob("*.py"), *(folder / "assets").glob("*")]:
        assert not pattern.search(path.read_text(encoding="utf-8")), path.name


# ---------------------------------------------------------------- a real browser


def _browser_paths() -> tuple[str, str] | None:
    binary = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    driver = shutil.which("chromedriver")
    return (binary, driver) if binary and driver else None


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    paths = _browser_paths()
    if paths is None:
        pytest.skip(
            "no headless browser: install Debian's chromium and chromium-driver "
            "(apt-get install chromium chromium-driver)"
        )
    options = Options()
    options.binary_location = paths[0]
    profile = tempfile.mkdtemp(prefix="explore-chromium-")
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # console errors, CSP refusals included
    try:
        driver = webdriver.Chrome(service=Service(paths[1]), options=options)
    except WebDriverException as error:
        pytest.skip(f"chromium did not start: {str(error).splitlines()[0]}")
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def _screenshot(driver, tmp_path: Path, name: str, element: str | None = None) -> Path:
    """A screenshot of the page (or of one element) into tmp, and into $SYSBENCH_EXPLORE_SHOTS when set."""
    from selenium.webdriver.common.by import By

    height = min(6000, driver.execute_script("return document.documentElement.scrollHeight"))
    driver.set_window_size(1400, max(height, 600))
    path = tmp_path / f"{name}.png"
    if element:
        driver.find_element(By.ID, element).screenshot(str(path))
    else:
        driver.save_screenshot(str(path))
    driver.set_window_size(1400, 1000)
    if os.environ.get("SYSBENCH_EXPLORE_SHOTS"):
        folder = Path(os.environ["SYSBENCH_EXPLORE_SHOTS"])
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, folder / path.name)
    assert path.stat().st_size > 10_000
    return path


def _wait(driver, condition, timeout: float = 20.0):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # A click that loads the next page can leave an element of the old page in hand: look again.
    waiting = WebDriverWait(driver, timeout, ignored_exceptions=(StaleElementReferenceException,))
    return waiting.until(lambda d: condition(d))


def _rgba(text: str) -> tuple[float, float, float, float]:
    numbers = [float(x) for x in re.findall(r"[\d.]+", text)]
    return tuple(numbers + [1.0] * (4 - len(numbers)))  # rgb() has no alpha


def test_browser_index_filter_session_and_attention_arms(browser, fixture_runs, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    site = fixture_runs["site"]
    driver = browser
    driver.get((site / "index.html").as_uri())
    _wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#sessions tbody tr")) == 500)
    assert driver.find_element(By.ID, "error").get_attribute("hidden") is not None
    runs = driver.find_elements(By.CSS_SELECTOR, "#runs-table tbody tr")
    assert [r.get_attribute("data-status") for r in runs] == ["complete", "partial"]
    assert "87.1" in runs[0].text and "[" in runs[0].text
    _screenshot(driver, tmp_path, "explore-index")

    # The small run's failing sessions: only session 1 (session 2 passes what is judged).
    Select(driver.find_element(By.ID, "f-run")).select_by_visible_text("smol")
    Select(driver.find_element(By.ID, "f-outcome")).select_by_value("failing")
    _wait(driver, lambda d: d.find_element(By.ID, "count").text.startswith("showing 1 of 500"))
    (row,) = driver.find_elements(By.CSS_SELECTOR, "#sessions tbody tr")
    assert row.get_attribute("data-id") == "1" and "2" in row.text
    Select(driver.find_element(By.ID, "f-outcome")).select_by_value("incomplete")  # session 2: turn 5 not judged
    _wait(
        driver,
        lambda d: [r.get_attribute("data-id") for r in d.find_elements(By.CSS_SELECTOR, "#sessions tbody tr")] == ["2"],
    )
    Select(driver.find_element(By.ID, "f-outcome")).select_by_value("failing")
    assert "outcome=failing" in driver.current_url
    # Sorting by the first failing turn over gpt4o's failing sessions puts turn 1 failures first.
    Select(driver.find_element(By.ID, "f-run")).select_by_visible_text("gpt4o")
    driver.find_element(By.CSS_SELECTOR, "th[data-key=first_fail]").click()
    first = driver.find_elements(By.CSS_SELECTOR, "#sessions tbody tr td:nth-child(7)")[0].text
    assert first == "1"
    Select(driver.find_element(By.ID, "f-run")).select_by_visible_text("smol")
    _wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#sessions tbody tr")) == 1)
    row = driver.find_element(By.CSS_SELECTOR, "#sessions tbody tr")
    row.find_element(By.CSS_SELECTOR, "a.session-link").click()

    _wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "article.turn")) == 5)
    assert driver.find_element(By.ID, "title").text == "Session 1"
    turn2 = driver.find_element(By.ID, "turn-2")
    # The untrusted reply is shown as text, never run or parsed as HTML.
    assert HOSTILE in turn2.text.replace("\n", "")
    assert driver.execute_script("return window.__pwned === undefined")
    assert driver.find_elements(By.CSS_SELECTOR, "#turns img, #turns b, #turns script") == []
    # Verdicts coloured by value: the run picked on the index first (smol's "no"), gpt4o's "yes" beside it.
    assert [th.text for th in turn2.find_elements(By.CSS_SELECTOR, "table.verdicts th.c-run")] == ["smol", "gpt4o"]
    chips = turn2.find_elements(By.CSS_SELECTOR, "table.verdicts tbody tr:first-child .verdict")
    assert [chip.text for chip in chips] == ["no", "yes"]
    assert _rgba(chips[0].value_of_css_property("background-color"))[:3] == (255, 225, 222)
    assert _rgba(chips[0].value_of_css_property("color"))[:3] == (179, 38, 30)
    assert _rgba(chips[1].value_of_css_property("background-color"))[:3] == (218, 251, 225)
    other = driver.find_element(By.ID, "turn-3").find_element(By.CSS_SELECTOR, ".v-other")
    assert other.text == "other (不适用)"
    # Reasoning folded, and its markup shown as text.
    details = turn2.find_elements(By.CSS_SELECTOR, ".card")[0].find_element(By.CSS_SELECTOR, "details.reasoning")
    assert details.get_attribute("open") is None and "not bold" not in details.text
    details.find_element(By.TAG_NAME, "summary").click()
    assert "<b>not bold</b>" in details.text
    assert len(driver.find_elements(By.CSS_SELECTOR, "#turn-2 .replies .card")) == 2

    # Attention: system arm by default; colours follow the stored values on the page's scale.
    _wait(driver, lambda d: d.find_element(By.ID, "attention-section").is_displayed())
    data = _session(site, "attention", 1)["sources"][0]["arms"]
    _check_tokens(driver, data, "system")
    _screenshot(driver, tmp_path, "explore-session-turns", "turns")
    _screenshot(driver, tmp_path, "explore-session-system", "attention-section")
    driver.find_element(By.ID, "arm-control").click()
    _wait(driver, lambda d: d.find_element(By.ID, "attn-view").get_attribute("data-arm") == "control")
    _check_tokens(driver, data, "control")
    Select(driver.find_element(By.ID, "f-layer")).select_by_value("layer5")
    _wait(driver, lambda d: d.find_element(By.ID, "attn-view").get_attribute("data-layer") == "layer5")
    _check_tokens(driver, data, "control")
    _screenshot(driver, tmp_path, "explore-session-control", "attention-section")

    assert _console_errors(driver) == []

    # Runs picked for side by side stay picked on the next session.
    driver.find_element(By.ID, "run-0").click()
    _wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#turn-2 .replies .card")) == 1)
    assert "show=1" in driver.current_url
    driver.find_element(By.ID, "next").click()
    _wait(
        driver,
        lambda d: (
            d.find_element(By.ID, "title").text == "Session 2"
            and len(d.find_elements(By.CSS_SELECTOR, "article.turn")) == 5
        ),
    )
    assert len(driver.find_elements(By.CSS_SELECTOR, "#turn-1 .replies .card")) == 1
    assert driver.find_element(By.CSS_SELECTOR, "#turn-5 .card .badge").text == "not judged"
    _wait(driver, lambda d: d.find_element(By.ID, "attn-view").get_attribute("data-arm") == "system")
    assert _console_errors(driver) == []


def _console_errors(driver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def _check_tokens(driver, arms: dict, name: str) -> None:
    from selenium.webdriver.common.by import By

    from sysbench_gpu.explore.attention import dequantize

    arm = arms[name]
    view = driver.find_element(By.ID, "attn-view")
    layer, variant = view.get_attribute("data-layer"), view.get_attribute("data-variant")
    scale = float(view.get_attribute("data-scale"))
    rendered = driver.execute_script(
        "return Array.from(document.querySelectorAll('#attn-view .tok')).map(function (t) {"
        " return [t.textContent, getComputedStyle(t).backgroundColor, t.dataset.level]; });"
    )
    assert "".join(text for text, _, _ in rendered) == arm["text"]
    levels = np.rint(dequantize(arm["values"][layer][variant]) * 255).astype(int)
    assert [int(level) for _, _, level in rendered] == levels.tolist()
    # One scale for both arms: the largest value among reply tokens.
    top = 0
    for other in arms.values():
        stored = np.rint(dequantize(other["values"][layer][variant]) * 255)
        top = max([top] + [stored[a:b].max() for a, b in other["replies"] if b > a])
    expected_scale = max(top, 1) / 255
    assert scale == pytest.approx(expected_scale, abs=1e-5)
    for _, colour, level in rendered:
        red, green, blue, alpha = _rgba(colour) if "rgba" in colour else (*_rgba(colour)[:3], 1.0)
        if int(level) == 0:
            assert alpha == 0 or colour == "rgba(0, 0, 0, 0)"
            continue
        assert (red, green, blue) == (230, 85, 13)
        assert alpha == pytest.approx(min(1.0, int(level) / 255 / scale), abs=0.01)
    # The per-turn mean beside each turn is the stored exact one.
    means = {m["turn"]: m["reply_excl" if variant == "excl" else "reply_share"] for m in arm["turn_means"][layer]}
    for side in driver.find_elements(By.CSS_SELECTOR, "#attn-view .attn-side[data-turn]"):
        turn = int(side.get_attribute("data-turn"))
        assert side.find_element(By.CSS_SELECTOR, ".mean").text == f"reply mean {means[turn]:.3f}"


def test_browser_mteval_scores_beside_sysbench(browser, mixed_site, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = browser
    driver.get((mixed_site["site"] / "index.html").as_uri())
    _wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#sessions tbody tr")) == 7)
    # One run table per benchmark, each with its own headline columns.
    assert len(driver.find_elements(By.CSS_SELECTOR, "#runs-table tbody tr")) == 1
    assert len(driver.find_elements(By.CSS_SELECTOR, "#runs-table-2 tbody tr")) == 2
    heads = [th.text for th in driver.find_elements(By.CSS_SELECTOR, "#runs-table-2 th")]
    assert "Overall" in heads and "recollection-global-inst" in heads and "CSR" not in heads
    assert "6.33" in driver.find_element(By.CSS_SELECTOR, "#runs-table-2 tbody tr").text
    Select(driver.find_element(By.ID, "f-run")).select_by_visible_text("gi")
    Select(driver.find_element(By.ID, "f-bench")).select_by_visible_text("MT-Eval")
    Select(driver.find_element(By.ID, "f-f_task")).select_by_value("recollection-global-inst")
    _wait(driver, lambda d: d.find_element(By.ID, "count").text.startswith("showing 3 of 7"))
    rows = driver.find_elements(By.CSS_SELECTOR, "#sessions tbody tr")
    assert [r.get_attribute("data-key") for r in rows] == [
        "mteval-recollection-global-inst-1",
        "mteval-recollection-global-inst-17",
        "mteval-recollection-global-inst-21",
    ]
    assert "3.00" in rows[0].text and "judged: 0" not in rows[0].text
    assert {r.get_attribute("data-outcome") for r in rows} == {"scored"}
    _screenshot(driver, tmp_path, "explore-mixed-index")
    rows[0].find_element(By.CSS_SELECTOR, "a.session-link").click()

    _wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "article.turn")) == 11)
    assert driver.find_element(By.ID, "title").text == "Dialogue 1"
    assert "A context turn" in driver.find_element(By.ID, "turn-1").text
    badges = [b.text for b in driver.find_elements(By.CSS_SELECTOR, "#turns .card .badge")]
    assert badges == ["score 10 / 10"] * 3 + ["score 0 / 10"] * 7
    assert "rule ifeval" in driver.find_element(By.ID, "turn-2").text
    assert driver.find_elements(By.CSS_SELECTOR, "#turns table.verdicts") == []
    _screenshot(driver, tmp_path, "explore-mixed-dialogue", "turns")
    # Session 1 of SysBench is its own page, with its verdicts.
    driver.get((mixed_site["site"] / "session.html").as_uri() + "#id=sysbench-1")
    _wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "article.turn")) == 5)
    assert driver.find_element(By.ID, "title").text == "Session 1"
    chips = driver.find_elements(By.CSS_SELECTOR, "#turn-2 table.verdicts tbody tr:first-child .verdict")
    assert [chip.text for chip in chips] == ["no"]
    assert _console_errors(driver) == []
