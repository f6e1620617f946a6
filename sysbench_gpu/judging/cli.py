"""The ``judge`` command line: flags, the dry run, the lock around a --rejudge set-up and judging.

The judging itself is ``judging.stage.judge_run``; this module only turns arguments into
settings and an engine factory, and decides (from ``RANK`` under torchrun) whether
this process writes. With no judge options at all, an MT-Eval run's rule-scored turns
(recollection) are scored and anything that needs the LLM judge is refused in one line.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.registry import judge_options, load_run_sessions, one_benchmark, run_benchmark
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.locks import is_primary_rank, stage_lock
from sysbench_gpu.core.rundir import MANIFEST, RunDir
from sysbench_gpu.core.sessions import parse_session_ids, select_sessions
from sysbench_gpu.engines import get_engine
from sysbench_gpu.engines.hf import DEFAULT_MAX_TOKENS
from sysbench_gpu.judging.cache import CACHE_DIRNAME
from sysbench_gpu.judging.rejudge import prepare_rejudge
from sysbench_gpu.judging.rounds import DEFAULT_MAX_RETRIES, JudgeSettings
from sysbench_gpu.judging.stage import JUDGE_BACKENDS, STAGE, dry_run_report, judge_run

REJUDGE_WAIT_S = 600.0  # how long a non-primary rank waits for the primary to copy a --rejudge run


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
    primary = is_primary_rank(options)
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
    if args.dry_run:
        report = dry_run_report(
            run, settings, args.limit, fresh=args.rejudge, system_ids=system_ids, options=benchmark_options
        )
        if args.json:
            print(json.dumps(report, ensure_ascii=False, indent=2))
        else:
            cost = report["estimated_cost_usd"]
            shown = benchmark.describe_judge_templates(settings)
            judge = f"{settings.backend} {settings.model} ({shown})" if settings is not None else "no judge model"
            print(f"dry run: {run.path} with {judge}")
            print(f"  turns to judge      {report['turns_to_judge']} ({report['answered_from_cache']} from cache)")
            if benchmark.rule_scored:
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
        return 0
    # One writer: the lock covers a --rejudge set-up and the judging that follows it.
    with stage_lock(run.path, STAGE, enabled=primary):
        if args.rejudge:
            if primary:
                prepare_rejudge(source, run.path, args.limit, system_ids)
            else:
                _wait_for_rejudge_copy(run)
        # A rejudge copy holds only the chosen sessions.
        limit = None if args.rejudge else args.limit
        chosen_ids = None if args.rejudge else system_ids
        summary = judge_run(
            run,
            settings,
            make_engine_factory(args, settings, options) if settings is not None else None,
            limit=limit,
            system_ids=chosen_ids,
            retry_unparsed=args.retry_unparsed,
            primary=primary,
            lock=False,
            options=benchmark_options,
        )
    if primary:
        ruled = f"scored by rule {summary.scored_by_rule}; " if summary.scored_by_rule else ""
        print(
            f"{run.path}: judged {summary.judged}, unparsed {summary.unparsed}, skipped {summary.skipped}, "
            f"already judged {summary.already_judged}, not generated {summary.not_generated}; "
            f"{ruled}requests {summary.requests}, cache hits {summary.cache_hits}"
        )
    return 0


def _wait_for_rejudge_copy(run: RunDir, timeout_s: float = REJUDGE_WAIT_S) -> None:
    """A non-primary rank reads the --rejudge copy only once the primary has finished making it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (run.path / MANIFEST).is_file():
            rejudged = run.read_manifest().get("rejudged_from")
            if isinstance(rejudged, dict) and rejudged.get("setup", "complete") == "complete":
                return
        time.sleep(0.2)
    raise SysbenchError(f"{run.path}: the primary rank did not finish the --rejudge copy within {timeout_s:.0f} s")
