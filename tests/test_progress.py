"""Progress a log file can read (``core.progress``): lines at the interval, a closing line, ETA, never a \\r.

The unit tests drive ``ProgressLog`` with a fake clock and a StringIO stream. The end-to-end tests run
``generate``, ``judge`` and ``attention`` as subprocesses with stderr redirected to a file, as under
SLURM or nohup, and check that the progress lines and the closing line are there, not when they came.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sysbench_gpu.core.arguments import check_shared_flags
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.progress import (
    DEFAULT_LOG_EVERY,
    ProgressLog,
    add_progress_flags,
    format_duration,
    library_bars_hidden,
    stderr_is_terminal,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
ETA = re.compile(r"(?<!\S)ETA(?!\S)")  # a word of its own


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _log(total: int | None = 500, unit: str = "turn", **kwargs) -> tuple[ProgressLog, io.StringIO, FakeClock]:
    stream, clock = io.StringIO(), FakeClock()
    kwargs.setdefault("terminal", False)
    progress = ProgressLog("generate", total, unit, log_every=60, stream=stream, clock=clock, **kwargs)
    return progress, stream, clock


def _lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


# ----------------------------------------------------------------------------- the lines


def test_a_line_at_each_interval_and_none_between():
    progress, stream, clock = _log()
    clock.now += 30
    progress.update(50, tokens=1000)
    assert _lines(stream) == []  # not due yet
    clock.now += 30
    progress.update(70, tokens=1100)
    assert _lines(stream) == ["generate: 120/500 turns (24%), 2.00 turns/s, 35.0 tokens/s, ETA 3m10s"]
    clock.now += 59
    progress.update(10)
    assert len(_lines(stream)) == 1  # 59 s since the last line
    clock.now += 1
    progress.update(10)
    assert len(_lines(stream)) == 2 and _lines(stream)[1].startswith("generate: 140/500 turns (28%), ")


def test_closing_line_says_done_with_the_average_rates():
    progress, stream, clock = _log()
    with progress:
        clock.now += 250
        progress.update(500, tokens=8475)
    assert _lines(stream)[-1] == "generate: done, 500/500 turns in 4m10s, 2.00 turns/s, 33.9 tokens/s"
    progress.close()  # a second close writes nothing
    assert len(_lines(stream)) == 2


def test_a_stage_that_ends_short_or_fails_says_stopped():
    progress, stream, clock = _log(total=10)
    clock.now += 5
    progress.update(4)
    progress.close()
    assert _lines(stream)[-1] == "generate: stopped, 4/10 turns in 5.0s, 0.80 turns/s"
    progress, stream, clock = _log(total=2)
    with pytest.raises(RuntimeError), progress:
        progress.update(2)
        raise RuntimeError("engine died")
    assert _lines(stream)[-1].startswith("generate: stopped, 2/2 turns in ")


def test_eta_is_a_word_of_its_own_and_unknown_before_anything_is_done():
    progress, stream, clock = _log()
    clock.now += 61
    progress.update(0)
    line = _lines(stream)[0]
    assert ETA.search(line) and line.endswith("ETA unknown") and "(0%)" in line


def test_an_unknown_total_has_no_percentage_or_eta_and_set_total_brings_them():
    progress, stream, clock = _log(total=None, unit="session")
    clock.now += 60
    progress.update(3)
    assert _lines(stream) == ["generate: 3 sessions, 0.05 sessions/s"]
    progress.set_total(6)
    clock.now += 60
    progress.update(1)
    assert _lines(stream)[1] == "generate: 4/6 sessions (66%), 0.0333 sessions/s, ETA 1m00s"
    progress.close()
    assert _lines(stream)[2].startswith("generate: stopped, 4/6 sessions in 2m00s")


def test_count_measures_are_totals_and_rate_measures_are_per_second():
    stream, clock = io.StringIO(), FakeClock()
    progress = ProgressLog("judge", 40, "turn", log_every=10, stream=stream, clock=clock, terminal=False)
    progress.update(0, prompts=12)
    progress.update(0, cache_hits=3)
    clock.now += 10
    progress.update(5, prompts=1)
    assert _lines(stream) == ["judge: 5/40 turns (12%), 0.50 turns/s, 13 prompts, 3 cache hits, ETA 1m10s"]


def test_no_carriage_return_ever_without_a_terminal():
    progress, stream, clock = _log(total=1000)
    for _ in range(1000):
        clock.now += 7
        progress.update(1, tokens=13)
    progress.close()
    text = stream.getvalue()
    assert "\r" not in text and len(_lines(stream)) > 100
    assert all(ETA.search(line) for line in _lines(stream)[:-1])


def test_disabled_writes_nothing_lines_or_bar():
    for terminal in (False, True):
        progress, stream, clock = _log(enabled=False, terminal=terminal)
        clock.now += 600
        progress.update(500, tokens=10)
        progress.close()
        assert stream.getvalue() == ""


def test_a_terminal_gets_the_tqdm_bar_and_no_lines():
    progress, stream, clock = _log(total=3, terminal=True)
    with progress:
        for _ in range(3):
            clock.now += 100
            progress.update(1)
    drawn = stream.getvalue()
    assert "generate" in drawn and "3/3" in drawn and "ETA" not in drawn and "done," not in drawn


def test_lines_come_at_the_interval_while_nothing_finishes():
    # The real clock starts a heartbeat: one long engine call still shows in the log. No timing is asserted.
    stream = io.StringIO()
    progress = ProgressLog("attention", 5, "session", log_every=0.01, stream=stream, terminal=False)
    deadline = time.monotonic() + 30
    while not stream.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    progress.close()
    lines = _lines(stream)
    assert lines[0].startswith("attention: 0/5 sessions (0%)") and ETA.search(lines[0])
    assert lines[-1].startswith("attention: stopped, 0/5 sessions in ")


def test_format_duration():
    assert [format_duration(s) for s in (0.42, 12, 59.6, 181, 3599.6, 7500)] == [
        "0.4s",
        "12s",
        "1m00s",
        "3m01s",
        "1h00m",
        "2h05m",
    ]


def test_log_every_must_be_a_finite_number_above_zero():
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(SysbenchError, match="--log-every"):
            ProgressLog("generate", 1, "turn", log_every=bad, terminal=False)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_librarys_own_tqdm_writes_nothing_to_a_log_file(monkeypatch):
    from tqdm.auto import tqdm

    log_file = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log_file)
    with library_bars_hidden():
        for _ in tqdm(range(3), desc="a library's bar"):
            pass
    assert log_file.getvalue() == ""
    assert sys.stderr is log_file


def test_stderr_is_terminal():
    assert stderr_is_terminal(_Tty()) is True
    assert stderr_is_terminal(io.StringIO()) is False
    closed = io.StringIO()
    closed.close()
    assert stderr_is_terminal(closed) is False
    assert stderr_is_terminal(object()) is False


# ----------------------------------------------------------------------------- the flags


def test_add_progress_flags_adds_log_every_and_no_progress_once():
    parser = argparse.ArgumentParser()
    add_progress_flags(parser)
    args = parser.parse_args([])
    assert args.log_every == DEFAULT_LOG_EVERY and args.no_progress is False
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-progress", action="store_true")
    add_progress_flags(parser)  # no conflict with the verb's own --no-progress
    assert parser.parse_args(["--no-progress", "--log-every", "0.5"]).log_every == 0.5


@pytest.mark.parametrize("verb", ["generate", "judge", "attention", "arena"])
def test_every_long_verb_takes_log_every_and_no_progress(verb):
    from sysbench_gpu.cli import build_parser

    required = {
        "generate": ["--data", "demo", "--model", "m", "--engine", "hf", "--out", "o"],
        "judge": ["RUN"],
        "attention": ["RUN", "--model", "m", "--out", "o"],
        "arena": ["A", "B", "--out", "o"],
    }[verb]
    args = build_parser().parse_args([verb, *required, "--log-every", "5", "--no-progress"])
    assert args.log_every == 5.0 and args.no_progress is True
    check_shared_flags(args)
    for bad in ("0", "nan", "-3"):
        with pytest.raises(SysbenchError, match="--log-every"):
            check_shared_flags(build_parser().parse_args([verb, *required, "--log-every", bad]))


# ----------------------------------------------------------------------------- end to end, stderr in a file

LOG_EVERY = "0.05"


def _cli_to_file(argv: list[str], stderr_path: Path, timeout: float = 900) -> str:
    """Run ``sysbench-gpu ARGV`` with stderr redirected to a file (no terminal); the file's text."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    with stderr_path.open("w") as stderr:
        done = subprocess.run(
            [sys.executable, "-m", "sysbench_gpu", *argv],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            timeout=timeout,
        )
    text = stderr_path.read_text()
    assert done.returncode == 0, text[-3000:]
    return text


def _check_progress_lines(text: str, stage: str, total: int, unit: str) -> tuple[list[str], str]:
    """Progress lines with ETA, one closing line with the count, and no \\r anywhere in the file."""
    assert "\r" not in text
    marker = f"sysbench_gpu.progress: {stage}: "  # the logging module's line: time, level, logger, message
    ours = [line.split(marker, 1)[1] for line in text.splitlines() if marker in line]
    progress = [line for line in ours if not line.startswith(("done,", "stopped,"))]
    closing = [line for line in ours if line.startswith("done,")]
    assert progress, text[-3000:]
    assert all(ETA.search(line) and f"/{total} {unit}" in line for line in progress), progress
    assert len(closing) == 1 and closing[0].startswith(f"done, {total}/{total} {unit} in "), ours
    return progress, closing[0]


@pytest.fixture(scope="module")
def generated_run(tmp_path_factory, smollm2_path) -> tuple[Path, str]:
    """One demo session generated by the embedded model (4 tokens a reply), stderr in a file."""
    root = tmp_path_factory.mktemp("progress")
    run = root / "run"
    argv = ["generate", "--data", "demo", "--model", "smollm2", "--engine", "hf", "--limit", "1"]
    argv += ["--max-tokens", "4", "--seed", "0", "--out", str(run), "--log-every", LOG_EVERY]
    return run, _cli_to_file(argv, root / "generate.stderr")


@pytest.mark.slow
def test_generate_writes_progress_lines_to_a_log_file(generated_run):
    _, text = generated_run
    _, closing = _check_progress_lines(text, "generate", 5, "turns")
    assert closing.endswith(" tokens/s")
    assert "hf batches" not in text


@pytest.mark.slow
def test_judge_writes_progress_lines_to_a_log_file(generated_run, tmp_path):
    run, _ = generated_run
    argv = ["judge", str(run), "--judge", "hf", "--judge-model", "smollm2", "--template", "en"]
    argv += ["--max-tokens", "12", "--max-retries", "1", "--seed", "0", "--log-every", LOG_EVERY]
    text = _cli_to_file(argv, tmp_path / "judge.stderr")
    _, closing = _check_progress_lines(text, "judge", 5, "turns")
    assert "5 prompts" in closing  # one attempt per turn, none from the cache


@pytest.mark.slow
def test_attention_writes_progress_lines_to_a_log_file(generated_run, tmp_path):
    run, _ = generated_run
    argv = ["attention", str(run), "--model", "smollm2", "--out", str(tmp_path / "attn"), "--layers", "1"]
    argv += ["--chunk-tokens", "48", "--bootstrap", "10", "--no-figures", "--control", "--log-every", LOG_EVERY]
    text = _cli_to_file(argv, tmp_path / "attention.stderr")
    _, closing = _check_progress_lines(text, "attention", 2, "sessions")  # the system arm and the control
    assert closing.endswith(" tokens/s")


@pytest.mark.slow
def test_no_progress_silences_the_lines(generated_run, tmp_path):
    run, _ = generated_run
    out = tmp_path / "attn"
    argv = ["attention", str(run), "--model", "smollm2", "--out", str(out), "--layers", "1", "--chunk-tokens", "48"]
    argv += ["--bootstrap", "10", "--no-figures", "--log-every", LOG_EVERY, "--no-progress"]
    text = _cli_to_file(argv, tmp_path / "attention.stderr")
    assert "sysbench_gpu.progress" not in text and "\r" not in text
    assert len(list((out / "sessions").glob("*.npz"))) == 1
