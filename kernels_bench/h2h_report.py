"""The head to head's report: the checks, the publishing rule, the JSON and the printed table."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import h2h_settings
from h2h_sessions import distinct_sessions
from h2h_setup import DEFAULT_THREADS, TIMED, MethodResult, Setup

SESSIONS_PER_THREAD = 10  # the publishing rule: N >= 10 x K


def predicted_ratio(profile: dict[str, Any], threads: int, device_spec: str | None = None) -> dict[str, Any]:
    """From ``profile.json``: the bound of K client threads over the turn-synchronous bound."""
    by_name = {what_if["name"]: what_if for what_if in profile.get("what_if", [])}
    turn_sync = by_name.get("turn-synchronous", {}).get("bound_s")
    threaded = by_name.get(f"{threads} client threads", {}).get("bound_s")
    return {
        "device_spec": device_spec or "profile's default",
        "turn_synchronous_bound_s": turn_sync,
        "client_threads_bound_s": threaded,
        "predicted_ratio": round(threaded / turn_sync, 3) if turn_sync and threaded else None,
    }


def token_problems(setup: Setup, results: Sequence[MethodResult]) -> list[str]:
    """Each way that did not decode N x T turns and N x T x M output tokens, in one line."""
    expected_turns = len(setup.sessions) * setup.turns
    expected_tokens = expected_turns * setup.max_tokens
    return [
        f"{r.name}: {r.turns} turns and {r.output_tokens} output tokens, expected {expected_turns} and "
        f"{expected_tokens}"
        for r in results
        if r.turns != expected_turns or r.output_tokens != expected_tokens
    ]


def publish_warning(sessions: int, threads: int) -> str | None:
    """The one-line warning below the publishing rule (N >= 10 x K), or None."""
    if sessions >= SESSIONS_PER_THREAD * threads:
        return None
    return (
        f"warning: {sessions} sessions on {threads} threads (fewer than {SESSIONS_PER_THREAD} x {threads}): the "
        "threads' last wave runs half empty; do not publish this ratio"
    )


def summarize(setup: Setup, results: Sequence[MethodResult], prediction: dict[str, Any] | None) -> dict[str, Any]:
    """The JSON report; ``checks`` says whether every way decoded the same turns and tokens with the same settings."""
    by_name = {r.name: r for r in results}
    upstream = by_name.get("upstream")
    rows = [r.row(upstream.wall_s if upstream else None) for r in results]
    problems = token_problems(setup, results)
    differing: dict[str, float | None] = {}
    if upstream is not None:
        for r in results:
            if r is upstream:
                continue
            keys = set(upstream.replies) & set(r.replies)
            same = sum(upstream.replies[k] == r.replies[k] for k in keys)
            differing[r.name] = round(1 - same / len(keys), 3) if keys else None
    settings_differ = h2h_settings.differing({r.name: r.engine_settings for r in results if r.engine_settings})
    in_process = by_name.get("in_process")
    measured = round(upstream.wall_s / in_process.wall_s, 3) if upstream and in_process and in_process.wall_s else None
    predicted = (prediction or {}).get("predicted_ratio")
    sessions = len(setup.sessions)
    warning = publish_warning(sessions, setup.threads)
    return {
        "engine": setup.engine,
        "model": setup.model,
        "sessions": sessions,
        "distinct_sessions": distinct_sessions(setup.sessions),
        "turns": setup.turns,
        "max_tokens": setup.max_tokens,
        "threads": setup.threads,
        "sessions_per_thread": round(sessions / setup.threads, 2),
        "publishable": warning is None and setup.threads == DEFAULT_THREADS,
        "publish_rule": f"N >= {SESSIONS_PER_THREAD} x threads, threads = {DEFAULT_THREADS} (upstream's K)",
        "server_concurrency": setup.server_concurrency,
        "tensor_parallel_size": setup.tensor_parallel_size,
        "settings": setup.budget.describe() if setup.budget else None,
        "data": setup.data,
        "timed": TIMED,
        "methods": rows,
        "checks": {
            "same_turns_and_tokens": not problems,
            "problems": problems,
            "same_engine_settings": not settings_differ,
            "engine_settings_differ": settings_differ,
        },
        "warnings": [warning] if warning else [],
        "replies_differing_from_upstream": differing,
        "measured_ratio": measured,
        "profile_predicted_ratio": predicted,
        "profile_relative_error": round((predicted - measured) / measured, 3) if predicted and measured else None,
        "profile": prediction,
        "load_average": round(os.getloadavg()[0], 2),
    }


def print_report(report: dict[str, Any]) -> None:
    print(
        f"\nengine {report['engine']}, model {report['model']}: {report['sessions']} sessions "
        f"({report['distinct_sessions']} distinct) x {report['turns']} turns x {report['max_tokens']} tokens, "
        f"{report['threads']} upstream threads; timed from first request to last reply"
    )
    settings = report.get("settings") or {}
    if settings:
        print(
            f"settings given to every way: max_num_batched_tokens {settings['max_num_batched_tokens']}, "
            f"max_num_seqs {settings['max_num_seqs']}, kv_cache_memory_bytes {settings['kv_cache_memory_bytes']}, "
            f"dtype {settings['dtype'] or 'auto'}"
        )
    print(f"{'method':<12}{'wall s':>9}{'turns':>7}{'out tokens':>11}{'tok/s':>9}{'x upstream':>11}{'cache hit':>10}")
    for row in report["methods"]:
        ratio = "-" if row["ratio_to_upstream"] is None else f"{row['ratio_to_upstream']:.2f}"
        hits = "-" if row["prefix_cache_hit_rate"] is None else f"{row['prefix_cache_hit_rate']:.0%}"
        print(
            f"{row['name']:<12}{row['wall_s']:>9.2f}{row['turns']:>7}{row['output_tokens']:>11}"
            f"{row['output_tok_s'] or 0:>9.1f}{ratio:>11}{hits:>10}"
        )
    checks = report["checks"]
    print(
        "same turns and output tokens: " + ("yes" if checks["same_turns_and_tokens"] else "; ".join(checks["problems"]))
    )
    if checks["same_engine_settings"]:
        print("same engine settings in every way: yes")
    else:
        for name, values in checks["engine_settings_differ"].items():
            print(f"engine settings differ: {name}: " + ", ".join(f"{way} {value}" for way, value in values.items()))
    for name, share in report["replies_differing_from_upstream"].items():
        if share is not None:
            print(f"replies of {name} differing from upstream's: {share:.0%}")
    if report["measured_ratio"] is not None:
        predicted = report["profile_predicted_ratio"]
        error = report["profile_relative_error"]
        print(
            f"upstream / in_process: measured {report['measured_ratio']:.2f}x, profile predicted "
            + ("-" if predicted is None else f"{predicted:.2f}x")
            + ("" if error is None else f" (error {error:+.0%})")
        )
    for warning in report["warnings"]:
        print(warning)
