"""Toy keywords: each turn asks for a reply that names a keyword; a rule scores it 10 (named) or 0 (not).

The data file is JSON Lines: a header line ``{"toy_benchmark": 1}``, then one session per line::

    {"id": 1, "topic": "fruit", "system": "Answer briefly.",
     "turns": [{"user": "Name a yellow fruit.", "keyword": "banana"}, ...]}

The header is what :meth:`ToyKeywords.claims` looks for, so the file (and a run's
``sessions.json``, written in the same format) is never SysBench's (a JSON array or one
object) nor MT-Eval's (JSON Lines whose first object has ``conv``). A turn's keyword is kept
as its one checklist item (``Turn.constraints``), so the explorer shows it with the turn.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from sysbench_gpu.benchmarks.base import Benchmark, ReportRequest, ReportResult
from sysbench_gpu.benchmarks.explorer import ExploreLayout, TurnView
from sysbench_gpu.benchmarks.judge_tasks import JudgePlan, PendingTurns, skipped_record
from sysbench_gpu.benchmarks.registry import register_benchmark
from sysbench_gpu.benchmarks.runs import load_run
from sysbench_gpu.benchmarks.turn_scoring import all_turns, split_turns
from sysbench_gpu.core.chat import ChatMessage
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.loaded_run import LoadedRun
from sysbench_gpu.core.messages import conversation_for_turn
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord
from sysbench_gpu.core.rundir import RunDir, write_bytes_atomic, write_json_atomic
from sysbench_gpu.core.sessions import NO_ALIGNMENT, Constraint, Dataset, Session, Turn, select_sessions
from sysbench_gpu.core.stats import bootstrap_index, percentile_ci
from sysbench_gpu.core.tables import Table, render_latex, render_markdown

NAME = "toy"
HEADER_KEY = "toy_benchmark"
SCORER = "keyword"  # who scores a toy turn: the keyword rule (a judgment's ``scorer``)
PASS, FAIL = 10.0, 0.0


# ---------------------------------------------------------------- data


def keyword_of(turn: Turn) -> str:
    return turn.constraints[0].content


def _session(obj: Any, where: str) -> Session:
    if not isinstance(obj, dict) or not isinstance(obj.get("id"), int) or not isinstance(obj.get("turns"), list):
        raise SysbenchError(f"{where}: expected an object with an integer 'id' and a 'turns' list")
    turns = []
    for index, turn in enumerate(obj["turns"], start=1):
        if not isinstance(turn, dict) or not isinstance(turn.get("user"), str) or not turn.get("keyword"):
            raise SysbenchError(f"{where}, turn {index}: expected 'user' and 'keyword' strings")
        keyword = Constraint(id=1, content=str(turn["keyword"]), type="keyword", type_raw="keyword")
        turns.append(Turn(index, turn["user"], None, NO_ALIGNMENT, (keyword,)))
    return Session(
        system_id=obj["id"],
        system_prompt=str(obj.get("system", "")),
        turns=tuple(turns),
        dependent=True,
        domain=obj.get("topic"),
        scene=None,
        benchmark=NAME,
    )


def _session_json(session: Session) -> dict[str, Any]:
    return {
        "id": session.system_id,
        "topic": session.domain,
        "system": session.system_prompt,
        "turns": [{"user": turn.user, "keyword": keyword_of(turn)} for turn in session.turns],
    }


# ---------------------------------------------------------------- judging


def rule_record(session: Session, turn: int, response: str) -> JudgmentRecord:
    """Score 10 when the reply names the turn's keyword (any case), else 0; no judge asked."""
    keyword = keyword_of(session.turn(turn))
    found = keyword.lower() in response.lower()
    return JudgmentRecord(
        system_id=session.system_id,
        turn=turn,
        verdicts={},
        parse_status="ok",
        reasoning=f"the reply {'names' if found else 'does not name'} {keyword!r}",
        attempts=0,
        extra={"keyword": keyword},
        score=PASS if found else FAIL,
        scorer=SCORER,
    )


# ---------------------------------------------------------------- metrics


def _mean(values: Sequence[float]) -> float | None:
    return round(float(np.mean(values)), 4) if values else None


def toy_metrics(
    run: LoadedRun,
    *,
    allow_partial: bool = False,
    exclude_unparsed: bool = False,
    exclude_skipped: bool = False,
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Mean score over turns (95% CI: sessions resampled), the share of turns passed, by turn and by session."""
    usable, kept, counts = split_turns(
        run.sessions,
        run.judgments,
        run.expected,
        allow_partial,
        exclude_unparsed,
        exclude_skipped,
        run.unfinished_stages,
    )
    scored = [[(key[1], float(usable[key].score)) for key in all_turns(s) if key in usable] for s in kept]
    if not any(scored):
        raise SysbenchError("no scored turns")
    sums = np.array([sum(score for _, score in turns) for turns in scored])
    sizes = np.array([len(turns) for turns in scored])
    index = bootstrap_index(len(kept), resamples, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        resampled = sums[index].sum(axis=1) / sizes[index].sum(axis=1)
    scores = [score for turns in scored for _, score in turns]
    by_turn: dict[str, list[float]] = {}
    for turns in scored:
        for turn, score in turns:
            by_turn.setdefault(str(turn), []).append(score)
    return {
        "benchmark": NAME,
        "label": run.label,
        "model": run.model,
        "n_sessions": len(kept),
        "n_turns": len(scores),
        "mean_score": _mean(scores),
        "mean_score_ci": percentile_ci(resampled),
        "pass_rate": round(sum(score == PASS for score in scores) / len(scores), 4),
        "by_turn": {turn: _mean(values) for turn, values in sorted(by_turn.items(), key=lambda item: int(item[0]))},
        "by_session": {
            str(s.system_id): _mean([score for _, score in turns]) for s, turns in zip(kept, scored, strict=True)
        },
        "scorers": sorted({usable[key].scorer or "" for key in usable}),
        "partial": bool(counts["missing"] or counts["ungenerated"] or run.unfinished_stages),
        "n_missing_turns": counts["missing"],
        "n_skipped_turns": counts["skipped"],
        "n_unparsed_turns": counts["unparsed"],
    }


# ---------------------------------------------------------------- the benchmark


@register_benchmark
class ToyKeywords(Benchmark):
    """Keyword replies scored by a rule: the smallest benchmark every stage runs."""

    name: ClassVar[str] = NAME
    title: ClassVar[str] = "Toy keywords"
    history_modes: ClassVar[tuple[str, ...]] = ("model",)
    rule_scored: ClassVar[bool] = True
    scorers: ClassVar[tuple[str, ...]] = (SCORER,)

    # -- data ------------------------------------------------------------------
    def claims(self, text: str) -> bool:
        first = text.lstrip("\ufeff \t\r\n").split("\n", 1)[0]
        try:
            head = json.loads(first)
        except (json.JSONDecodeError, RecursionError):
            return False
        return isinstance(head, dict) and HEADER_KEY in head

    def parse(
        self, text: str, source: Path, *, system_message: str | None = None, task: str | None = None
    ) -> list[Session]:
        if system_message is not None or task is not None:
            raise SysbenchError(f"{source}: --system-message and --task do not apply to toy files")
        lines = [(number, line) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
        sessions = []
        for number, line in lines[1:]:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as error:
                raise SysbenchError(f"{source}:{number}: not JSON ({error.msg})") from None
            sessions.append(_session(obj, f"{source}:{number}"))
        if not sessions:
            raise SysbenchError(f"{source}: no sessions after the header line")
        return sessions

    def serialize(self, sessions: Sequence[Session]) -> bytes:
        lines = [{HEADER_KEY: 1}, *(_session_json(session) for session in sessions)]
        return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode("utf-8")

    def stats(self, dataset: Dataset) -> dict[str, Any]:
        topics: dict[str, int] = {}
        for session in dataset.sessions:
            topics[session.domain or "?"] = topics.get(session.domain or "?", 0) + 1
        return {
            "n_sessions": len(dataset.sessions),
            "n_turns": sum(len(s.turns) for s in dataset.sessions),
            "topics": dict(sorted(topics.items())),
            "sha256": dataset.sha256,
        }

    def format_stats(self, dataset: Dataset, stats: Mapping[str, Any]) -> str:
        topics = ", ".join(f"{topic} {count}" for topic, count in stats["topics"].items())
        return f"{dataset.path}: {stats['n_sessions']} toy sessions, {stats['n_turns']} turns; topics: {topics}"

    # -- generation ------------------------------------------------------------
    def messages(
        self, session: Session, turn: int, history: str, replies: Mapping[int, str], distractors: Sequence[Any] = ()
    ) -> list[ChatMessage]:
        return conversation_for_turn(session, turn, self.history_replies(session, turn, history, replies))

    def generation_manifest(self, sessions: Sequence[Session]) -> dict[str, Any]:
        return {"keywords": sorted({keyword_of(turn) for s in sessions for turn in s.turns})}

    # -- judging ---------------------------------------------------------------
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
        if settings is not None:
            raise SysbenchError(f"{run.path}: toy turns are scored by their keyword rule; judge with no judge options")
        pending = PendingTurns(judged, generations)
        skipped: list[JudgmentRecord] = []
        ruled: list[JudgmentRecord] = []
        for session in select_sessions(sessions, system_ids, limit, source="sessions.json of this run"):
            for turn, record in pending.generated(session, session.turns):
                if record.response is None or record.status != "ok":
                    skipped.append(skipped_record(record, None, None, SCORER))
                else:
                    ruled.append(rule_record(session, turn.index, record.response))
        return JudgePlan(
            tasks=[],
            skipped=skipped,
            already_judged=pending.already,
            not_generated=pending.not_generated,
            ruled=ruled,
            benchmark=NAME,
        )

    def describe_judge_templates(self, settings: Any) -> str:
        return "no templates: the keyword rule"

    # -- metrics and reports ---------------------------------------------------
    def run_metrics(self, loaded: LoadedRun, **options: Any) -> dict[str, Any]:
        return toy_metrics(loaded, **options)

    def format_metrics(self, result: Mapping[str, Any]) -> str:
        low, high = result["mean_score_ci"] or (float("nan"), float("nan"))
        turns = ", ".join(f"turn {turn} {score:.2f}" for turn, score in result["by_turn"].items())
        return "\n".join(
            [
                f"{result['label']} ({result['model']}): {result['n_sessions']} sessions, {result['n_turns']} turns",
                f"  mean score  {result['mean_score']:.2f} [{low:.2f}, {high:.2f}]",
                f"  pass rate   {100 * result['pass_rate']:.1f}%",
                f"  by turn     {turns}",
            ]
        )

    def compare(self, runs: Sequence[LoadedRun], **options: Any) -> dict[str, Any]:
        allow_partial = options.get("allow_partial", False)
        results = [
            toy_metrics(
                run, allow_partial=allow_partial, resamples=options.get("resamples", 1000), seed=options.get("seed", 0)
            )
            for run in runs
        ]
        base = results[0]
        return {
            "benchmark": NAME,
            "baseline": base["label"],
            "runs": [
                {
                    "label": r["label"],
                    "mean_score": r["mean_score"],
                    "delta": round(r["mean_score"] - base["mean_score"], 4),
                }
                for r in results[1:]
            ],
        }

    def format_comparison(self, result: Mapping[str, Any]) -> str:
        lines = [f"against {result['baseline']}:"]
        lines += [f"  {r['label']}: mean score {r['mean_score']:.2f} ({r['delta']:+.2f})" for r in result["runs"]]
        return "\n".join(lines)

    def report(self, request: ReportRequest) -> ReportResult:
        """report.md and report.json, one table (Markdown, LaTeX) and, with figures, one bar chart."""
        out = request.out
        out.mkdir(parents=True, exist_ok=True)
        results = []
        for path, label in zip(request.runs, request.labels, strict=True):
            metrics = toy_metrics(load_run(path), **request.metric_options)
            results.append({**metrics, "label": label or metrics["label"]})
        table = Table(
            name="toy_scores",
            title="Toy keywords",
            caption="Mean keyword score (0-10) and share of turns passed.",
            groups=[("", ["Mean score", "Passed (%)"])],
            first_header="Run",
            decimals=2,
            rows=[(r["label"], [r["mean_score"], 100 * r["pass_rate"]]) for r in results],
        )
        tables = [out / "tables" / f"{table.name}.md", out / "tables" / f"{table.name}.tex"]
        write_bytes_atomic(tables[0], render_markdown(table).encode("utf-8"))
        write_bytes_atomic(tables[1], render_latex(table).encode("utf-8"))
        figures: list[Path] = []
        if request.figures:
            import matplotlib

            matplotlib.use("Agg", force=True)
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(4, 3))
            ax.bar([r["label"] for r in results], [r["mean_score"] for r in results])
            ax.set_ylim(0, PASS)
            ax.set_ylabel("mean keyword score")
            for fmt in request.formats:
                figures.append(out / "figures" / f"toy_scores.{fmt}")
                figures[-1].parent.mkdir(parents=True, exist_ok=True)
                fig.savefig(figures[-1], metadata={"CreationDate": None} if fmt == "pdf" else None)
            plt.close(fig)
        write_bytes_atomic(out / "report.md", f"# {self.title}\n\n{render_markdown(table)}".encode())
        write_json_atomic(out / "report.json", {"benchmark": NAME, "runs": results})
        return ReportResult(out_dir=out, tables=tables, figures=figures)

    # -- explorer --------------------------------------------------------------
    def turn_view(self, session: Session, turn: int, judgment: JudgmentRecord | None) -> TurnView:
        context = (("Keyword", keyword_of(session.turn(turn))),)
        if judgment is None or judgment.score is None or judgment.parse_status in ("skipped", "unparsed"):
            return TurnView(judged=False, scale=PASS, context=context)
        return TurnView(
            judged=True,
            score=judgment.score,
            scale=PASS,
            note=judgment.reasoning,
            note_title="Keyword rule",
            scorer=f"rule {judgment.scorer}",
            context=context,
        )

    def session_facets(self, session: Session) -> dict[str, Any]:
        return {"topic": session.domain, "keywords": ", ".join(keyword_of(turn) for turn in session.turns)}

    def explore_layout(self, metrics: Mapping[str, Any] | None) -> ExploreLayout:
        metrics = metrics or {}
        return ExploreLayout(
            outcome="score",
            scale=PASS,
            facets=({"key": "topic", "label": "Topic", "filter": True}, {"key": "keywords", "label": "Keywords"}),
            cells=(
                {"label": "Sessions", "value": metrics.get("n_sessions"), "kind": "count"},
                {
                    "label": "Mean score",
                    "value": metrics.get("mean_score"),
                    "kind": "score",
                    "ci": metrics.get("mean_score_ci"),
                },
                {"label": "Passed", "value": metrics.get("pass_rate"), "kind": "percent"},
            ),
            caption="Keyword score 0 or 10 per turn; brackets: 95% bootstrap interval over sessions.",
        )
