"""The design card's face of the judging stage: the verifier, cached and resumable.

``judge_run(run_dir, settings, ...)`` judges every generated turn of a run as its
benchmark defines judging; the stage lives in ``sysbench_gpu.judging``.
"""

from sysbench_gpu.judging.ledger import LEDGER
from sysbench_gpu.judging.rounds import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_MAX_TOKENS,
    JudgeSettings,
    temperature_for,
)
from sysbench_gpu.judging.stage import JUDGE_BACKENDS, STAGE, dry_run_report, judge_run

__all__ = [
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_MAX_TOKENS",
    "JUDGE_BACKENDS",
    "LEDGER",
    "STAGE",
    "JudgeSettings",
    "dry_run_report",
    "judge_run",
    "temperature_for",
]
