"""Issue 33: every refused call stops before it writes, in one line naming the flag, file or field.

Each test runs the command as a user would (``cli.main`` with capsys, or ``python -m sysbench_gpu``)
and checks exit code 2, one ``error:`` line without a traceback, and the file system unchanged:
the whole test folder is snapshotted (every path, every file's bytes) before and after. Two tests go
over every verb the parser has: a negative ``--seed`` wherever a verb takes one, and a ``--out`` that
is one of the verb's own inputs wherever a verb writes its own ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("sklearn")

from fake_engine import FakeEngine  # noqa: E402
from openai_stub import OpenAIStub  # noqa: E402
from test_arena_stage import KEY_ENV, all_pass, fair_judge, make_run, none_pass  # noqa: E402

from sysbench_gpu.arena.prompt import DEFAULT_TEMPLATE  # noqa: E402
from sysbench_gpu.benchmarks.judge_text import template_hash  # noqa: E402
from sysbench_gpu.benchmarks.registry import demo_data_path, load_dataset  # noqa: E402
from sysbench_gpu.cli import HTTP_CLIENT_LOGGERS, build_parser, main  # noqa: E402
from sysbench_gpu.core.rundir import RunDir  # noqa: E402
from sysbench_gpu.engines.base import SamplingSpec  # noqa: E402
from sysbench_gpu.generation.run import run_generation  # noqa: E402
from sysbench_gpu.generation.settings import GenerateSettings  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- helpers


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root``: a file's bytes, None for a folder."""
    return {
        str(path.relative_to(root)): (path.read_bytes() if path.is_file() else None) for path in sorted(root.rglob("*"))
    }


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], *expected: str) -> str:
    """``argv`` exits 2 with one ``error:`` line holding every ``expected`` text, and prints nothing else."""
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    err = captured.err
    assert code == 2, (code, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in err, (text, err)
    return err


def refused_unchanged(capsys: pytest.CaptureFixture[str], root: Path, argv: list[str], *expected: str) -> str:
    before = snapshot(root)
    err = refused(capsys, argv, *expected)
    assert snapshot(root) == before, f"{argv}: the file system changed"
    return err


def leaf_verbs(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every verb of the CLI as its words (``("data", "download")``), from the parser itself."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from leaf_verbs(sub, (*prefix, name))
            return
    yield prefix


def subparser(words: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = build_parser()
    for word in words:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[word]
    return parser


def verbs_with(option: str) -> set[str]:
    return {
        " ".join(words)
        for words in leaf_verbs(build_parser())
        if any(option in action.option_strings for action in subparser(words)._actions)
    }


@pytest.fixture
def runs(tmp_path: Path) -> dict[str, str]:
    """Two judged runs of the demo sessions, and one generated but never judged."""
    unjudged = make_run(tmp_path / "unjudged", "unjudged", all_pass)
    (Path(unjudged) / "judgments.jsonl").unlink()
    return {
        "strong": make_run(tmp_path / "strong", "strong", all_pass),
        "weak": make_run(tmp_path / "weak", "weak", none_pass),
        "unjudged": unjudged,
    }


def arena_argv(*argv: str) -> list[str]:
    return ["arena", *argv, "--no-progress", "--no-figures", "--resamples", "5"]


# ----------------------------------------------------------------------------- 1. arena checks before it makes --out


def _arena_refusals(tmp_path: Path, a: str, b: str) -> list[tuple[list[str], str]]:
    judge = ["--by", "judge", "--judge", "openai", "--judge-model", "m"]
    return [
        ([a], "arena needs at least two runs"),
        ([a, str(tmp_path / "nowhere")], "nowhere"),
        ([a, b, "--by", "judge"], "--by judge needs --judge"),
        ([a, b, "--judge-model", "m"], "apply to --by judge"),
        ([a, b, "--retry-unparsed"], "apply to --by judge"),
        ([a, b, *judge, "--template", str(tmp_path / "no-template.txt")], "--template"),
        ([a, b, "--baseline", str(tmp_path / "nowhere")], "nowhere"),
        ([a, b, "--max-retries", "0"], "--max-retries"),
        ([a, b, "--concurrency", "0"], "--concurrency"),
        ([a, b, "--api-retries", "-1"], "--api-retries"),
        ([a, b, "--max-tokens", "0"], "--max-tokens"),
        ([a, b, "--timeout", "nan"], "--timeout"),
        ([a, b, "--resamples", "0"], "--resamples"),
        ([a, b, "--seed", "-1"], "--seed"),
        ([a, b, "--formats", "gif"], "gif"),
    ]


def test_a_refused_arena_makes_no_folder(runs, tmp_path, capsys) -> None:
    out = tmp_path / "arena"
    for argv, expected in _arena_refusals(tmp_path, runs["strong"], runs["weak"]):
        before = snapshot(tmp_path)
        capsys.readouterr()
        code = main(["arena", *argv, "--out", str(out), "--no-progress"])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, (argv, err)
        assert expected in err, (argv, err)
        assert not out.exists(), argv
        assert snapshot(tmp_path) == before, argv


def test_a_refused_call_on_an_arena_folder_changes_nothing_in_it(runs, tmp_path, capsys) -> None:
    out = tmp_path / "arena"
    assert main(arena_argv(runs["strong"], runs["weak"], "--out", str(out))) == 0
    for argv, expected in _arena_refusals(tmp_path, runs["strong"], runs["weak"]):
        refused_unchanged(capsys, tmp_path, ["arena", *argv, "--out", str(out), "--no-progress"], expected)
    # A mode change and a kind-of-battle change, refused after reading the folder: still nothing written.
    refused_unchanged(
        capsys,
        tmp_path,
        arena_argv(runs["strong"], "--baseline", runs["weak"], "--out", str(out)),
        "field mode",
    )


def test_arena_out_that_is_a_file_names_the_flag(runs, tmp_path, capsys) -> None:
    out = tmp_path / "arena.txt"
    out.write_text("mine")
    err = refused_unchanged(
        capsys,
        tmp_path,
        arena_argv(runs["strong"], runs["weak"], "--out", str(out)),
        "--out exists and is not a folder",
    )
    assert "a arena" not in err


# ----------------------------------------------------------------------------- 2. explore --arena MISSING


def test_explore_with_a_missing_or_foreign_arena_writes_no_site(runs, tmp_path, capsys) -> None:
    site = tmp_path / "site"
    refused_unchanged(
        capsys,
        tmp_path,
        ["explore", runs["strong"], "--arena", str(tmp_path / "missing"), "--out", str(site), "--resamples", "5"],
        "--arena",
        "missing",
    )
    refused_unchanged(
        capsys,
        tmp_path,
        ["explore", runs["strong"], "--arena", runs["weak"], "--out", str(site), "--resamples", "5"],
        "--arena",
        "not an arena folder",
    )
    assert not site.exists()


def test_explore_arena_naming_a_run_that_is_gone_writes_no_site(runs, tmp_path, capsys) -> None:
    arena = tmp_path / "arena"
    assert main(arena_argv(runs["strong"], runs["weak"], "--out", str(arena))) == 0
    (tmp_path / "weak").rename(tmp_path / "weak-moved")
    site = tmp_path / "site"
    refused_unchanged(
        capsys,
        tmp_path,
        ["explore", runs["strong"], "--arena", str(arena), "--out", str(site), "--resamples", "5"],
        "manifest.json",
        "stages.arena.runs[1]",
    )
    assert not site.exists()


def test_explore_site_and_arena_page_side_by_side_still_build(runs, tmp_path, capsys) -> None:
    arena = tmp_path / "arena"
    assert main(arena_argv(runs["strong"], runs["weak"], "--out", str(arena))) == 0
    site = tmp_path / "site"
    assert main(["explore", "--arena", str(arena), "--out", str(site)]) == 0  # the arena page alone
    assert main(["explore", runs["strong"], "--arena", str(arena), "--out", str(site), "--resamples", "5"]) == 0
    assert (site / "arena.html").is_file() and (site / "index.html").is_file()


# ----------------------------------------------------------------------------- 3 and 8. every verb with --seed


def _seed_argv(verb: str, runs: dict[str, str], tmp_path: Path) -> list[str]:
    a, b, out = runs["strong"], runs["weak"], str(tmp_path / "out")
    attention = tmp_path / "attention"
    attention.mkdir(exist_ok=True)
    return {
        "generate": ["generate", "--data", "demo", "--model", "smollm2", "--engine", "hf", "--out", out],
        "judge": ["judge", a, "--judge", "openai", "--judge-model", "m"],
        "metrics": ["metrics", a],
        "compare": ["compare", a, b],
        "report": ["report", a, b, "--out", out, "--no-figures"],
        "arena": ["arena", a, b, "--out", out, "--no-progress"],
        "attention-analyze": ["attention-analyze", str(attention)],
        "explore": ["explore", a, "--out", out],
    }[verb]


SEED_VERBS = ("generate", "judge", "metrics", "compare", "report", "arena", "attention-analyze", "explore")


def test_the_seed_table_covers_every_verb_that_takes_seed() -> None:
    assert verbs_with("--seed") == set(SEED_VERBS)


@pytest.mark.parametrize("verb", SEED_VERBS)
def test_a_negative_seed_is_refused_before_anything_is_written(verb, runs, tmp_path, capsys) -> None:
    argv = _seed_argv(verb, runs, tmp_path)
    refused_unchanged(capsys, tmp_path, [*argv, "--seed", "-1"], "--seed must be 0 or more, got -1")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("verb", "flag", "value"),
    [
        ("metrics", "--resamples", "0"),
        ("compare", "--resamples", "-3"),
        ("report", "--resamples", "0"),
        ("explore", "--resamples", "0"),
        ("arena", "--resamples", "0"),
        ("attention-analyze", "--bootstrap", "0"),
        ("attention-analyze", "--folds", "1"),
        ("attention-analyze", "--top", "0"),
    ],
)
def test_shared_counts_below_their_least_are_refused_naming_the_flag(verb, flag, value, runs, tmp_path, capsys) -> None:
    argv = _seed_argv(verb, runs, tmp_path)
    err = refused_unchanged(capsys, tmp_path, [*argv, flag, value], flag, f"got {value}")
    # One message per flag, not one for all of them.
    assert all(other not in err for other in ("--resamples", "--bootstrap", "--folds", "--top") if other != flag)


# ----------------------------------------------------------------------------- 4. a refused --template


def test_a_template_with_an_unknown_field_is_refused_before_anything(runs, tmp_path, capsys, monkeypatch) -> None:
    template = tmp_path / "template.txt"
    template.write_text(DEFAULT_TEMPLATE.replace("[System message]", "[System message] {rubric}"))
    monkeypatch.setenv(KEY_ENV, "sk-test")
    out = tmp_path / "arena"
    argv = arena_argv(
        runs["strong"],
        runs["weak"],
        "--out",
        str(out),
        *("--by", "judge", "--judge", "openai", "--judge-model", "stub-judge", "--api-key-env", KEY_ENV),
        *("--template", str(template), "--base-url", "http://127.0.0.1:9/v1"),
    )
    refused_unchanged(capsys, tmp_path, argv, f"--template {template}", "{rubric}")
    assert not out.exists()


def test_no_setting_of_a_call_stopped_before_its_first_battle_is_stored(runs, tmp_path, capsys, monkeypatch) -> None:
    """A judge that cannot start (no API key) stops the call after the checks: its template is not recorded,
    so the corrected rerun in the same folder, with another template, goes on."""
    sessions = list(load_dataset(demo_data_path()).sessions)[:1]
    pair = [
        make_run(tmp_path / "one-strong", "strong", all_pass, sessions=sessions),
        make_run(tmp_path / "one-weak", "weak", none_pass, sessions=sessions),
    ]
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text(DEFAULT_TEMPLATE)
    second.write_text(DEFAULT_TEMPLATE.replace("You compare two AI assistants.", "Compare two assistants."))
    out = tmp_path / "arena"
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)  # OpenAI itself, so the key is needed: the engine stops
    judge = ("--by", "judge", "--judge", "openai", "--judge-model", "stub-judge", "--api-key-env", KEY_ENV)
    refused(capsys, arena_argv(*pair, "--out", str(out), *judge, "--template", str(first)), KEY_ENV)
    assert not out.exists()  # made by the call, and removed again: nothing was stored in it
    (out / "judge_cache").mkdir(parents=True)  # as a call stopped by a kill at this point would leave it
    monkeypatch.setenv(KEY_ENV, "sk-test")
    with OpenAIStub(fair_judge) as stub:
        capsys.readouterr()
        code = main(
            arena_argv(*pair, "--out", str(out), *judge, "--template", str(second), "--base-url", stub.base_url)
        )
    assert code == 0, capsys.readouterr()
    section = json.loads((out / "manifest.json").read_text())["stages"]["arena"]
    assert section["template"]["sha256"] == template_hash(second.read_text())


# ----------------------------------------------------------------------------- 5. no usable verdicts


def test_an_arena_without_usable_verdicts_names_the_run_and_file_and_leaves_nothing(runs, tmp_path, capsys) -> None:
    out = tmp_path / "arena"
    unjudged = runs["unjudged"]
    refused_unchanged(
        capsys,
        tmp_path,
        arena_argv(runs["strong"], unjudged, "--out", str(out)),
        f"{unjudged}/judgments.jsonl",
        f"run {unjudged}",
    )
    assert not out.exists()
    # In an arena folder that already holds battles of other runs: nothing in it changes.
    assert main(arena_argv(runs["strong"], runs["weak"], "--out", str(out))) == 0
    refused_unchanged(
        capsys, tmp_path, arena_argv(runs["weak"], unjudged, "--out", str(out)), f"{unjudged}/judgments.jsonl"
    )


def test_an_arena_of_a_run_without_replies_names_its_generations(runs, tmp_path, capsys) -> None:
    silent = Path(make_run(tmp_path / "silent", "silent", all_pass))
    rows = [json.loads(line) for line in (silent / "generations.jsonl").read_text().splitlines()]
    for row in rows:  # every turn skipped at generation: records, but no reply
        row.update(status="skipped", response=None)
    (silent / "generations.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (silent / "judgments.jsonl").write_text("")
    out = tmp_path / "arena"
    refused_unchanged(
        capsys, tmp_path, arena_argv(runs["strong"], str(silent), "--out", str(out)), f"{silent}/generations.jsonl"
    )
    assert not out.exists()


# ----------------------------------------------------------------------------- 6. arena --out safety


def test_arena_out_is_never_an_input_run_nor_a_folder_of_another_kind(runs, tmp_path, capsys) -> None:
    a, b, other = runs["strong"], runs["weak"], runs["unjudged"]
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep")
    cases = [
        (arena_argv(a, b, "--out", a), f"--out is the input {a}"),
        (arena_argv(a, b, "--out", b), f"--out is the input {b}"),
        (arena_argv(a, "--baseline", b, "--out", b), f"--out is the input {b}"),
        (arena_argv(a, b, "--out", str(Path(a) / "arena")), f"--out is inside the input {a}"),
        (arena_argv(a, b, "--out", str(foreign)), "is not empty and is not an earlier arena"),
        (arena_argv(a, b, "--out", other), "is not empty and is not an earlier arena"),  # a run, not an input
    ]
    for argv, expected in cases:
        refused_unchanged(capsys, tmp_path, argv, expected)


def test_an_earlier_arena_folder_is_taken_up_again(runs, tmp_path, capsys) -> None:
    out = tmp_path / "arena"
    assert main(arena_argv(runs["strong"], runs["weak"], "--out", str(out))) == 0
    assert main(arena_argv(runs["strong"], runs["weak"], "--out", str(out))) == 0
    assert (out / "ratings.json").is_file()


# ----------------------------------------------------------------------------- 7. messages and logs


def _arena_subprocess(argv: list[str], base_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, KEY_ENV: "sk-test", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "sysbench_gpu", *argv, "--base-url", base_url],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_http_request_lines_show_only_with_verbose(tmp_path) -> None:
    sessions = list(load_dataset(demo_data_path()).sessions)[:1]
    pair = [
        make_run(tmp_path / "strong", "strong", all_pass, sessions=sessions),
        make_run(tmp_path / "weak", "weak", none_pass, sessions=sessions),
    ]
    judge = ["--by", "judge", "--judge", "openai", "--judge-model", "stub-judge", "--api-key-env", KEY_ENV]
    with OpenAIStub(fair_judge) as stub:
        quiet = _arena_subprocess(arena_argv(*pair, "--out", str(tmp_path / "quiet"), *judge), stub.base_url)
        loud = _arena_subprocess(["-v", *arena_argv(*pair, "--out", str(tmp_path / "loud"), *judge)], stub.base_url)
        asked = stub.request_count
    assert quiet.returncode == 0 and loud.returncode == 0, quiet.stderr + loud.stderr
    assert asked == 20  # both calls asked the judge: 5 turns in both orders, twice
    assert "HTTP Request" not in quiet.stderr and " INFO httpx" not in quiet.stderr
    assert "HTTP Request: POST" in loud.stderr


def test_main_sets_the_http_client_loggers_by_verbose(runs, capsys) -> None:
    import logging

    assert main(["metrics", runs["strong"], "--resamples", "5"]) == 0
    assert all(logging.getLogger(name).getEffectiveLevel() > logging.INFO for name in HTTP_CLIENT_LOGGERS)
    assert main(["-v", "metrics", runs["strong"], "--resamples", "5"]) == 0
    assert all(logging.getLogger(name).getEffectiveLevel() == logging.DEBUG for name in HTTP_CLIENT_LOGGERS)
    main(["metrics", runs["strong"], "--resamples", "5"])  # leave them quiet for the tests after this one


# ----------------------------------------------------------------------------- 8. --out that is an input


# Verbs with --out that do not take an input run as their folder, and why (docs/run-directory.md):
OUT_EXEMPT = {
    "generate": "its --out is the run it writes (and resumes); its input is a data file",
    "import-upstream": "its --out is the run it builds; its input is a workbook file",
    "data download": "its --out is where the data goes; it reads no run",
    "run": "its --out is the root of the runs its plan writes (each step checks its own); its input is a plan file",
    "attention-analyze": "writes beside the attention stage's files, in the input folder, by design "
    "(--out defaults to the first one)",
}


def generated_run(path: Path) -> str:
    """A run as `generate` writes it (with stats.json, which `profile` reads), from the fake engine."""
    dataset = load_dataset(demo_data_path())
    settings = GenerateSettings(model="smollm2", engine="hf", sampling=SamplingSpec(max_tokens=10))
    run_generation(FakeEngine(), dataset, dataset.select(limit=1), RunDir(path), settings, progress=False)
    return str(path)


def _out_is_input_argv(verb: str, runs: dict[str, str], tmp_path: Path) -> list[str]:
    a, b = runs["strong"], runs["weak"]
    generated = generated_run(tmp_path / "generated") if verb == "profile" else ""
    attention = tmp_path / "attention"
    attention.mkdir(exist_ok=True)
    (attention / "manifest.json").write_text("{}")
    return {
        "arena": arena_argv(a, b, "--out", a),
        "explore": ["explore", a, "--out", a, "--resamples", "5"],
        "report": ["report", a, b, "--out", b, "--no-figures", "--resamples", "5"],
        "judge": ["judge", a, "--rejudge", "--out", a, "--judge", "openai", "--judge-model", "stub-judge"],
        "attention": ["attention", a, "--model", "smollm2", "--out", a, "--limit", "1", "--no-figures"],
        "attention-plot": ["attention-plot", str(attention), "--out", str(attention)],
        "profile": ["profile", generated, "--out", generated, "--model-config", "qwen2-7b", "--device-spec", "cpu"],
    }[verb]


OUT_VERBS = ("arena", "explore", "report", "judge", "attention", "attention-plot", "profile")


def test_the_out_table_covers_every_verb_with_out() -> None:
    assert verbs_with("--out") == set(OUT_VERBS) | set(OUT_EXEMPT)


@pytest.mark.parametrize("verb", OUT_VERBS)
def test_an_input_as_out_is_refused_before_anything_is_written(verb, runs, tmp_path, capsys, monkeypatch) -> None:
    if verb == "attention":
        from sysbench_gpu.attention.capture import layout

        def never_load(*args: object, **kwargs: object) -> None:
            raise AssertionError("the model must not load before --out is checked")

        monkeypatch.setattr(layout, "load_model", never_load)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # never reached
    argv = _out_is_input_argv(verb, runs, tmp_path)
    refused_unchanged(capsys, tmp_path, argv, "--out")


def test_report_inside_a_run_stays_allowed(runs, tmp_path, capsys) -> None:
    """README: ``report demo-run --out demo-run/report``; only the run's own folder is refused."""
    out = Path(runs["strong"]) / "report"
    assert main(["report", runs["strong"], "--out", str(out), "--no-figures", "--resamples", "5"]) == 0
    assert (out / "report.json").is_file()
    assert main(["report", runs["strong"], "--out", str(out), "--no-figures", "--resamples", "5"]) == 0  # again


def test_report_refuses_a_folder_that_is_not_a_report(runs, tmp_path, capsys) -> None:
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "data.csv").write_text("keep")
    refused_unchanged(
        capsys,
        tmp_path,
        ["report", runs["strong"], "--out", str(foreign), "--no-figures", "--resamples", "5"],
        "is not empty and is not an earlier report",
    )
