"""The transformers engine with the embedded SmolLM2 model, end to end through the scheduler and the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sysbench_gpu.benchmarks.registry import load_dataset
from sysbench_gpu.core.messages import conversation_for_turn
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.engines.base import SamplingSpec
from sysbench_gpu.generation.run import run_generation
from sysbench_gpu.generation.settings import GenerateSettings

pytestmark = pytest.mark.slow
REPO_ROOT = Path(__file__).resolve().parent.parent
MAX_TOKENS = 8
SESSION_IDS = (1, 2)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread: on a shared 2-core box two spinning threads are several times slower."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def engine(smollm2_path, one_thread):
    from sysbench_gpu.engines.hf import HFEngine

    hf = HFEngine(smollm2_path, batch_size=2)
    yield hf
    hf.close()


@pytest.fixture(scope="module")
def demo():
    return load_dataset("demo")


@pytest.fixture(scope="module")
def reference_run(engine, demo, tmp_path_factory):
    """An uninterrupted hf run over two demo sessions × 5 turns (what the CLI run must reproduce)."""
    engine.batch_size = 32  # as the CLI default
    run = RunDir(tmp_path_factory.mktemp("hf") / "run")
    settings = GenerateSettings(model="smollm2", engine="hf", sampling=SamplingSpec(max_tokens=MAX_TOKENS))
    sessions = demo.select(SESSION_IDS)
    run_generation(engine, demo, sessions, run, settings, progress=False)
    engine.batch_size = 2
    return run


def test_batches_by_length_restore_order_and_match_single_requests(engine, demo):
    conversations = [conversation_for_turn(s, 1, {}) for s in demo.sessions[:3]]
    lengths = [engine.count_prompt_tokens(c) for c in conversations]
    assert len(set(lengths)) == 3  # different lengths, so sorting reorders them
    batched = engine.chat(conversations, SamplingSpec(max_tokens=MAX_TOKENS))
    single = [engine.chat([c], SamplingSpec(max_tokens=MAX_TOKENS))[0] for c in conversations]
    assert [c.text for c in batched] == [c.text for c in single]
    for completion, length in zip(batched, lengths, strict=False):
        assert completion.prompt_tokens == length
        assert completion.finish_reason in ("stop", "length") and 0 < completion.output_tokens <= MAX_TOKENS
        assert completion.text.strip()


def test_ignore_eos_forces_max_tokens_and_seeded_sampling_repeats(engine, demo):
    conversation = conversation_for_turn(demo.sessions[0], 1, {})
    engine.ignore_eos = True
    try:
        (forced,) = engine.chat([conversation], SamplingSpec(max_tokens=5))
    finally:
        engine.ignore_eos = False
    assert forced.output_tokens == 5 and forced.finish_reason == "length"
    sampled = SamplingSpec(max_tokens=MAX_TOKENS, temperature=1.0, top_p=0.95, seed=7)
    first = engine.chat([conversation], sampled)[0].text
    assert engine.chat([conversation], sampled)[0].text == first


def test_defaults_context_and_system_role(engine):
    kwargs = engine.generation_kwargs(SamplingSpec())
    assert kwargs["do_sample"] is False and kwargs["max_new_tokens"] == 512  # SmolLM2 config is greedy
    assert engine.generation_kwargs(SamplingSpec(temperature=0.5, top_k=20))["do_sample"] is True
    assert engine.generation_kwargs(SamplingSpec(temperature=0.0))["do_sample"] is False
    described = engine.describe()
    assert (
        described["dtype"] == "float32" and described["device"] == "cpu" and described["defaults"]["max_tokens"] == 512
    )
    assert engine.context_length() == 8192
    assert engine.supports_system_role() is True
    template = engine.tokenizer.chat_template
    engine.tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
    )
    engine._system_role = None
    try:
        assert engine.supports_system_role() is False
    finally:
        engine.tokenizer.chat_template = template
        engine._system_role = None


def test_missing_pad_token_falls_back_to_eos(smollm2_path, one_thread, tmp_path, demo):
    from sysbench_gpu.engines.hf import HFEngine

    source = Path(smollm2_path)
    for item in source.iterdir():
        if item.name != "tokenizer_config.json":
            (tmp_path / item.name).symlink_to(item)
    config = json.loads((source / "tokenizer_config.json").read_text())
    config.pop("pad_token", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    hf = HFEngine(str(tmp_path))
    try:
        assert hf.tokenizer.pad_token == hf.tokenizer.eos_token
        conversations = [conversation_for_turn(s, 1, {}) for s in demo.sessions[:2]]
        assert all(c.text for c in hf.chat(conversations, SamplingSpec(max_tokens=4)))
    finally:
        hf.close()


def test_end_to_end_records_and_stats(reference_run, demo):
    records = reference_run.generations.read()
    assert sorted(records) == [(sid, t) for sid in SESSION_IDS for t in range(1, 6)]
    for record in records.values():
        assert record.status == "ok" and record.response and record.history == "model"
        assert 0 < record.output_tokens <= MAX_TOKENS and record.finish_reason in ("stop", "length")
        assert record.prompt_tokens > 0 and record.model == "smollm2"
    # Later turns carry the history: their prompts are longer than turn 1's.
    assert all(records[(sid, 5)].prompt_tokens > records[(sid, 1)].prompt_tokens for sid in SESSION_IDS)
    stats = json.loads(reference_run.stats_path.read_text())
    assert [c["turn"] for c in stats["calls"]] == [1, 2, 3, 4, 5]
    for call in stats["calls"]:
        assert call["requests"] == 2 and call["wall_s"] > 0 and call["output_tokens_per_s"] > 0
        assert call["prompt_tokens"] == sum(records[(sid, call["turn"])].prompt_tokens for sid in SESSION_IDS)
        assert call["output_tokens"] == sum(records[(sid, call["turn"])].output_tokens for sid in SESSION_IDS)
        assert sum(call["finish_reasons"].values()) == 2 and call["cached_prompt_tokens"] is None
    assert stats["totals"]["requests"] == 10
    stage = reference_run.read_manifest()["stages"]["generate"]
    assert stage["status"] == "complete" and stage["engine_describe"]["engine"] == "hf"
    assert stage["sampling"] == {"max_tokens": MAX_TOKENS} and stage["sampling_defaults"]["do_sample"] is False


def _generate_command(out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sysbench_gpu",
        "generate",
        "--data",
        "demo",
        "--model",
        "smollm2",
        "--engine",
        "hf",
        "--sessions",
        ",".join(map(str, SESSION_IDS)),
        "--max-tokens",
        str(MAX_TOKENS),
        "--out",
        str(out),
        "--no-progress",
    ]


def test_cli_kill_between_turns_then_rerun_gives_same_records(reference_run, tmp_path, smollm2_path):
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    generations = out / "generations.jsonl"
    process = subprocess.Popen(
        _generate_command(out), cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None:
            if generations.exists() and generations.read_bytes().count(b"\n") >= len(SESSION_IDS):
                process.send_signal(signal.SIGKILL)  # turn 1 is on disk; turn 2 is in flight
                break
            time.sleep(0.05)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == -signal.SIGKILL, process.stderr.read().decode()[-2000:]
    partial = RunDir(out).generations.read()
    assert len(SESSION_IDS) <= len(partial) < 5 * len(SESSION_IDS)

    rerun = subprocess.run(_generate_command(out), cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    resumed = RunDir(out).generations.read()
    assert resumed == reference_run.generations.read()
    lines = generations.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(resumed) == 5 * len(SESSION_IDS)  # no duplicates
