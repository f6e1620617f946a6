"""SysBench behind the Benchmark protocol: each method hands over to the module that does the job."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from sysbench_gpu.benchmarks.base import Benchmark, ReportRequest, ReportResult
from sysbench_gpu.benchmarks.explorer import ExploreLayout, TurnView
from sysbench_gpu.benchmarks.judge_tasks import NEEDS_JUDGE, JudgePlan
from sysbench_gpu.benchmarks.registry import register_benchmark
from sysbench_gpu.benchmarks.sysbench import (
    ablations,
    agreement,
    data,
    explore_view,
    judge_plan,
    metrics,
    metrics_text,
)
from sysbench_gpu.benchmarks.sysbench.download import download_official
from sysbench_gpu.benchmarks.sysbench.judge_prompt import load_template
from sysbench_gpu.benchmarks.sysbench.report import report_sysbench
from sysbench_gpu.benchmarks.sysbench.report_tables import SORT_KEYS
from sysbench_gpu.benchmarks.sysbench.schema import session_to_upstream
from sysbench_gpu.core.ablation_files import SINGLE_TURN
from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.loaded_run import LoadedRun
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.core.sessions import Dataset, Session


@register_benchmark
class SysBench(Benchmark):
    """System-message following: five user turns per session, a typed checklist per turn, CSR / ISR / SSR."""

    name: ClassVar[str] = data.BENCHMARK
    title: ClassVar[str] = "SysBench"
    data_filenames: ClassVar[tuple[str, ...]] = (data.OFFICIAL_FILENAME,)
    history_modes: ClassVar[tuple[str, ...]] = ("model", "reference", SINGLE_TURN)
    sort_keys: ClassVar[tuple[str, ...]] = SORT_KEYS
    report_extras: ClassVar[bool] = True

    # -- data ------------------------------------------------------------------
    def claims(self, text: str) -> bool:
        return data.claims_text(text)

    def parse(
        self, text: str, source: Path, *, system_message: str | None = None, task: str | None = None
    ) -> list[Session]:
        return data.parse_text(text, source, system_message=system_message, task=task)

    def serialize(self, sessions: Sequence[Session]) -> bytes:
        payload = [session_to_upstream(session) for session in sessions]
        return (json.dumps(payload, ensure_ascii=False, indent=2) + "\n").encode("utf-8")

    def is_official(self, dataset: Dataset) -> bool:
        return dataset.sha256 == data.OFFICIAL_SHA256

    def stats(self, dataset: Dataset) -> dict[str, Any]:
        return {**data.dataset_stats(dataset.sessions), "sha256": dataset.sha256, "is_official": dataset.is_official}

    def format_stats(self, dataset: Dataset, stats: Mapping[str, Any]) -> str:
        return data.format_stats(stats, dataset)

    def describe_valid(self, dataset: Dataset) -> str:
        status = "the official file" if dataset.is_official else "valid, but not the official file"
        return f"{dataset.path}: {len(dataset.sessions)} sessions, {status} (sha256 {dataset.sha256})"

    def download(self, out: Path, options: Mapping[str, Any]) -> list[str]:
        url = options.get("url") or data.OFFICIAL_URL
        target = download_official(out, url=url)
        return [f"wrote {target} (sha256 {data.OFFICIAL_SHA256}, official)"]

    # -- generation ------------------------------------------------------------
    def check_generation(self, history: str, distractor_turns: int) -> None:
        if history not in self.history_modes:
            raise SysbenchError(f"--history must be one of {', '.join(self.history_modes)}, got {history!r}")

    def distractor_pool(self, sessions: Sequence[Session]) -> Mapping[int, Sequence[Any]]:
        return ablations.distractor_pool(sessions)

    def choose_distractors(
        self, pool: Mapping[int, Sequence[Any]], session: Session, count: int, seed: int
    ) -> tuple[Any, ...]:
        return ablations.choose_distractors(pool, session.system_id, count, seed)

    def history_replies(self, session: Session, turn: int, history: str, replies: Mapping[int, str]) -> dict[int, str]:
        if history == "reference":
            return {t.index: t.reference or "" for t in session.turns[: turn - 1]}
        if history == SINGLE_TURN:
            return {}
        return {index: replies[index] for index in range(1, turn)}

    def messages(
        self, session: Session, turn: int, history: str, replies: Mapping[int, str], distractors: Sequence[Any] = ()
    ) -> list[ChatMessage]:
        return ablations.ablation_conversation(
            session,
            turn,
            self.history_replies(session, turn, history, replies),
            single_turn=history == SINGLE_TURN,
            distractors=tuple(distractors),
        )

    def generation_manifest(self, sessions: Sequence[Session]) -> dict[str, Any]:
        return {"task": None, "system_message": None}

    # -- judging ---------------------------------------------------------------
    def judge_flag_error(self, *, template: bool, score_templates: bool) -> str | None:
        if score_templates:
            return "--mteval-template applies to MT-Eval runs; a SysBench run takes --template"
        return None

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
        if settings is None:
            raise SysbenchError(f"judge needs {NEEDS_JUDGE} (a SysBench run is judged against its checklists)")
        plan = judge_plan.plan_judging(
            sessions,
            dict(generations),
            judged,
            settings.template,
            limit,
            settings.model,
            judge_plan.imported_history_mode(run),
            system_ids,
            run_history=judge_plan.generated_history_mode(run.read_manifest()),
        )
        plan.template_sha256 = settings.template.sha256
        return plan

    def judge_template(self, spec: str | None, language: str | None) -> Any:
        return load_template(spec or "zh", language)

    def describe_judge_templates(self, settings: Any) -> str:
        return f"template {settings.template.sha256[:12]}"

    def judge_manifest(self, settings: Any, plan: JudgePlan, scorers: Mapping[str, int]) -> dict[str, Any]:
        template = settings.template
        return {"template": {"name": template.name, "language": template.language, "sha256": template.sha256}}

    def judge_agreement(self, run_a: Path, run_b: Path) -> dict[str, Any]:
        return agreement.compare_runs(run_a, run_b)

    def format_agreement(self, report: Mapping[str, Any]) -> str:
        return agreement.format_report(report)

    # -- metrics and reports ---------------------------------------------------
    def run_metrics(self, loaded: LoadedRun, **options: Any) -> dict[str, Any]:
        return metrics.sysbench_run_metrics(loaded, **options)

    def format_metrics(self, result: Mapping[str, Any]) -> str:
        return metrics_text.format_metrics(result)

    def compare(self, runs: Sequence[LoadedRun], **options: Any) -> dict[str, Any]:
        return metrics.compare_sysbench(runs, **options)

    def format_comparison(self, result: Mapping[str, Any]) -> str:
        return metrics_text.format_comparison(result)

    def report(self, request: ReportRequest) -> ReportResult:
        return report_sysbench(request)

    # -- explorer --------------------------------------------------------------
    def turn_view(self, session: Session, turn: int, judgment: JudgmentRecord | None) -> TurnView:
        return explore_view.turn_view(session, turn, judgment)

    def session_facets(self, session: Session) -> dict[str, Any]:
        return explore_view.session_facets(session)

    def explore_layout(self, metrics: Mapping[str, Any] | None) -> ExploreLayout:
        return explore_view.explore_layout(metrics)
