"""Issue 33's failures of `generate`, `attention` and `attention-analyze`, each refused as a user meets it.

Every refusal is exit status 2 and one `error:` line naming the flag, file or field, without a
traceback or argparse's usage block, and leaves the file system as it was (a snapshot of the test's
folder before and after). `attention-analyze` reads a synthetic attention folder (no model); the
`attention` refusals read only the embedded model's config (its weights never load).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sysbench_gpu.attention.files.store import TURN_TABLE, save_npz_atomic, session_path
from sysbench_gpu.attention.files.turn_table import turn_row_json, turn_shares
from sysbench_gpu.benchmarks.registry import demo_data_path, load_dataset, load_run_sessions, save_run_sessions
from sysbench_gpu.cli import main
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord, Verdict
from sysbench_gpu.core.rundir import RunDir

REPO_ROOT = Path(__file__).resolve().parent.parent
DEMO = ["--data", "demo", "--model", "smollm2"]


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a folder)."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def refused(capsys, argv: list[str], *expected: str) -> str:
    """``main(argv)`` exits 2 with one line that holds every ``expected`` text."""
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "usage:" not in err and "NoneType" not in err, err
    for text in expected:
        assert text in err, err
    return err


def refused_unchanged(capsys, root: Path, argv: list[str], *expected: str) -> str:
    before = snapshot(root)
    err = refused(capsys, argv, *expected)
    assert snapshot(root) == before, err
    return err


def run_as_user(*argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "sysbench_gpu", *argv], env=env, capture_output=True, text=True, timeout=300
    )


# ----------------------------------------------------------------- generate: flags before --out is made


@pytest.mark.parametrize(
    ("engine", "extra", "flag"),
    [
        ("hf", ["--cpu-threads", "0"], "--cpu-threads must be at least 1, got 0"),
        ("hf", ["--seed", "-1"], "--seed must be 0 or more, got -1"),
        ("hf", ["--limit", "0"], "--limit must be at least 1"),
        ("hf", ["--limit", "-2"], "--limit must be at least 1"),
        ("hf", ["--max-tokens", "0"], "--max-tokens must be at least 1"),
        ("hf", ["--batch-size", "0"], "--batch-size must be at least 1"),
        ("hf", ["--dtype", "bogus"], "--dtype: unknown dtype 'bogus' for --engine hf"),
        ("hf", ["--temperature", "nan"], "--temperature must be a finite number"),
        ("hf", ["--temperature", "-0.5"], "--temperature must be at least 0"),
        ("hf", ["--top-p", "1.5"], "--top-p must be above 0 and at most 1"),
        ("hf", ["--repetition-penalty", "0"], "--repetition-penalty must be above 0"),
        ("hf", ["--distractor-turns", "-1"], "--distractor-turns must be 0 or more"),
        ("hf", ["--model", "/no/such/model"], "'/no/such/model': no such folder"),
        ("vllm", ["--data-parallel-size", "0"], "--data-parallel-size must be at least 1"),
        ("vllm", ["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization must be above 0 and at most 1"),
        ("openai", ["--concurrency", "0"], "--concurrency must be at least 1"),
        ("openai", ["--timeout", "inf"], "--timeout must be a finite number"),
        ("openai", ["--max-retries", "-1"], "--max-retries must be 0 or more"),
    ],
)
def test_generate_refuses_a_bad_flag_before_making_out(tmp_path, capsys, engine, extra, flag):
    """Issue 33: `generate --cpu-threads 0` left an empty run folder; every flag is now checked before --out."""
    argv = ["generate", *DEMO, "--engine", engine, "--out", str(tmp_path / "run"), *extra]
    refused_unchanged(capsys, tmp_path, argv, flag)
    assert not (tmp_path / "run").exists()


def test_generate_refuses_its_data_folder_as_out(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "sessions.json").write_bytes(demo_data_path().read_bytes())
    argv = ["generate", "--data", str(data), "--model", "smollm2", "--engine", "hf", "--out", str(data)]
    refused_unchanged(capsys, tmp_path, argv, "--out is the --data folder")


def test_generate_cpu_threads_zero_as_a_user_runs_it(tmp_path):
    done = run_as_user("generate", *DEMO, "--engine", "hf", "--out", str(tmp_path / "run"), "--cpu-threads", "0")
    assert done.returncode == 2 and done.stderr == "error: --cpu-threads must be at least 1, got 0\n", done.stderr
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------- generate: steering


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--steer-system", "inf"], "--steer-system must be a finite number, got inf"),
        (["--steer-system", "nan"], "--steer-system must be a finite number"),
        (["--steer-system", "0"], "--steer-system must be above 0"),
        (["--steer-system", "-2"], "--steer-system must be above 0"),
        (["--steer-system", "2", "--steer-layers", "5-2"], "--steer-layers: '5-2' is empty (start after end)"),
        (["--steer-system", "2", "--steer-layers", "abc"], "--steer-layers: 'abc' is not mid-band, all, N or N-M"),
        (["--steer-system", "2", "--steer-layers", "99"], "--steer-layers: '99' is out of range (the model has 30"),
    ],
)
def test_generate_refuses_bad_steering_before_making_out(tmp_path, capsys, extra, expected):
    """Issue 33: `--steer-system inf` was accepted and wrote Infinity into manifest.json."""
    argv = ["generate", *DEMO, "--engine", "hf", "--out", str(tmp_path / "run"), *extra]
    refused_unchanged(capsys, tmp_path, argv, expected)
    assert not (tmp_path / "run").exists()


def test_generate_refuses_steer_heads_past_the_models_depth(tmp_path, capsys):
    heads = tmp_path / "heads.json"
    heads.write_text(json.dumps({"heads": [[3, 1], [40, 0]]}))
    argv = ["generate", *DEMO, "--engine", "hf", "--out", str(tmp_path / "run"), "--steer-system", "2"]
    refused_unchanged(capsys, tmp_path, [*argv, "--steer-heads", str(heads)], "heads.json: heads[1] names layer 40")
    heads.write_text(json.dumps({"heads": [[3, 99]]}))
    refused_unchanged(capsys, tmp_path, [*argv, "--steer-heads", str(heads)], "heads.json: heads[0] names head 99")


# ----------------------------------------------------------------- generate: --extra-body


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('{"messages": []}', "field 'messages' is one the tool sets itself; the messages come from --data"),
        ('{"model": "other"}', "field 'model' is one the tool sets itself; use --model"),
        ('{"max_tokens": 5}', "field 'max_tokens' is one the tool sets itself; use --max-tokens"),
        ('{"max_completion_tokens": 5}', "use --max-tokens"),
        ('{"temperature": 1.5}', "use --temperature"),
        ('{"top_p": 0.5}', "use --top-p"),
        ('{"top_k": 5}', "use --top-k"),
        ('{"seed": 1}', "use --seed"),
        ('{"repetition_penalty": 1.2}', "use --repetition-penalty"),
        ('{"ignore_eos": true}', "use --ignore-eos"),
        ('{"stream": true}', "field 'stream' is one the tool sets itself"),
        ('{"n": 3}', "field 'n' is one the tool sets itself"),
        ("null", "--extra-body: expected a JSON object, found null"),
        ("[1]", "--extra-body: expected a JSON object, found an array"),
        ("{min", "--extra-body: not JSON"),
        ('{"min_tokens": NaN}', "--extra-body: NaN is not a JSON value"),
    ],
)
def test_extra_body_refuses_the_tools_own_fields_and_bad_values(tmp_path, capsys, body, expected):
    """Issue 33: --extra-body could replace messages, model or max_tokens; bad values printed argparse's usage."""
    argv = ["generate", *DEMO, "--engine", "openai", "--base-url", "http://127.0.0.1:9/v1"]
    refused_unchanged(capsys, tmp_path, [*argv, "--out", str(tmp_path / "run"), "--extra-body", body], expected)


def test_extra_body_null_as_a_user_runs_it(tmp_path):
    done = run_as_user("generate", *DEMO, "--engine", "openai", "--out", str(tmp_path / "run"), "--extra-body", "null")
    assert done.returncode == 2 and done.stderr == "error: --extra-body: expected a JSON object, found null\n"
    assert list(tmp_path.iterdir()) == []


def test_a_resume_with_another_extra_body_is_refused_like_a_sampling_flag(tmp_path, capsys, monkeypatch):
    pytest.importorskip("openai")
    from openai_stub import OpenAIStub, Reply

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    out = tmp_path / "run"
    with OpenAIStub(lambda request, n: Reply(text="ok")) as stub:
        argv = ["generate", *DEMO, "--engine", "openai", "--base-url", stub.base_url, "--out", str(out)]
        argv += ["--limit", "1", "--no-progress", "--max-tokens", "8"]
        assert main([*argv, "--extra-body", '{"min_tokens": 4}']) == 0
        sent = stub.request_count
        assert sent > 0 and all(request["min_tokens"] == 4 for request in stub.requests)
        refused_unchanged(
            capsys, tmp_path, [*argv, "--extra-body", '{"min_tokens": 8}'], "field 'engine_options.extra_body' was"
        )
        refused_unchanged(capsys, tmp_path, argv, "field 'engine_options.extra_body' was {'min_tokens': 4}")
        refused_unchanged(capsys, tmp_path, [*argv, "--extra-body", '{"min_tokens": 4}', "--temperature", "0.5"])
        assert stub.request_count == sent  # nothing was sent by a refused call
        assert main([*argv, "--extra-body", '{"min_tokens": 4}']) == 0  # the same body resumes
    section = json.loads((out / "manifest.json").read_text())["stages"]["generate"]
    assert section["engine_options"]["extra_body"] == {"min_tokens": 4}


# ----------------------------------------------------------------- attention: layers and --out before any load


def _run_dir(path: Path, n_sessions: int = 2) -> RunDir:
    dataset = load_dataset(demo_data_path())
    sessions = dataset.select(limit=n_sessions)
    run = RunDir(path)
    run.update_manifest(stage="generate", model="smollm2")
    save_run_sessions(run, sessions, dataset)
    run.generations.append(
        [
            GenerationRecord(s.system_id, t.index, t.user, f"Reply {t.index}.", status="ok", model="smollm2")
            for s in sessions
            for t in s.turns
        ]
    )
    run.judgments.append(
        [
            JudgmentRecord(
                system_id=s.system_id,
                turn=t.index,
                verdicts={
                    str(c.id): Verdict(
                        raw="yes", value="no" if (s.system_id + t.index) % 3 == 0 else "yes", type=c.type
                    )
                    for c in t.constraints
                },
            )
            for s in sessions
            for t in s.turns
        ]
    )
    return run


@pytest.fixture()
def no_model_load(monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from sysbench_gpu.attention.capture import layout as attn_layout

    def never(*args, **kwargs):
        raise AssertionError("a refused call must not load the model")

    monkeypatch.setattr(attn_layout, "load_model", never)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            ["--knockout", "system", "--knockout-layers", "99"],
            "--knockout-layers: '99' is out of range (the model has 30",
        ),
        (["--knockout", "system", "--knockout-layers", "5-2"], "--knockout-layers: '5-2' is empty (start after end)"),
        (
            ["--knockout", "system", "--knockout-layers", "abc"],
            "--knockout-layers: 'abc' is not mid-band, all, N or N-M",
        ),
        (["--layers", "99"], "--layers: layer 99 is out of range (the model has 30 layers)"),
        (["--layers", "mid,abc"], "--layers: 'abc' is not mid, last, all or a layer number"),
        (["--chunk-tokens", "0"], "--chunk-tokens must be at least 1"),
        (["--chunk-mib", "0"], "--chunk-mib must be at least 1"),
        (["--bootstrap", "0"], "--bootstrap must be at least 1"),
        (["--limit", "0"], "--limit must be at least 1"),
        (["--max-tokens", "0"], "--max-tokens must be at least 1"),
        (["--wait-timeout", "nan"], "--wait-timeout must be a finite number"),
        (["--dtype", "float8"], "--dtype: unknown dtype 'float8'"),
        (["--figure-session", "999"], "--figure-session 999: not among the sessions"),
    ],
)
def test_attention_refuses_flags_before_loading_or_writing(tmp_path, capsys, no_model_load, extra, expected):
    """Issue 33: `attention --knockout-layers 99|5-2|abc` loaded the model, measured a session and left files."""
    run = _run_dir(tmp_path / "run")
    argv = ["attention", str(run.path), "--model", "smollm2", "--out", str(tmp_path / "attn"), *extra]
    refused_unchanged(capsys, tmp_path, argv, expected)
    assert not (tmp_path / "attn").exists()


def test_attention_refuses_an_out_that_is_its_run_or_someone_elses_folder(tmp_path, capsys, no_model_load):
    run = _run_dir(tmp_path / "run")
    argv = ["attention", str(run.path), "--model", "smollm2", "--out"]
    refused_unchanged(capsys, tmp_path, [*argv, str(run.path)], "--out is the input")
    refused_unchanged(capsys, tmp_path, [*argv, str(run.path / "attn")], "--out is inside the input")
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "todo.txt").write_text("mine")
    refused_unchanged(capsys, tmp_path, [*argv, str(mine)], "is not an attention output (no manifest.json")


def test_attention_rerun_with_other_settings_changes_nothing(tmp_path, capsys, no_model_load):
    run = _run_dir(tmp_path / "run")
    out = tmp_path / "attn"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"run_dir": str(run.path.resolve()), "layers_spec": "mid"}))
    argv = ["attention", str(run.path), "--model", "smollm2", "--out", str(out), "--layers", "last"]
    refused_unchanged(capsys, tmp_path, argv, "field 'layers_spec' is 'mid' but this run asks for 'last'")
    manifest = {"run_dir": str(run.path.resolve()), "knockout": {"span": "system", "layers_spec": "3"}}
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / "knockout.jsonl").write_text("")
    argv = [*argv[:6], "--knockout", "system", "--knockout-layers", "4"]
    refused_unchanged(capsys, tmp_path, argv, "field 'knockout.layers_spec' was '3'")


# ----------------------------------------------------------------- attention-analyze: every input, then all outputs

N_LAYERS, N_HEADS, SYSTEM_END, TURN_TOKENS, REPLY_TOKENS = 2, 3, 20, 30, 20
OUTPUTS = ("heads.json", "top_heads.json", "probe.json", "decay.json")


def _session_arrays(system_id: int, n_turns: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    n_tokens = SYSTEM_END + n_turns * TURN_TOKENS
    turns = [(SYSTEM_END + k * TURN_TOKENS, SYSTEM_END + (k + 1) * TURN_TOKENS) for k in range(n_turns)]
    replies = [(end - REPLY_TOKENS, end) for _, end in turns]
    per_head = rng.uniform(0.0, 0.4, size=(N_LAYERS, N_HEADS, n_tokens, 2)).astype(np.float32)
    meta = {"system_id": system_id, "condition": "system", "layer_labels_by_index": {"0": "layer0", "1": "layer1"}}
    return {
        "token_ids": np.arange(n_tokens, dtype=np.int64),
        "layers": np.arange(N_LAYERS, dtype=np.int64),
        "shares": per_head.mean(axis=1),
        "per_head": per_head,
        "span_names": np.asarray(["lead", "system"]),
        "spans": np.asarray([[0, 1], [1, SYSTEM_END]], dtype=np.int64),
        "system": np.asarray([1, SYSTEM_END], dtype=np.int64),
        "users": np.asarray([(t0, r0) for (t0, _), (r0, _) in zip(turns, replies, strict=True)], dtype=np.int64),
        "replies": np.asarray(replies, dtype=np.int64),
        "turns": np.asarray(turns, dtype=np.int64),
        "turn_numbers": np.arange(1, n_turns + 1, dtype=np.int64),
        "distractors": np.zeros((0, 2), dtype=np.int64),
        "meta": np.asarray(json.dumps(meta)),
    }


@pytest.fixture()
def analyzed(tmp_path):
    """A run of 5 demo sessions and an attention folder measured on it with per-head shares (synthetic numbers)."""
    pytest.importorskip("scipy")
    pytest.importorskip("sklearn")
    run = _run_dir(tmp_path / "run", n_sessions=5)
    out = tmp_path / "attn"
    rng = np.random.default_rng(0)
    rows = []
    for session in load_run_sessions(run):
        arrays = _session_arrays(session.system_id, len(session.turns), rng)
        save_npz_atomic(session_path(out, session.system_id, "system"), arrays)
        rows += turn_shares(arrays)
    (out / TURN_TABLE).write_text("".join(turn_row_json(row) + "\n" for row in rows))
    manifest = {"run_dir": str(run.path.resolve()), "model": "synthetic", "conversation": {"history": "model"}}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


ANALYZE = ["--permutations", "50", "--bootstrap", "10", "--folds", "2", "--no-figures"]


def test_analyze_writes_every_output_when_every_input_reads(analyzed, capsys):
    assert main(["attention-analyze", str(analyzed), *ANALYZE]) == 0
    assert all((analyzed / name).is_file() for name in OUTPUTS)
    assert not list(analyzed.rglob("*.tmp"))


def _first_npz(out: Path) -> Path:
    return sorted((out / "sessions").glob("*.npz"))[0]


def test_analyze_names_a_truncated_session_file_and_writes_nothing(analyzed, capsys):
    """Issue 33: a truncated session .npz crashed attention-analyze without naming the file."""
    path = _first_npz(analyzed)
    path.write_bytes(path.read_bytes()[:200])
    refused_unchanged(capsys, analyzed, ["attention-analyze", str(analyzed), *ANALYZE], f"{path}: not a readable")
    assert not any((analyzed / name).exists() for name in OUTPUTS)


def test_analyze_names_a_session_file_cut_inside_its_data(analyzed, capsys):
    path = _first_npz(analyzed)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] + data[len(data) // 2 + 64 :])
    refused_unchanged(capsys, analyzed, ["attention-analyze", str(analyzed), *ANALYZE], str(path))


def test_analyze_names_a_missing_session_file(analyzed, capsys):
    """Issue 33: a missing session .npz silently became "no fit"."""
    path = _first_npz(analyzed)
    path.unlink()
    err = refused_unchanged(capsys, analyzed, ["attention-analyze", str(analyzed), *ANALYZE], f"{path}: missing")
    assert TURN_TABLE in err


def test_analyze_checks_the_table_before_writing_any_output(analyzed, capsys):
    """Issue 33: heads.json, top_heads.json and probe.json were written before a corrupt table line was found."""
    table = analyzed / TURN_TABLE
    lines = table.read_text().splitlines(keepends=True)
    table.write_text("".join(lines[:3]) + "{not json\n" + "".join(lines[3:]))
    refused_unchanged(capsys, analyzed, ["attention-analyze", str(analyzed), *ANALYZE], f"{table}: line 4")
    assert not any((analyzed / name).exists() for name in OUTPUTS)
    row = json.loads(lines[0])
    table.write_text(json.dumps({**row, "turn": "two"}) + "\n" + "".join(lines[1:]))
    refused_unchanged(capsys, analyzed, ["attention-analyze", str(analyzed), *ANALYZE], "line 1: field 'turn' is 'two'")
    table.write_text("".join(lines)[:-5])
    refused_unchanged(
        capsys, analyzed, ["attention-analyze", str(analyzed), *ANALYZE], f"{table}: the last line is cut"
    )
    table.unlink()
    refused_unchanged(capsys, analyzed, ["attention-analyze", str(analyzed), *ANALYZE], f"{table}: missing")


def test_analyze_writes_all_outputs_or_none(analyzed, capsys, monkeypatch):
    """A failure while writing leaves neither new files nor temporary ones, and earlier outputs as they were."""
    from sysbench_gpu.attention.files import staged

    assert main(["attention-analyze", str(analyzed), *ANALYZE]) == 0
    written = {name: (analyzed / name).read_bytes() for name in OUTPUTS}
    real = staged._write_temporary
    calls = []

    def failing(target, data):
        calls.append(target)
        if len(calls) == 3:
            raise OSError(28, "No space left on device", str(target))
        return real(target, data)

    monkeypatch.setattr(staged, "_write_temporary", failing)
    refused_unchanged(
        capsys, analyzed, ["attention-analyze", str(analyzed), *ANALYZE, "--seed", "3"], "nothing was written"
    )
    assert {name: (analyzed / name).read_bytes() for name in OUTPUTS} == written


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--top", "0"], "--top must be at least 1, got 0"),
        (["--folds", "1"], "--folds must be at least 2, got 1"),
        (["--bootstrap", "0"], "--bootstrap must be at least 1, got 0"),
        (["--permutations", "0"], "--permutations must be at least 1, got 0"),
        (["--seed", "-1"], "--seed must be 0 or more, got -1"),
    ],
)
def test_analyze_names_each_bad_flag(analyzed, capsys, extra, expected):
    """Issue 33: one generic message covered bad --top, --folds and --bootstrap."""
    refused_unchanged(capsys, analyzed.parent, ["attention-analyze", str(analyzed), *extra], expected)


def test_analyze_refuses_an_out_that_is_its_run_or_a_foreign_folder(analyzed, capsys):
    run = analyzed.parent / "run"
    refused_unchanged(capsys, analyzed.parent, ["attention-analyze", str(analyzed), "--out", str(run)], "is the input")
    foreign = analyzed.parent / "notes"
    foreign.mkdir()
    (foreign / "todo.txt").write_text("mine")
    argv = ["attention-analyze", str(analyzed), "--out", str(foreign)]
    refused_unchanged(capsys, analyzed.parent, argv, "is not empty and is not an earlier attention-analyze output")


def test_the_openai_engine_itself_refuses_the_tools_own_fields():
    """The engine checks too, for callers that build it without the CLI (``batch_infer``, plans)."""
    pytest.importorskip("openai")
    from sysbench_gpu.core.errors import SysbenchError
    from sysbench_gpu.engines.openai_engine import OpenAIEngine

    with pytest.raises(SysbenchError, match="--extra-body: field 'max_tokens' is one the tool sets itself"):
        OpenAIEngine("m", base_url="http://127.0.0.1:9/v1", extra_body={"max_tokens": 4})
    engine = OpenAIEngine("m", base_url="http://127.0.0.1:9/v1", extra_body={"min_tokens": 4})
    assert engine.describe()["extra_body"] == {"min_tokens": 4}
    engine.close()


def test_attention_plot_refuses_a_session_it_cannot_draw_before_any_figure(analyzed, capsys):
    figures = analyzed.parent / "figures"
    argv = ["attention-plot", str(analyzed), "--out", str(figures), "--session", "999"]
    refused_unchanged(capsys, analyzed.parent, argv, "--session 999: not measured in")
    assert not figures.exists()
