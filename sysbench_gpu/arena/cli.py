"""The ``arena`` command line: flags to an :class:`~sysbench_gpu.arena.stage.ArenaRequest`, then the stage."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sysbench_gpu.arena.bt import INSTALL_HINT
from sysbench_gpu.arena.prompt import load_template
from sysbench_gpu.arena.stage import ArenaRequest, plan_dry_run, run_arena
from sysbench_gpu.core.arguments import check_finite, check_integer
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.plotting import parse_formats
from sysbench_gpu.core.progress import add_progress_flags
from sysbench_gpu.judging.cache import CACHE_DIRNAME
from sysbench_gpu.judging.cli import _engine_options, make_engine_factory
from sysbench_gpu.judging.rounds import DEFAULT_MAX_RETRIES, JudgeSettings
from sysbench_gpu.judging.stage import JUDGE_BACKENDS


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "arena",
        help="pairwise battles between runs of the same sessions: Bradley-Terry ratings with CIs",
        description=(
            "sysbench-gpu arena RUN RUN... --out ARENA_DIR [--baseline RUN] [--by verdicts]\n"
            "sysbench-gpu arena RUN RUN... --out ARENA_DIR --by judge --judge {openai,vllm,hf} --judge-model NAME"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run directories of one benchmark and the same sessions")
    parser.add_argument("--out", required=True, help="the arena directory (battles.jsonl, ratings.json, ...)")
    parser.add_argument("--mode", choices=("all-pairs",), default="all-pairs", help="every pair of runs (default)")
    parser.add_argument("--baseline", metavar="RUN", help="every other run against this one only; its rating is 1000")
    parser.add_argument("--by", choices=("verdicts", "judge"), default="verdicts", help="how a battle is decided")
    parser.add_argument("--resamples", type=int, default=1000, help="session resamples for the 95%% CIs")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (and the judge's sampling seed)")
    parser.add_argument(
        "--length-control", action="store_true", help="also fit with the reply-length difference as a covariate"
    )
    parser.add_argument("--no-figures", action="store_true", help="skip the figures (no matplotlib)")
    parser.add_argument("--formats", default="png", help="figure formats, comma-separated (png, pdf, svg)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars or progress lines")
    add_progress_flags(parser)
    parser.add_argument("--json", action="store_true", help="print ratings.json (or the dry run) as JSON")
    judge = parser.add_argument_group("judged battles (--by judge)")
    judge.add_argument("--judge", choices=JUDGE_BACKENDS, help="judge backend")
    judge.add_argument("--judge-model", help="judge model name (openai) or path/alias (vllm, hf)")
    judge.add_argument("--template", help="a pairwise template FILE with {system}, {conversation_a}, {conversation_b}")
    judge.add_argument("--base-url", help="OpenAI-compatible endpoint (default: $OPENAI_BASE_URL or OpenAI)")
    judge.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    judge.add_argument("--concurrency", type=int, default=8, help="parallel API requests (openai)")
    judge.add_argument("--timeout", type=float, default=60.0, help="seconds per API request (openai)")
    judge.add_argument("--api-retries", type=int, default=6, help="retries of one API request on 429/5xx/timeouts")
    judge.add_argument("--max-retries", type=int, default=DEFAULT_MAX_RETRIES, help="attempts per question")
    judge.add_argument("--max-tokens", type=int, default=256, help="judge reply token limit")
    judge.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE", help="vllm/hf option")
    judge.add_argument("--cache-dir", help=f"reply cache folder (default ARENA_DIR/{CACHE_DIRNAME})")
    judge.add_argument("--no-cache", action="store_true", help="bypass the reply cache")
    judge.add_argument("--dry-run", action="store_true", help="print questions, tokens and cost; send nothing")
    judge.add_argument(
        "--retry-unparsed",
        action="store_true",
        help="ask again the battles whose judge answer never parsed (old records move to battles.replaced.jsonl)",
    )
    judge.add_argument(
        "--replay-changed",
        action="store_true",
        help="ask again the battles whose runs' replies changed since they were judged (else they are refused)",
    )
    parser.set_defaults(func=main)


def _check_sklearn() -> None:
    try:
        import sklearn  # noqa: F401
    except ImportError:
        raise SysbenchError(INSTALL_HINT) from None


def main(args: argparse.Namespace) -> int:
    # --seed and --resamples are checked for every verb by the CLI (core.arguments); these are the arena's own.
    for value, flag, minimum in (
        (args.max_retries, "--max-retries", 1),
        (args.concurrency, "--concurrency", 1),
        (args.api_retries, "--api-retries", 0),
        (args.max_tokens, "--max-tokens", 1),
    ):
        check_integer(value, flag, minimum)
    check_finite(args.timeout, "--timeout", positive=True)
    if args.by == "judge" and not (args.judge and args.judge_model):
        raise SysbenchError("--by judge needs --judge {openai,vllm,hf} and --judge-model NAME")
    if args.by == "verdicts" and (args.judge or args.judge_model or args.template or args.dry_run):
        raise SysbenchError("--judge, --judge-model, --template and --dry-run apply to --by judge")
    if args.by == "verdicts" and (args.retry_unparsed or args.replay_changed):
        raise SysbenchError(
            "--retry-unparsed and --replay-changed apply to --by judge (verdict battles are replayed by themselves)"
        )
    out = Path(args.out)
    settings = template = None
    options = _engine_options(args.engine_option)
    if args.by == "judge":
        template = load_template(args.template)
        cache_dir = None if args.no_cache else Path(args.cache_dir) if args.cache_dir else out / CACHE_DIRNAME
        settings = JudgeSettings(
            backend=args.judge,
            model=args.judge_model,
            template=None,
            max_retries=args.max_retries,
            max_tokens=args.max_tokens,
            seed=args.seed,
            cache_dir=cache_dir,
            concurrency=args.concurrency,
        )
    request = ArenaRequest(
        runs=args.runs,
        out=out,
        by=args.by,
        baseline=args.baseline,
        resamples=args.resamples,
        seed=args.seed,
        length_control=args.length_control,
        formats=parse_formats(args.formats),
        figures=not args.no_figures,
        show_progress=not args.no_progress,
        log_every=args.log_every,
        judge=settings,
        template=template,
        retry_unparsed=args.retry_unparsed,
        replay_changed=args.replay_changed,
    )
    if args.dry_run:
        report = plan_dry_run(request)
        if args.json:
            print(json.dumps(report, ensure_ascii=False, indent=2))
        else:
            cost = report["estimated_cost_usd"]
            print(f"dry run: arena {out} with {report['judge']} {report['judge_model']}")
            print(f"  questions           {report['questions']} ({report['answered_from_cache']} from cache)")
            if report["retried_unparsed"] or report["replayed_changed"]:
                print(
                    f"  asked again         {report['retried_unparsed']} unparsed, "
                    f"{report['replayed_changed']} whose runs changed"
                )
            print(f"  requests            {report['requests']}  ({report['note']})")
            print(f"  est. prompt tokens  {report['estimated_prompt_tokens']}")
            print(f"  est. output tokens  {report['estimated_completion_tokens']}")
            print(f"  est. cost (USD)     {'unknown for this model' if cost is None else f'{cost:.4f}'}")
        return 0
    _check_sklearn()
    factory = make_engine_factory(args, settings, options) if settings is not None else None
    outcome = run_arena(request, factory)
    result = outcome["result"]
    if args.json:
        print(json.dumps(result, ensure_ascii=False, indent=2))
        return 0
    print(f"{out}: {outcome['played']} battle record(s) added; {result['fit']['battles']} battles rated")
    if outcome["replayed"]:
        print(f"  {outcome['replayed']} stored battle(s) played again: their runs changed since they were stored")
    if outcome["retried"]:
        print(f"  {outcome['retried']} unparsed battle record(s) asked again")
    for rank, row in enumerate(result["ratings"], 1):
        low, high = row["ci"] or (None, None)
        ci = f"[{low:.0f}, {high:.0f}]" if low is not None and high is not None else "-"
        lc = f"  LC {row['rating_length_controlled']:.0f}" if row.get("rating_length_controlled") is not None else ""
        rating = "unrated" if row["rating"] is None else f"{row['rating']:.1f}"
        why = f"  ({row['unrated']})" if row.get("unrated") else ""
        label = row.get("label", row["model"])
        print(f"  {rank:2d}. {label:<28} {rating:>7}  {ci:<14} battles {row['battles']}{lc}{why}")
    if result["fit"].get("warning"):
        print(f"  warning: {result['fit']['warning']}")
    failed = result["fit"].get("resamples_failed", 0)
    if failed:
        print(
            f"  note: {failed} of {result['fit']['resamples']} resamples had no finite fit (one side won every "
            "battle drawn) and are left out of the CIs"
        )
    if outcome["unparsed"]:
        print(
            f"  {outcome['unparsed']} judged battle record(s) never parsed and are not rated; "
            "rerun with --retry-unparsed to ask the judge again"
        )
    consistency = result.get("position_consistency")
    if consistency and consistency["rate"] is not None:
        print(
            f"  judge position consistency {100 * consistency['rate']:.1f}% "
            f"({consistency['agreed']} of {consistency['battles_parsed_in_both_orders']})"
        )
    return 0
