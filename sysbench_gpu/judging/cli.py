"""The ``judge`` command line: flags, then the checked call (``judging.job``), its dry run or its judging.

The judging itself is ``judging.stage.judge_run``; this module only turns arguments into
settings and an engine factory (``job_from_args``), and decides (from ``RANK`` under torchrun)
whether this process writes; the lock around a --rejudge set-up and judging is ``judging.job``'s.
With no judge options at all, an MT-Eval run's rule-scored turns (recollection) are scored and
anything that needs the LLM judge is refused in one line.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.registry import judge_options, load_run_sessions, one_benchmark, run_benchmark
from sysbench_gpu.core.arguments import check_out_folder, check_replica_flags
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.locks import is_primary_rank
from sysbench_gpu.core.progress import add_progress_flags
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.core.sessions import parse_session_ids, select_sessions
from sysbench_gpu.engines import get_engine
from sysbench_gpu.engines.hf import DEFAULT_MAX_TOKENS
from sysbench_gpu.judging.cache import CACHE_DIRNAME
from sysbench_gpu.judging.job import JudgeJob, estimate_judging, run_judge_job
from sysbench_gpu.judging.rounds import DEFAULT_MAX_RETRIES, JudgeSettings
from sysbench_gpu.judging.stage import JUDGE_BACKENDS


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "judge",
        help=(
            "judge generated turns (SysBench checklists; MT-Eval rules or 1-10 scores); "
            "`judge agreement A B` compares two runs"
        ),
        description=(
            "sysbench-gpu judge RUN_DIR --judge {openai,vllm,hf} --judge-model NAME [...]\n"
            "sysbench-gpu judge RUN_DIR   (an MT-Eval run of rule-scored tasks: no judge model needed)\n"
            "sysbench-gpu judge agreement RUN_A RUN_B [--json]"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", help="the run directory (or the word 'agreement')")
    parser.add_argument("more_runs", nargs="*", metavar="RUN", help="with 'agreement': the two runs to compare")
    parser.add_argument("--judge", choices=JUDGE_BACKENDS, help="judge backend")
    parser.add_argument("--judge-model", help="judge model name (openai) or path/alias (vllm, hf; e.g. smollm2)")
    parser.add_argument("--base-url", help="OpenAI-compatible endpoint (default: $OPENAI_BASE_URL or OpenAI)")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    parser.add_argument("--concurrency", type=int, default=8, help="parallel API requests (openai)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per API request (openai)")
    parser.add_argument("--api-retries", type=int, default=6, help="retries of one API request on 429/5xx/timeouts")
    parser.add_argument("--template", help="SysBench: zh (default), en, or a template FILE (see docs/judge.md)")
    parser.add_argument(
        "--mteval-template",
        action="append",
        default=[],
        metavar="KIND=FILE",
        help="MT-Eval: your own 1-10 judge template for refinement, expansion or follow-up (repeatable)",
    )
    parser.add_argument("--template-lang", choices=("zh", "en"), help="language of a template FILE (default zh)")
    parser.add_argument(
        "--max-retries", type=int, default=DEFAULT_MAX_RETRIES, help="attempts per turn until it is recorded unparsed"
    )
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="judge reply token limit")
    parser.add_argument(
        "--max-reasoning-chars",
        type=int,
        default=2000,
        help="vllm and hf: cap on the reasoning string under guided decoding",
    )
    parser.add_argument("--seed", type=int, help="sampling seed (where the backend honours one)")
    parser.add_argument(
        "--engine-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra engine constructor option for vllm/hf (VALUE read as JSON when it parses)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print requests, tokens and cost; send nothing")
    parser.add_argument("--no-cache", action="store_true", help="bypass the reply cache")
    parser.add_argument(
        "--retry-unparsed",
        action="store_true",
        help="ask the turns recorded unparsed again (old records move to judgments.retried.jsonl)",
    )
    parser.add_argument("--cache-dir", help=f"reply cache folder (default RUN_DIR/{CACHE_DIRNAME})")
    parser.add_argument(
        "--rejudge", action="store_true", help="copy RUN_DIR's sessions and generations to --out and judge there"
    )
    parser.add_argument("--out", help="with --rejudge: the new run directory")
    parser.add_argument("--limit", type=int, help="only the first N sessions")
    parser.add_argument("--sessions", help="only these system ids (comma-separated), before --limit")
    parser.add_argument("--json", action="store_true", help="machine-readable output (agreement, dry run)")
    add_progress_flags(parser)
    for option, (choices, text) in judge_options().items():
        parser.add_argument("--" + option.replace("_", "-"), dest=option, choices=choices, help=text)
    parser.set_defaults(func=main)


def _engine_options(pairs: Sequence[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise SysbenchError(f"--engine-option {pair!r}: expected KEY=VALUE")
        key, value = pair.split("=", 1)
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value
        except RecursionError:
            raise SysbenchError(f"--engine-option {key.strip()}: value nested too deeply") from None
    return options


def make_engine_factory(
    args: argparse.Namespace, settings: JudgeSettings, options: dict[str, Any]
) -> Callable[[], Any]:
    """Builds the judge's engine when called (only when there is work); ``options``: parsed --engine-option."""
    if settings.backend == "openai":
        if options:
            raise SysbenchError("--engine-option applies to vllm and hf judges")
        return lambda: get_engine(
            "openai",
            model=settings.model,
            base_url=args.base_url,
            api_key_env=args.api_key_env,
            concurrency=args.concurrency,
            max_retries=args.api_retries,
            timeout=args.timeout,
            secrets=getattr(args, "secrets", None),
        )
    if args.seed is not None:
        options.setdefault("seed", args.seed)
    # A local judge's replicas (data_parallel_size, ray_address) run on Ray: checked now, before any model loads.
    check_replica_flags(
        options.get("data_parallel_size"),
        options.get("ray_address"),
        size_flag="--engine-option data_parallel_size",
        address_flag="--engine-option ray_address",
    )
    return lambda: get_engine(settings.backend, model=settings.model, **options)


def main(args: argparse.Namespace) -> int:
    if args.run_dir == "agreement":
        if len(args.more_runs) != 2:
            raise SysbenchError("usage: sysbench-gpu judge agreement RUN_A RUN_B [--json]")
        paths = [Path(path) for path in args.more_runs]
        benchmark = one_benchmark([(str(path), run_benchmark(path)) for path in paths], "judge agreement")
        report = benchmark.judge_agreement(paths[0], paths[1])
        print(json.dumps(report, ensure_ascii=False, indent=2) if args.json else benchmark.format_agreement(report))
        return 0
    job = job_from_args(args)
    if args.dry_run:
        _print_dry_run(job, estimate_judging(job), args.json)
        return 0
    summary = run_judge_job(job, progress=not args.no_progress, log_every=args.log_every)
    if job.primary:
        ruled = f"scored by rule {summary.scored_by_rule}; " if summary.scored_by_rule else ""
        print(
            f"{job.run.path}: judged {summary.judged}, unparsed {summary.unparsed}, skipped {summary.skipped}, "
            f"already judged {summary.already_judged}, not generated {summary.not_generated}; "
            f"{ruled}requests {summary.requests}, cache hits {summary.cache_hits}"
        )
    return 0


def job_from_args(args: argparse.Namespace) -> JudgeJob:
    """The judge call the flags ask for, checked against the run and its benchmark; nothing written or built.

    The verb, ``judging.api.judge`` and a plan's step (``plans.status``) all start here.
    """
    if args.more_runs:
        raise SysbenchError(f"judge takes one RUN_DIR, got extra {' '.join(args.more_runs)!r}")
    if bool(args.judge) != bool(args.judge_model):
        raise SysbenchError(
            "judge needs both --judge {openai,vllm,hf} and --judge-model NAME (or neither, "
            "for an MT-Eval run of rule-scored tasks)"
        )
    if args.max_retries < 1:
        raise SysbenchError(f"--max-retries must be at least 1, got {args.max_retries}")
    if args.limit is not None and args.limit < 1:
        raise SysbenchError(f"--limit must be at least 1, got {args.limit}")
    if args.concurrency < 1:
        raise SysbenchError(f"--concurrency must be at least 1, got {args.concurrency}")
    system_ids = parse_session_ids(args.sessions)
    options = _engine_options(args.engine_option)
    source = RunDir(args.run_dir)
    benchmark_options = {option: getattr(args, option, None) for option in judge_options()}
    benchmark = run_benchmark(source).configured(benchmark_options)
    flag_error = benchmark.judge_flag_error(
        template=bool(args.template or args.template_lang), score_templates=bool(args.mteval_template)
    )
    if flag_error:
        raise SysbenchError(flag_error)
    template = benchmark.judge_template(args.template, args.template_lang)
    if args.rejudge:
        if not args.out:
            raise SysbenchError("--rejudge needs --out NEW_RUN_DIR")
        source.require()
        # The copy is a new run: never the source itself nor a folder inside it.
        check_out_folder(args.out, inputs=[source.path])
        # A bad selection is refused before --out is even created.
        select_sessions(load_run_sessions(source), system_ids, args.limit, source=source.sessions_path)
        run = source if args.dry_run else RunDir(args.out)
    else:
        if args.out:
            raise SysbenchError("--out applies only with --rejudge")
        run = source.require()
    home = Path(args.out) if args.rejudge else run.path
    cache_dir = None if args.no_cache else Path(args.cache_dir) if args.cache_dir else home / CACHE_DIRNAME
    settings: JudgeSettings | None = None
    if args.judge:
        settings = JudgeSettings(
            backend=args.judge,
            model=args.judge_model,
            template=template,
            max_retries=args.max_retries,
            max_tokens=args.max_tokens,
            seed=args.seed,
            max_reasoning_chars=args.max_reasoning_chars,
            cache_dir=cache_dir,
            concurrency=args.concurrency,
            score_templates=benchmark.judge_templates(args.mteval_template),
        )
    return JudgeJob(
        source=source,
        run=run,
        settings=settings,
        engine_factory=make_engine_factory(args, settings, options) if settings is not None else None,
        benchmark=benchmark,
        benchmark_options=benchmark_options,
        system_ids=system_ids,
        limit=args.limit,
        rejudge=args.rejudge,
        retry_unparsed=args.retry_unparsed,
        primary=is_primary_rank(options),
    )


def _print_dry_run(job: JudgeJob, report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(report, ensure_ascii=False, indent=2))
        return
    settings = job.settings
    cost = report["estimated_cost_usd"]
    shown = job.benchmark.describe_judge_templates(settings)
    judge = f"{settings.backend} {settings.model} ({shown})" if settings is not None else "no judge model"
    print(f"dry run: {report['run']} with {judge}")
    print(f"  turns to judge      {report['turns_to_judge']} ({report['answered_from_cache']} from cache)")
    if job.benchmark.rule_scored:
        print(f"  scored by rule      {report['turns_scored_by_rule']}")
    print(f"  requests            {report['requests']}  ({report['note']})")
    print(f"  est. prompt tokens  {report['estimated_prompt_tokens']}")
    print(f"  est. output tokens  {report['estimated_completion_tokens']}")
    print(f"  est. cost (USD)     {'unknown for this model' if cost is None else f'{cost:.4f}'}")
    print(
        f"  skipped (no reply)  {report['turns_skipped_no_response']}; already judged "
        f"{report['turns_already_judged']}; "
        f"not generated {report['turns_not_generated']}"
    )
