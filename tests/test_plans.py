"""`sysbench-gpu run PLAN.toml`: the plan's checks, its dry run, and one small plan run end to end.

The end-to-end plan (two demo sessions cut to one turn, replies of 4 tokens, the hf engine and the hf
judge on the embedded model, plain and reference history, report, arena and explorer) runs once per
session: it is killed with SIGKILL while its second run generates, then run again to its end.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from sysbench_gpu.cli import main
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.rundir import PLAN_PATH_ENV, PLAN_SHA256_ENV, RunDir, plan_origin
from sysbench_gpu.plans.api import run_plan
from sysbench_gpu.plans.child import last_error
from sysbench_gpu.plans.plan import load_plan
from sysbench_gpu.plans.schema import PlanError
from sysbench_gpu.plans.steps import Step

REPO = Path(__file__).resolve().parent.parent
DEMO_PLAN = REPO / "launch" / "plans" / "demo.toml"
DEMO_DATA = REPO / "sysbench_gpu" / "demo" / "demo_sessions.json"

SMALL_PLAN = """
name = "small"

[data]
path = "{data}"

[sampling]
max_tokens = 4

[judge]
backend = "hf"
model = "smollm2"
template = "en"
options = {{ batch_size = 8 }}

[[models]]
name = "smol"
model = "smollm2"
engine = "hf"

[[models.ablations]]
history = "reference"

[outputs]
report = {{ gt_pairs = true, figures = false }}
arena = {{ figures = false, resamples = 20 }}
explore = {{ resamples = 20 }}
"""


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _plan(tmp_path: Path, body: str, name: str = "plan.toml") -> Path:
    return _write(tmp_path / name, body)


BASE = """
[data]
path = "demo"

[[models]]
name = "m"
model = "smollm2"
engine = "hf"
"""


# ------------------------------------------------------------------ checks, before anything loads


def _refusal(tmp_path: Path, body: str) -> str:
    path = _plan(tmp_path, body)
    with pytest.raises(PlanError) as caught:
        load_plan(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    return message


def test_unknown_key_names_file_table_and_key(tmp_path: Path) -> None:
    message = _refusal(tmp_path, BASE + "\n[sampling]\ntemprature = 0.7\n")
    assert "[sampling] key 'temprature': unknown key" in message
    assert "temperature" in message  # the known keys are listed


def test_wrong_type_names_the_key_and_both_types(tmp_path: Path) -> None:
    message = _refusal(tmp_path, BASE + '\n[sampling]\nmax_tokens = "64"\n')
    assert "[sampling] key 'max_tokens': expected an integer, got a string '64'" in message
    # An engine option is typed by the generate flag it stands for.
    message = _refusal(tmp_path, BASE + 'options = { batch_size = "8" }\n')
    assert "[models.1 (m).options] key 'batch_size': expected an integer" in message
    message = _refusal(tmp_path, BASE + "options = { tensor_parallel_size = 2 }\n")
    assert "key 'tensor_parallel_size': not an option of the hf engine" in message


def test_missing_field_and_model_listed_twice(tmp_path: Path) -> None:
    message = _refusal(tmp_path, '[data]\npath = "demo"\n[[models]]\nname = "m"\nmodel = "smollm2"\n')
    assert "[models.1]: missing key 'engine'" in message
    twice = BASE + '[[models]]\nname = "m"\nmodel = "other"\nengine = "hf"\n'
    message = _refusal(tmp_path, twice)
    assert "key 'name': model 'm' is listed twice (models.1 (m) and models.2 (m))" in message


def test_judge_needs_backend_and_model_together(tmp_path: Path) -> None:
    message = _refusal(tmp_path, BASE + '\n[judge]\nbackend = "hf"\n')
    assert "[judge] key 'model': missing" in message


def test_ablation_the_benchmark_does_not_support(tmp_path: Path, mteval_data_dir: Path) -> None:
    data = mteval_data_dir / "refinement_multi.jsonl"
    body = f'[data]\npath = "{data}"\n[[models]]\nname = "m"\nmodel = "smollm2"\nengine = "hf"\n'
    message = _refusal(tmp_path, body + '[[models.ablations]]\nhistory = "single-turn"\n')
    assert "[models.1 (m).ablations.1] key 'history': --history single-turn is a SysBench ablation" in message
    message = _refusal(tmp_path, body + "[[models.ablations]]\ndistractor_turns = 2\n")
    assert "[models.1 (m).ablations.1] key 'distractor_turns': --distractor-turns is a SysBench ablation" in message


def test_a_bad_plan_is_refused_before_any_folder_or_model(tmp_path: Path) -> None:
    plan = _plan(tmp_path, BASE + "\n[sampling]\ntop_q = 1\n")
    out = tmp_path / "out"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "sysbench_gpu", "run", str(plan), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ")
    assert "[sampling] key 'top_q': unknown key" in done.stderr
    assert not out.exists()
    assert time.monotonic() - started < 120  # (the limit above; the point is that nothing was loaded)


def test_step_commands_and_child_errors() -> None:
    step = Step("generate", ("generate", "--data", "my data.json", "--out", "runs/x"), model="m", run="m")
    assert step.shell() == "sysbench-gpu generate --data 'my data.json' --out runs/x"
    assert step.label == "model m, step generate"
    ablation = Step("generate", ("generate",), model="m", run="m-reference")
    assert ablation.label == "model m (run m-reference), step generate"
    torchrun = Step("attention", ("attention", "runs/x"), model="m", run="m", nproc=4)
    assert torchrun.shell().startswith("torchrun --standalone --nproc-per-node 4 -m sysbench_gpu attention")
    assert torchrun.command()[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert last_error("INFO x\nerror: runs/x/manifest.json: field 'engine' was 'hf'\n") == (
        "runs/x/manifest.json: field 'engine' was 'hf'"
    )
    assert last_error("Traceback ...\n") is None


def test_plan_origin_from_the_environment() -> None:
    assert plan_origin({}) is None
    origin = plan_origin({PLAN_PATH_ENV: "/p/plan.toml", PLAN_SHA256_ENV: "a" * 64})
    assert origin == {"path": "/p/plan.toml", "sha256": "a" * 64}
    with pytest.raises(SysbenchError, match="SYSBENCH_GPU_PLAN_SHA256"):
        plan_origin({PLAN_PATH_ENV: "/p/plan.toml", PLAN_SHA256_ENV: "xyz"})


# ------------------------------------------------------------------ the ready plans and the dry run


@pytest.mark.parametrize("name", ["demo.toml", "sysbench_sweep.toml", "qwen2_72b_attention.toml"])
def test_ready_plans_are_valid(name: str, tmp_path: Path) -> None:
    """The launch plans load; those over upstream's file get the shared copy of it."""
    text = (REPO / "launch" / "plans" / name).read_text(encoding="utf-8")
    shared = REPO.parent / "shared" / "sysbench" / "sessions.json"
    if 'path = "data"' in text:
        if not shared.is_file():
            pytest.skip("shared SysBench data not found")
        text = text.replace('path = "data"', f'path = "{shared}"')
    plan = load_plan(_plan(tmp_path, text, name))
    assert plan.runs


def test_mteval_plan_is_valid(tmp_path: Path, mteval_data_dir: Path) -> None:
    text = (REPO / "launch" / "plans" / "mteval.toml").read_text(encoding="utf-8")
    text = text.replace('"data/mteval/', f'"{mteval_data_dir}/')
    plan = load_plan(_plan(tmp_path, text, "mteval.toml"))
    assert {run.history for run in plan.runs} == {"model", "reference"}
    assert {run.name for run in plan.runs if run.model == "qwen2-7b"} == {
        "qwen2-7b",
        "qwen2-7b-reference",
        "qwen2-7b-single",
        "qwen2-7b-irrelevant-front",
    }


def test_dry_run_lists_commands_and_the_judges_upper_bound(tmp_path: Path) -> None:
    out = tmp_path / "never"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["run", str(DEMO_PLAN), "--out", str(out), "--dry-run"]) == 0
    text = stdout.getvalue()
    generate = f"sysbench-gpu generate --data demo --model smollm2 --engine hf --out {out}/runs/smollm2 --max-tokens 64"
    assert generate in text
    assert (
        f"sysbench-gpu judge {out}/runs/smollm2-reference --judge hf --judge-model smollm2 --template en "
        "--engine-option batch_size=8" in text
    )
    assert "25 requests" in text and "every reply counted at max_tokens, an upper bound" in text
    assert f"sysbench-gpu report {out}/runs/smollm2 {out}/runs/smollm2-reference --out {out}/report" in text
    assert "judge, all runs: 50 requests" in text
    assert not out.exists()
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        main(["run", str(DEMO_PLAN), "--out", str(out), "--dry-run", "--json", "--only", "smollm2", "--steps", "judge"])
    listing = json.loads(stdout.getvalue())
    assert [step["kind"] for step in listing["steps"]] == ["judge", "judge"]
    assert listing["judge_total"]["requests"] == 50 and listing["judge_total"]["upper_bound"]
    assert all(step["judge_estimate_kind"] == "upper bound" for step in listing["steps"])


def test_only_and_steps_name_what_the_plan_has(tmp_path: Path) -> None:
    with pytest.raises(SysbenchError, match="--only nobody: not a model of"):
        run_plan(DEMO_PLAN, out=tmp_path / "o", only=["nobody"])
    with pytest.raises(SysbenchError, match="--steps jugde: not a step"):
        run_plan(DEMO_PLAN, out=tmp_path / "o", steps=["jugde"])


def test_continue_on_error_records_the_failed_model(tmp_path: Path) -> None:
    """A model that cannot load fails its step; the next model still runs, and the summary names it."""
    missing = tmp_path / "no-such-model"
    body = f"""
[data]
path = "demo"
limit = 1
[[models]]
name = "broken"
model = "{missing}"
engine = "hf"
[[models]]
name = "broken-too"
model = "{missing}"
engine = "hf"
"""
    plan = _plan(tmp_path, body)
    with pytest.raises(SysbenchError) as caught:
        run_plan(plan, out=tmp_path / "a", steps=["generate"], stdout=io.StringIO(), stderr=io.StringIO())
    assert str(caught.value).startswith("model broken, step generate: ")
    assert str(missing) in str(caught.value)
    stderr = io.StringIO()
    result = run_plan(
        plan, out=tmp_path / "b", steps=["generate"], continue_on_error=True, stdout=io.StringIO(), stderr=stderr
    )
    assert list(result.failed) == ["broken", "broken-too"]
    assert [outcome.status for outcome in result.steps] == ["failed", "failed"]
    assert "run: failed: broken: model broken, step generate:" in stderr.getvalue()


# ------------------------------------------------------------------ one small plan, end to end


@pytest.fixture(scope="session")
def small_plan_run(tmp_path_factory: pytest.TempPathFactory, smollm2_path: str) -> dict:
    """The small plan killed (SIGKILL) while its second run generates, then run again to its end."""
    folder = tmp_path_factory.mktemp("plan")
    sessions = json.loads(DEMO_DATA.read_text(encoding="utf-8"))[:2]
    for session in sessions:  # one turn each: the system message, the first user message and its reply
        session["messages"] = session["messages"][:3]
        user = session["messages"][1]["content"]
        session["prompt_infos"] = {user: session["prompt_infos"][user]}
    data = _write(folder / "two_sessions.json", json.dumps(sessions, ensure_ascii=False))
    plan = _write(folder / "small.toml", SMALL_PLAN.format(data=data))
    out = folder / "out"
    log = folder / "first.log"
    with log.open("w") as handle:
        first = subprocess.Popen(
            [sys.executable, "-m", "sysbench_gpu", "run", str(plan), "--out", str(out)],
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    second = f"--out {out}/runs/smol-reference"
    deadline = time.monotonic() + 900
    while second not in log.read_text() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.poll() is None, log.read_text()[-3000:]
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    killed_log = log.read_text()
    stderr = io.StringIO()
    result = run_plan(plan, out=out, stdout=io.StringIO(), stderr=stderr)
    return {"plan": plan, "out": out, "result": result, "first_log": killed_log, "rerun_log": stderr.getvalue()}


@pytest.mark.slow
def test_killed_plan_finishes_on_rerun_with_every_run_complete(small_plan_run: dict) -> None:
    result, out = small_plan_run["result"], small_plan_run["out"]
    assert result.ok and not result.left_out
    assert set(result.runs) == {"smol", "smol-reference"}
    statuses = {(o.run, o.kind): o.status for o in result.steps}
    # The first run was done before the kill: skipped, not redone.
    assert statuses[("smol", "generate")] == "done before"
    assert statuses[("smol", "judge")] == "done before"
    assert statuses[("smol-reference", "generate")] == "ran"
    for name in result.runs:
        run = RunDir(out / "runs" / name)
        manifest = run.read_manifest()
        assert manifest["stages"]["generate"]["status"] == "complete"
        assert manifest["stages"]["judge"]["status"] == "complete"
        assert set(run.generations.read()) == set(run.judgments.read()) == {(1, 1), (2, 1)}


@pytest.mark.slow
def test_nothing_judged_twice_and_nothing_lost(small_plan_run: dict) -> None:
    out = small_plan_run["out"]
    for name in ("smol", "smol-reference"):
        journal = (out / "runs" / name / "judge_ledger.jsonl").read_text().splitlines()
        paid = Counter(
            (entry["turn"], entry["attempt"]) for entry in map(json.loads, journal) if entry["event"] == "paid"
        )
        assert paid and max(paid.values()) == 1, paid
        assert len(RunDir(out / "runs" / name).judgments.read()) == 2


@pytest.mark.slow
def test_output_root_holds_report_arena_and_explorer(small_plan_run: dict) -> None:
    out, result = small_plan_run["out"], small_plan_run["result"]
    assert (out / "report" / "report.md").is_file()
    assert (out / "arena" / "ratings.json").is_file()
    assert (out / "explore" / "index.html").is_file() and (out / "explore" / "arena.html").is_file()
    assert (result.report, result.arena, result.explore) == (out / "report", out / "arena", out / "explore")
    report = json.loads((out / "report" / "report.json").read_text())
    assert len(report["gt_pairs"]) == 1  # the reference run paired with the plain one
    assert result.metrics("smol")["n_turns"] == 2


@pytest.mark.slow
def test_each_manifest_records_the_plan(small_plan_run: dict) -> None:
    plan = small_plan_run["plan"]
    sha256 = load_plan(plan).sha256
    for name in ("smol", "smol-reference"):
        manifest = RunDir(small_plan_run["out"] / "runs" / name).read_manifest()
        assert manifest["plan"] == {"path": str(plan.resolve()), "sha256": sha256}


@pytest.mark.slow
def test_changed_plan_refused_naming_model_step_and_field(small_plan_run: dict, tmp_path: Path) -> None:
    text = small_plan_run["plan"].read_text()
    changed = _plan(tmp_path, text.replace("max_tokens = 4", "max_tokens = 5"))
    with pytest.raises(SysbenchError) as caught:
        run_plan(changed, out=small_plan_run["out"], stdout=io.StringIO(), stderr=io.StringIO())
    message = str(caught.value)
    assert message.startswith("model smol, step generate: ")
    assert "field 'sampling.max_tokens' was 4 in this run, this command asks for 5" in message
    other_judge = _plan(tmp_path, text.replace('template = "en"', 'template = "zh"'), "judge.toml")
    refusal = r"^model smol, step judge: .*judgments.jsonl: session 1, turn 1 was judged"
    with pytest.raises(SysbenchError, match=refusal):
        run_plan(other_judge, out=small_plan_run["out"], steps=["judge"], stdout=io.StringIO(), stderr=io.StringIO())


@pytest.mark.slow
def test_dry_run_after_the_run_says_done(small_plan_run: dict) -> None:
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        main(["run", str(small_plan_run["plan"]), "--out", str(small_plan_run["out"]), "--dry-run", "--json"])
    steps = json.loads(stdout.getvalue())["steps"]
    states = {(step["run"], step["kind"]): step["state"] for step in steps}
    assert states[("smol", "generate")] == states[("smol-reference", "judge")] == "done"
    assert states[(None, "report")] == "every time"
