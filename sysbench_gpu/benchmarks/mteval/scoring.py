"""The judge stage on an MT-Eval run: which turns the 1-10 judge scores, and the rule-scored records.

Every answered turn of the run's dialogues that has a generation record ends with one
``judgments.jsonl`` record carrying a typed ``score`` (0..10) and its ``scorer``:

- refinement, expansion, follow-up (and the irrelevant-context ablation): a
  :class:`~sysbench_gpu.benchmarks.judge_tasks.JudgeTask` with the 1-10 prompt, from the authors'
  files (``--judge-prompts official``, ``official_prompts``) or ours (``judge_prompt``); the judge
  stage asks it with the same retries, cache, ledger and unparsed handling as a SysBench
  checklist (``judging.stage.judge_run``);
- recollection cls (and the cls ablations): ``rules.score_cls``, 10 or 0, no judge;
- recollection global-inst: ``rules.check_instruction``, 10 or 0, no judge.

A turn without a response is recorded ``skipped``. Context turns are never scored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sysbench_gpu.benchmarks.judge_tasks import (
    JudgePlan,
    JudgeTask,
    PendingTurns,
    skipped_record,
)
from sysbench_gpu.benchmarks.mteval.data import answered_turns
from sysbench_gpu.benchmarks.mteval.judge_prompt import (
    KINDS,
    ScoreReply,
    ScoreTemplate,
    judge_kind,
    load_score_template,
    render_score_prompt,
)
from sysbench_gpu.benchmarks.mteval.official_prompts import official_kind, render_official_prompt
from sysbench_gpu.benchmarks.mteval.rules import rule_score
from sysbench_gpu.benchmarks.mteval.sentences import DEFAULT_RULES
from sysbench_gpu.benchmarks.mteval.tasks import BENCHMARK, TASKS
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.records import GenerationRecord, JudgmentRecord
from sysbench_gpu.core.sessions import Session, select_sessions

Key = tuple[int, int]


def builtin_score_templates() -> dict[str, ScoreTemplate]:
    """The three built-in 1-10 judge templates, by kind."""
    return {kind: load_score_template(kind) for kind in KINDS}


def parse_template_options(pairs: Sequence[str]) -> dict[str, str]:
    """``--mteval-template KIND=FILE`` values -> {kind: file}; an unknown kind is one clear line."""
    files: dict[str, str] = {}
    for pair in pairs:
        kind, sep, path = pair.partition("=")
        kind = kind.strip()
        if not sep or not path.strip():
            raise SysbenchError(f"--mteval-template {pair!r}: expected KIND=FILE (KIND one of {', '.join(KINDS)})")
        if kind not in KINDS:
            raise SysbenchError(f"--mteval-template {pair!r}: unknown kind {kind!r} (one of {', '.join(KINDS)})")
        files[kind] = path.strip()
    return files


PROMPT_SETS: tuple[str, ...] = ("official", "ours")


def template_kind(session: Session, prompts: str) -> str:
    """The key of the template that scores this dialogue's turns in the prompt set ``prompts``."""
    return official_kind(session) if prompts == "official" else judge_kind(session)


def render_prompt(template: ScoreTemplate, session: Session, turn_index: int, response: str, prompts: str) -> str:
    if prompts == "official":
        return render_official_prompt(template, session, turn_index, response)
    return render_score_prompt(template, session, turn_index, response)


def plan_mteval(
    sessions: Sequence[Session],
    generations: Mapping[Key, GenerationRecord],
    judged: set[Key],
    templates: Mapping[str, ScoreTemplate] | None,
    limit: int | None = None,
    judge_model: str | None = None,
    system_ids: Sequence[int] | None = None,
    *,
    rules: str = DEFAULT_RULES,
    prompts: str = "official",
) -> JudgePlan:
    """Judge tasks and rule-scored records for the answered turns of the first ``limit`` dialogues.

    ``templates`` None: no judge was named; judge-scored turns become tasks without a prompt, only to be counted.
    """
    chosen = select_sessions(sessions, system_ids, limit, source="sessions.json of this run")
    tasks: list[JudgeTask] = []
    skipped: list[JudgmentRecord] = []
    ruled: list[JudgmentRecord] = []
    pending = PendingTurns(judged, generations)
    for session in chosen:
        info = TASKS.get(session.task or "")
        if info is None:
            raise SysbenchError(f"session {session.system_id}: unknown MT-Eval task {session.task!r}")
        judged_here = info.scorer == "judge"
        kind = template_kind(session, prompts) if judged_here else None
        template = templates[kind] if templates is not None and kind is not None else None
        for turn, record in pending.generated(session, answered_turns(session)):
            if record.response is None or record.status != "ok":
                model = judge_model if template is not None else None
                skipped.append(skipped_record(record, model, template.sha256 if template else None, info.scorer))
            elif judged_here:
                prompt = render_prompt(template, session, turn.index, record.response, prompts) if template else ""
                sha = template.sha256 if template else None
                tasks.append(JudgeTask(session.system_id, turn.index, prompt, (), sha, kind, reply=ScoreReply()))
            else:
                ruled.append(rule_record(session, turn.index, record.response, rules))
    asked = {task.system_id for task in tasks}
    needing = tuple(sorted({s.task for s in chosen if s.task and s.system_id in asked}))
    return JudgePlan(
        tasks=tasks,
        skipped=skipped,
        already_judged=pending.already,
        not_generated=pending.not_generated,
        ruled=ruled,
        benchmark=BENCHMARK,
        judge_tasks=needing,
        # The prompt set is named only where a judge is asked; the rule set always applies.
        options={"rules": rules, **({"judge_prompts": prompts} if templates is not None else {})},
    )


def rule_record(session: Session, turn_index: int, response: str, rules: str = DEFAULT_RULES) -> JudgmentRecord:
    """The record of a rule-scored turn: score 10 or 0, what was checked as the reasoning, the rule set used."""
    verdict = rule_score(session, turn_index, response, rules)
    info = TASKS[session.task or ""]
    return JudgmentRecord(
        system_id=session.system_id,
        turn=turn_index,
        verdicts={},
        parse_status="ok",
        reasoning=verdict.detail,
        attempts=0,
        extra={"rule": verdict.rule, "rules": rules},
        score=float(verdict.score),
        scorer=info.scorer,
    )
