"""The paper's procedure: its decoding as a ``generate`` preset, and how a run's manifest departs from it.

The published leaderboard was made with greedy decoding, up to 1,024 new tokens and the
authors' default system message (``inference.py``), judged by gpt-4-0613 at temperature 0 with
the four official prompts (``evaluate.py``), and rule-scored by ``calculate_score.py``.
``metrics`` and ``report`` name every way a run differs, in one line, so a row beside the
leaderboard says what it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sysbench_gpu.benchmarks.base import GenerationPreset
from sysbench_gpu.benchmarks.mteval.tasks import DEFAULT_SYSTEM_MESSAGE

PAPER_MAX_TOKENS = 1024
PAPER_JUDGE_MODEL = "gpt-4-0613"
PAPER_PRESET = GenerationPreset(
    name="mteval-paper",
    description="MT-Eval as published: greedy decoding, 1,024 new tokens, the authors' default system message",
    temperature=0.0,
    max_tokens=PAPER_MAX_TOKENS,
    system_message=DEFAULT_SYSTEM_MESSAGE,
)
PAPER_SUMMARY = f"greedy, {PAPER_MAX_TOKENS:,} new tokens, judge {PAPER_JUDGE_MODEL} at temperature 0"


def _section(manifest: Mapping[str, Any], stage: str) -> Mapping[str, Any]:
    section = (manifest.get("stages") or {}).get(stage)
    return section if isinstance(section, Mapping) else {}


def decoding_differences(generate: Mapping[str, Any]) -> list[str]:
    """How the generate stage's decoding and system message differ from the paper's."""
    if not generate:
        return []
    sampling = generate.get("sampling") or {}
    defaults = generate.get("sampling_defaults") or {}
    found = []
    temperature = sampling.get("temperature")
    if temperature is None:
        found.append("decoding by the model's own generation config, not greedy")
    elif temperature > 0:
        found.append(f"temperature {temperature:g}, not greedy")
    max_tokens = sampling.get("max_tokens")
    if max_tokens is None:
        default = defaults.get("max_tokens") if isinstance(defaults, Mapping) else None
        shown = f"{default:,} (engine default)" if isinstance(default, int) else "the engine default"
        found.append(f"max new tokens {shown}, not {PAPER_MAX_TOKENS:,}")
    elif max_tokens != PAPER_MAX_TOKENS:
        found.append(f"max new tokens {max_tokens:,}, not {PAPER_MAX_TOKENS:,}")
    message = generate.get("system_message")
    if message != DEFAULT_SYSTEM_MESSAGE:
        shown = "none" if not message else repr(message if isinstance(message, str) else "several")[:48]
        found.append(f"system message {shown}, not the authors' default")
    return found


def judging_differences(judge: Mapping[str, Any]) -> list[str]:
    """How the judge stage differs: judge model, prompt set, rule set (older runs recorded neither set)."""
    if not judge:
        return []
    found = []
    model = judge.get("judge_model")
    if model is not None:
        if model != PAPER_JUDGE_MODEL:
            found.append(f"judge {model}, not {PAPER_JUDGE_MODEL}")
        prompts = judge.get("judge_prompts")
        if prompts != "official":
            found.append("our judge prompts, not the official ones" + ("" if prompts else " (not recorded)"))
    rules = judge.get("rules")
    if rules != "official":
        found.append(f"{rules or 'lenient'} rules, not the authors'" + ("" if rules else " (not recorded)"))
    return found


def procedure_warning(manifest: Mapping[str, Any]) -> str | None:
    """One line naming every difference from the paper's procedure, or None when there is none."""
    found = decoding_differences(_section(manifest, "generate")) + judging_differences(_section(manifest, "judge"))
    if not found:
        return None
    return f"made unlike the MT-Eval paper ({PAPER_SUMMARY}): " + "; ".join(found)
