"""MT-Eval behind the Benchmark protocol: each method hands over to the module that does the job."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from sysbench_gpu.benchmarks.base import Benchmark, GenerationPreset, ReportRequest, ReportResult
from sysbench_gpu.benchmarks.explorer import ExploreLayout, TurnView
from sysbench_gpu.benchmarks.judge_tasks import NEEDS_JUDGE, JudgePlan
from sysbench_gpu.benchmarks.mteval import (
    agreement,
    conversation,
    data,
    explore_view,
    procedure,
    run_metrics,
    scoring,
)
from sysbench_gpu.benchmarks.mteval.download import download_mteval
from sysbench_gpu.benchmarks.mteval.judge_prompt import load_score_template
from sysbench_gpu.benchmarks.mteval.official_prompts import DOCUMENTS_FILE, OFFICIAL_COMMIT, load_official_prompts
from sysbench_gpu.benchmarks.mteval.report import report_mteval
from sysbench_gpu.benchmarks.mteval.sentences import RULE_SETS
from sysbench_gpu.benchmarks.mteval.tasks import BENCHMARK, HF_CONFIGS, HF_DATASET, SCORERS
from sysbench_gpu.benchmarks.registry import register_benchmark
from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.loaded_run import LoadedRun
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.core.sessions import Dataset, Session


@register_benchmark
class MTEval(Benchmark):
    """Multi-turn instruction following: refinement, expansion, follow-up and recollection, scored 0-10."""

    name: ClassVar[str] = BENCHMARK
    title: ClassVar[str] = "MT-Eval"
    history_modes: ClassVar[tuple[str, ...]] = conversation.HISTORY_MODES
    call_unit: ClassVar[str] = "answered turn"
    compares_many: ClassVar[bool] = True
    rule_scored: ClassVar[bool] = True
    scorers: ClassVar[tuple[str, ...]] = SCORERS
    judge_options: ClassVar[Mapping[str, tuple[tuple[str, ...], str]]] = {
        "judge_prompts": (
            scoring.PROMPT_SETS,
            "MT-Eval: the authors' four judge prompts, filled as evaluate.py fills them (official, the default), "
            "or our reworded three (ours)",
        ),
        "rules": (
            RULE_SETS,
            "MT-Eval: rule verdicts as the authors' code gives them (official, the default: Punkt sentences, "
            "first-code-point emoji, plain cls substring) or our lenient variants (lenient)",
        ),
    }
    # The judge options in force (``configured`` makes a copy with others).
    rules: str = RULE_SETS[0]
    prompts: str = scoring.PROMPT_SETS[0]

    # -- data ------------------------------------------------------------------
    def claims(self, text: str) -> bool:
        """JSON Lines (or one object) of dialogues with a ``conv`` list; unreadable lines are MT-Eval's to report."""
        body = text.lstrip("\ufeff \t\r\n")
        if not body.startswith("{"):
            return False
        try:
            whole = json.loads(body)
        except json.JSONDecodeError:
            first = body.split("\n", 1)[0]
            try:
                head = json.loads(first)
            except json.JSONDecodeError:
                return True
            return not isinstance(head, dict) or "conv" in head
        except RecursionError:
            return False
        return isinstance(whole, dict) and "conv" in whole

    def parse(
        self, text: str, source: Path, *, system_message: str | None = None, task: str | None = None
    ) -> list[Session]:
        return data.parse_dialogues(text, source=source, system_message=system_message, task=task)

    def serialize(self, sessions: Sequence[Session]) -> bytes:
        lines = [json.dumps(data.dialogue_to_json(s), ensure_ascii=False) + "\n" for s in sessions]
        return "".join(lines).encode("utf-8")

    def stats(self, dataset: Dataset) -> dict[str, Any]:
        return {**data.mteval_stats(dataset.sessions), "sha256": dataset.sha256}

    def format_stats(self, dataset: Dataset, stats: Mapping[str, Any]) -> str:
        return data.format_mteval_stats(stats, dataset.path, dataset.sha256)

    def describe_valid(self, dataset: Dataset) -> str:
        tasks = ", ".join(sorted({s.task or "?" for s in dataset.sessions}))
        return f"{dataset.path}: {len(dataset.sessions)} MT-Eval dialogues ({tasks}), valid (sha256 {dataset.sha256})"

    def download(self, out: Path, options: Mapping[str, Any]) -> list[str]:
        tasks = options.get("tasks")
        configs = [c.strip() for c in tasks.split(",") if c.strip()] if tasks else list(HF_CONFIGS)
        return [
            f"wrote {target} (Hugging Face dataset {HF_DATASET})"
            for target in download_mteval(out, configs, revision=options.get("revision"))
        ]

    # -- generation ------------------------------------------------------------
    def check_generation(self, history: str, distractor_turns: int) -> None:
        if history not in self.history_modes:
            raise SysbenchError(
                f"--history {history} is a SysBench ablation; MT-Eval's single-turn setting is its *_single files"
            )
        if distractor_turns:
            raise SysbenchError(
                "--distractor-turns is a SysBench ablation; MT-Eval's irrelevant-context setting is its "
                "refinement_ablation_irrelevant-* files"
            )

    def history_replies(self, session: Session, turn: int, history: str, replies: Mapping[int, str]) -> dict[int, str]:
        return conversation.history_for_turn(session, turn, history, replies)

    def messages(
        self, session: Session, turn: int, history: str, replies: Mapping[int, str], distractors: Sequence[Any] = ()
    ) -> list[ChatMessage]:
        return conversation.conversation_for_answered_turn(session, turn, history, replies)

    def generation_manifest(self, sessions: Sequence[Session]) -> dict[str, Any]:
        """The task and the system message the run sends ("" for none; a list if dialogues differ)."""
        messages = sorted({s.system_prompt for s in sessions})
        return {
            "task": sessions[0].task if sessions else None,
            "system_message": (messages[0] if len(messages) == 1 else messages) if sessions else None,
        }

    def generation_presets(self) -> tuple[GenerationPreset, ...]:
        return (procedure.PAPER_PRESET,)

    def procedure_warning(self, manifest: Mapping[str, Any]) -> str | None:
        return procedure.procedure_warning(manifest)

    # -- judging ---------------------------------------------------------------
    def judge_flag_error(self, *, template: bool, score_templates: bool) -> str | None:
        if template:
            return (
                "--template and --template-lang apply to SysBench runs; "
                "an MT-Eval run takes --mteval-template KIND=FILE"
            )
        return None

    def configured(self, options: Mapping[str, Any]) -> MTEval:
        super().configured(options)
        chosen = copy.copy(self)
        chosen.rules = options.get("rules") or self.rules
        chosen.prompts = options.get("judge_prompts") or self.prompts
        return chosen

    def judge_settings(self, settings: Any) -> Any:
        if settings is None:
            return None
        if self.prompts == "official":
            if settings.score_templates:
                raise SysbenchError(
                    "--mteval-template replaces one of our templates; pass --judge-prompts ours with it"
                )
            return dataclasses.replace(settings, score_templates=load_official_prompts())
        builtin = scoring.builtin_score_templates()
        return dataclasses.replace(settings, score_templates={**builtin, **settings.score_templates})

    def plan_judging(
        self,
        run: RunDir,
        sessions: Sequence[Session],
        generations: Mapping[Any, GenerationRecord],
        judged: set[tuple[int, int]],
        settings: Any,
        limit: int | None,
        system_ids: Any,
    ) -> JudgePlan:
        """1-10 judge tasks and rule-scored records; without a judge, only rule-scored turns may be pending."""
        plan = scoring.plan_mteval(
            sessions,
            dict(generations),
            judged,
            settings.score_templates if settings is not None else None,
            limit,
            settings.model if settings is not None else None,
            system_ids,
            rules=self.rules,
            prompts=self.prompts,
        )
        if settings is None and plan.tasks:
            tasks = ", ".join(plan.judge_tasks)
            raise SysbenchError(
                f"{run.path}: task {tasks} is scored by an LLM judge: pass {NEEDS_JUDGE} "
                f"({len(plan.tasks)} turn(s) to score; the recollection tasks need no judge)"
            )
        return plan

    def judge_templates(self, pairs: Sequence[str]) -> dict[str, Any]:
        """``--mteval-template KIND=FILE`` -> {kind: template}; the other kinds stay built in."""
        return {kind: load_score_template(kind, path) for kind, path in scoring.parse_template_options(pairs).items()}

    def describe_judge_templates(self, settings: Any) -> str:
        if self.prompts == "official":
            return f"MT-Eval's official 1-10 prompts at {OFFICIAL_COMMIT[:7]}"
        return "MT-Eval 1-10 templates (ours)"

    def judge_manifest(self, settings: Any, plan: JudgePlan, scorers: Mapping[str, int]) -> dict[str, Any]:
        kinds = sorted({task.score_kind for task in plan.tasks if task.score_kind})
        return {
            "score_templates": {
                kind: {"name": settings.score_templates[kind].name, "sha256": settings.score_templates[kind].sha256}
                for kind in kinds
            },
            "score_scale": "integer 1-10 from the judge; rule-scored turns 0 or 10",
            "scorers": scorers,
            "rules": plan.options.get("rules"),
            "judge_prompts": plan.options.get("judge_prompts"),
            **({"prompts_commit": OFFICIAL_COMMIT} if plan.options.get("judge_prompts") == "official" else {}),
            # The articles the official prompts quote in {content}: part of the instrument too.
            **(
                {"documents": {"name": f"official:{DOCUMENTS_FILE.filename}", "sha256": DOCUMENTS_FILE.sha256}}
                if any(settings.score_templates[kind].documents for kind in kinds)
                else {}
            ),
        }

    def judge_agreement(self, run_a: Path, run_b: Path) -> dict[str, Any]:
        return agreement.mteval_agreement(run_a, run_b)

    def format_agreement(self, report: Mapping[str, Any]) -> str:
        return agreement.format_agreement(report)

    # -- metrics and reports ---------------------------------------------------
    def run_metrics(self, loaded: LoadedRun, **options: Any) -> dict[str, Any]:
        return run_metrics.mteval_run_metrics(loaded, **options)

    def format_metrics(self, result: Mapping[str, Any]) -> str:
        return run_metrics.format_mteval_metrics(result)

    def compare(self, runs: Sequence[LoadedRun], **options: Any) -> dict[str, Any]:
        return run_metrics.compare_mteval_runs(list(runs), **options)

    def format_comparison(self, result: Mapping[str, Any]) -> str:
        return run_metrics.format_mteval_comparison(result)

    def report(self, request: ReportRequest) -> ReportResult:
        return report_mteval(request)

    # -- explorer --------------------------------------------------------------
    def turn_view(self, session: Session, turn: int, judgment: JudgmentRecord | None) -> TurnView:
        return explore_view.turn_view(session, turn, judgment)

    def session_facets(self, session: Session) -> dict[str, Any]:
        return explore_view.session_facets(session)

    def explore_layout(self, metrics: Mapping[str, Any] | None) -> ExploreLayout:
        return explore_view.explore_layout(metrics)
