"""MT-Eval's tasks, their categories and scorers, and upstream's config and file names."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

BENCHMARK = "mteval"


# The system message of upstream's inference.py (its README spells it with a serial comma;
# the code, which produced the published numbers, does not).
DEFAULT_SYSTEM_MESSAGE = "You are a helpful, respectful and honest assistant."


HF_DATASET = "wckwan/MT-Eval"


# One config (and one file, ``<config>.jsonl``) per task and setting on the hub.
HF_CONFIGS: tuple[str, ...] = (
    "refinement_multi",
    "refinement_single",
    "expansion_multi",
    "expansion_single",
    "follow-up_multi",
    "follow-up_single",
    "recollection_multi_cls",
    "recollection_single_cls",
    "recollection_multi_global-inst",
    "recollection_single_global-inst",
)


SCORERS = ("judge", "cls", "ifeval")


CATEGORIES = ("recollection", "expansion", "refinement", "follow-up")  # the leaderboard's columns


@dataclass(frozen=True)
class TaskInfo:
    name: str
    category: str  # one of CATEGORIES, or the ablation's own name
    scorer: str  # "judge" (1-10 LLM judge), "cls" (gold label contained), "ifeval" (verifiable instruction)


TASKS: Mapping[str, TaskInfo] = {
    info.name: info
    for info in (
        TaskInfo("refinement", "refinement", "judge"),
        TaskInfo("expansion", "expansion", "judge"),
        TaskInfo("follow-up", "follow-up", "judge"),
        TaskInfo("recollection-cls", "recollection", "cls"),
        TaskInfo("recollection-global-inst", "recollection", "ifeval"),
        TaskInfo("cls-ablation-gold", "cls-ablation", "cls"),
        TaskInfo("cls-ablation-dgc", "cls-ablation", "cls"),
        TaskInfo("cls-ablation-sgc", "cls-ablation", "cls"),
        TaskInfo("cls-ablation-rc", "cls-ablation", "cls"),
        TaskInfo("refinement-irrelevant-front", "refinement-irrelevant", "judge"),
        TaskInfo("refinement-irrelevant-between", "refinement-irrelevant", "judge"),
    )
}


# Upstream's file and config names -> (task, setting).
_NAME_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(refinement|expansion|follow-up)_(multi|single)"), "{0}"),
    (re.compile(r"recollection_(multi|single)_(cls|global-inst)"), "recollection-{0}"),
    (re.compile(r"cls_ablation_(gold|dgc|sgc|rc)"), "cls-ablation-{0}"),
    (re.compile(r"refinement_ablation_(irrelevant-front|irrelevant-between)"), "refinement-{0}"),
)


def task_from_name(name: str) -> tuple[str, str] | None:
    """``"refinement_multi"`` (a config, a file name or stem) -> ``("refinement", "multi")``; None if unknown.

    A task name itself (``"recollection-cls"``) is accepted too, with the setting unknown ("").
    """
    stem = Path(name).name
    for suffix in (".jsonl", ".json"):
        stem = stem.removesuffix(suffix)
    if stem in TASKS:
        return stem, ""
    for pattern, template in _NAME_PATTERNS:
        match = pattern.match(stem)
        if match:
            groups = match.groups()
            task = template.format(*(g for g in groups if g not in ("multi", "single")))
            setting = next((g for g in groups if g in ("multi", "single")), "ablation")
            return task, setting
    return None
