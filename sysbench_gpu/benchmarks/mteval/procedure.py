"""The paper's procedure: its decoding as a ``generate`` preset, and how a run's manifest departs from it.

The published leaderboard was made from float16 weights with greedy decoding, up to 1,024 new
tokens, no repetition penalty and the authors' default system message (``inference.py``, which
decodes with a fresh ``GenerationConfig``, so a model's own ``repetition_penalty`` never applied), judged by
gpt-4-0613 at temperature 0 with the four official prompts (``evaluate.py``), and rule-scored
by ``calculate_score.py``.
``metrics`` and ``report`` name every way a run differs, in one line, so a row beside the
leaderboard says what it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sysbench_gpu.benchmarks.base import GenerationPreset
from sysbench_gpu.benchmarks.mteval.tasks import DEFAULT_SYSTEM_MESSAGE

PAPER_MAX_TOKENS = 1024
PAPER_REPETITION_PENALTY = 1.0
PAPER_DTYPE = "float16"  # inference.py loads with torch_dtype=torch.float16
PAPER_JUDGE_MODEL = "gpt-4-0613"
# The official prompts with {content}, which evaluate.py fills from documents.jsonl.
QUOTING_KINDS = frozenset({"refinement_single", "refinement_multi", "expansion"})
PAPER_PRESET = GenerationPreset(
    name="mteval-paper",
    description="MT-Eval as published: greedy decoding, 1,024 new tokens, repetition penalty 1.0, "
    "the authors' default system message",
    temperature=0.0,
    max_tokens=PAPER_MAX_TOKENS,
    system_message=DEFAULT_SYSTEM_MESSAGE,
    repetition_penalty=PAPER_REPETITION_PENALTY,
)
PAPER_SUMMARY = (
    f"{PAPER_DTYPE} weights, greedy, {PAPER_MAX_TOKENS:,} new tokens, repetition penalty "
    f"{PAPER_REPETITION_PENALTY:g}, judge {PAPER_JUDGE_MODEL} at temperature 0"
)


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
    penalty = repetition_penalty_difference(generate)
    if penalty:
        found.append(penalty)
    # vLLM also takes these two from the model's generation config; the authors' fresh config had neither.
    for name in ("presence_penalty", "frequency_penalty"):
        value = defaults.get(name) if isinstance(defaults, Mapping) else None
        if isinstance(value, (int, float)) and value != 0:
            found.append(f"{name.replace('_', ' ')} {value:g} (the model's generation config), not 0")
    # The authors load every open model in float16; a server's dtype (openai engine) is not known here.
    dtype = (generate.get("engine_describe") or {}).get("dtype") if generate.get("engine") in ("hf", "vllm") else None
    if isinstance(dtype, str) and dtype.removeprefix("torch.") not in (PAPER_DTYPE, "half"):
        found.append(f"weights in {dtype.removeprefix('torch.')}, not {PAPER_DTYPE}")
    message = generate.get("system_message")
    if message != DEFAULT_SYSTEM_MESSAGE:
        shown = "none" if not message else repr(message if isinstance(message, str) else "several")[:48]
        found.append(f"system message {shown}, not the authors' default")
    return found


def repetition_penalty_difference(generate: Mapping[str, Any]) -> str | None:
    """How the run's repetition penalty differs from the paper's 1.0 (none), or None.

    Asked for (``sampling``) it is what the hf and vllm engines applied; left unset, they applied the
    model's generation config (``sampling_defaults``; none recorded there means none applied). The
    openai engine records whether its server takes the field at all: OpenAI's API does not and
    applies none; a server that takes it (vLLM's) was either sent the value or used its own default.
    """
    sampling = generate.get("sampling") or {}
    asked = sampling.get("repetition_penalty")
    if generate.get("engine") == "openai":
        engine = generate.get("engine_describe") or {}
        takes = engine.get("takes_repetition_penalty")
        if takes is None:  # recorded before the engine said; OpenAI's own API is known to take none
            takes = not str(engine.get("base_url") or "").startswith("https://api.openai.com")
        if not takes:
            return None
        sent = engine.get("repetition_penalty_sent")  # --extra-body may carry it too
        asked = sent if sent is not None else asked
        if asked is None:
            return f"repetition penalty left to the server's default, not {PAPER_REPETITION_PENALTY:g}"
    elif asked is None:
        defaults = generate.get("sampling_defaults") or {}
        default = defaults.get("repetition_penalty") if isinstance(defaults, Mapping) else None
        if isinstance(default, (int, float)) and default != PAPER_REPETITION_PENALTY:
            return f"repetition penalty {default:g} (the model's generation config), not {PAPER_REPETITION_PENALTY:g}"
        return None
    if asked != PAPER_REPETITION_PENALTY:
        return f"repetition penalty {asked:g}, not {PAPER_REPETITION_PENALTY:g}"
    return None


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
        elif set(judge.get("score_templates") or {}) & QUOTING_KINDS and not judge.get("documents"):
            # Judged before {content} came from documents.jsonl: the dialogue's own copy of the article.
            found.append("official prompts filled with the dialogue's article, not documents.jsonl (--rejudge)")
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
