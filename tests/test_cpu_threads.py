"""engines.cpu_threads: torch's threads on a CPU are the cores other work leaves idle."""

from __future__ import annotations

from pathlib import Path

from sysbench_gpu.engines.cpu_threads import busy_cores, choose_cpu_threads, read_cpu_times

STAT = """cpu  300 0 100 600 0 0 0 0 0 0
cpu0 100 0 50 300 0 0 0 0 0 0
cpu1 200 0 50 300 0 0 0 0 0 0
intr 12345
"""


def test_proc_stat_gives_busy_and_total_jiffies_per_core(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    assert read_cpu_times(stat) == {0: (150, 450), 1: (250, 550)}
    assert read_cpu_times(tmp_path / "missing") == {}


def test_a_core_busier_than_half_over_the_sample_is_busy() -> None:
    samples = iter([{0: (0, 0), 1: (0, 0)}, {0: (10, 100), 1: (90, 100)}])
    assert busy_cores({0, 1}, read=lambda: next(samples), sample_s=0) == {1}
    unreadable = iter([{}, {}])
    assert busy_cores({0, 1}, read=lambda: next(unreadable), sample_s=0) is None


def test_threads_are_the_idle_cores_unless_given_or_set_in_the_environment() -> None:
    one_busy = choose_cpu_threads(None, environ={}, allowed=lambda: {0, 1}, measure=lambda cores: {1})
    assert one_busy.threads == 1 and "1 of 2 allowed cores idle" in one_busy.why
    all_busy = choose_cpu_threads(None, environ={}, allowed=lambda: {0, 1}, measure=lambda cores: {0, 1})
    assert all_busy.threads == 1  # never fewer than one
    idle = choose_cpu_threads(None, environ={}, allowed=lambda: {0, 1, 2, 3}, measure=lambda cores: set())
    assert idle.threads == 4
    assert choose_cpu_threads(3, environ={"OMP_NUM_THREADS": "2"}).threads == 3
    from_env = choose_cpu_threads(None, environ={"OMP_NUM_THREADS": "2"}, measure=lambda cores: {0})
    assert from_env.threads is None and "OMP_NUM_THREADS=2" in from_env.why
    unknown = choose_cpu_threads(None, environ={}, allowed=lambda: {0}, measure=lambda cores: None)
    assert unknown.threads is None
