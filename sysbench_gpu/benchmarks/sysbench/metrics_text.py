"""The text tables ``metrics`` and ``compare`` print for SysBench runs (percent, one decimal)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sysbench_gpu.benchmarks.sysbench.data import GROUP_ORDER, TYPE_ORDER

HEADLINE = ("csr", "csr_macro", "isr", "ssr")


def _pct(value: float | None) -> str:
    return "   -  " if value is None else f"{100 * value:6.1f}"


def _ci(pair: Sequence[float] | None) -> str:
    return "" if not pair else f"  [{100 * pair[0]:.1f}, {100 * pair[1]:.1f}]"


def format_metrics(result: Mapping[str, Any]) -> str:
    lines = [
        f"run {result['label']}  model {result['model']}",
        f"{result['n_sessions']} sessions, {result['n_turns']} turns, {result['n_constraints']} constraints"
        + (
            f"  (PARTIAL: {result['n_ungenerated_turns']} turns not generated, {result['n_missing_turns']} not judged"
            + (f", {' and '.join(result['unfinished_stages'])} still running" if result["unfinished_stages"] else "")
            + ")"
            if result["partial"]
            else ""
        )
        + (f"  ({result['n_unparsed_turns']} unparsed turns excluded)" if result["excluded_unparsed"] else "")
        + (f"  ({result['n_skipped_turns']} skipped turns excluded)" if result["n_skipped_turns"] else ""),
        "",
        f"{'metric':<22}{'%':>6}  95% CI (session bootstrap, {result['bootstrap']['resamples']} resamples)",
    ]
    for name in HEADLINE:
        lines.append(
            f"{name.upper() if name != 'csr_macro' else 'CSR (Eq. 1 macro)':<22}{_pct(result[name])}"
            f"{_ci(result['ci95'].get(name))}"
        )
    lines += ["", "CSR by constraint type"]
    for kind in TYPE_ORDER:
        lines.append(f"  {kind:<20}{_pct(result['csr_by_type'][kind])}   n={result['n_constraints_by_type'][kind]}")
    lines += ["", f"ISR by alignment      {'aligned':>9}{'misaligned':>11}{'all':>8}"]
    overall = {**result["isr_by_alignment"], "all": result["isr"]}
    for name, row in (*result["isr_by_group"].items(), ("overall", overall)):
        lines.append(f"  {name:<20}{_pct(row['aligned']):>9}{_pct(row['misaligned']):>11}{_pct(row['all']):>8}")
    rounds = result["rounds"]["all"] or []
    header = "".join(f"{'R' + str(n):>8}" for n in range(1, len(rounds) + 1))
    lines += ["", f"multi-turn stability {header}{'SSR':>8}"]
    for group in (*GROUP_ORDER, "all"):
        values = result["rounds"][group] or [None] * len(rounds)
        ssr = result["ssr"] if group == "all" else result["ssr_by_group"][group]
        lines.append(f"  {group:<19}" + "".join(f"{_pct(v):>8}" for v in values) + f"{_pct(ssr):>8}")
    lines.append(f"  {'ISR by turn':<19}" + "".join(f"{_pct(v):>8}" for v in result["isr_by_round"]))
    counts = result["verdict_counts"]
    lines += [
        "",
        f"verdicts: yes {counts['yes']}, no {counts['no']}, other {counts['other']}"
        f" (not applicable etc.: neither satisfy nor fail), missing {result['n_missing_verdicts']}",
    ]
    return "\n".join(lines)


def format_comparison(result: Mapping[str, Any]) -> str:
    a, b = result["run_a"], result["run_b"]
    lines = [
        f"A = {a['label']} ({a['path']})",
        f"B = {b['label']} ({b['path']})",
        f"{result['n_sessions']} sessions, {result['n_turns']} turns; paired session bootstrap, "
        f"{result['bootstrap']['resamples']} resamples, seed {result['bootstrap']['seed']}",
        "",
        f"{'metric':<30}{'A %':>7}{'B %':>7}{'B-A pts':>9}  95% CI",
    ]
    for name, row in result["metrics"].items():
        diff = "     - " if row["diff"] is None else f"{100 * row['diff']:+7.1f}"
        lines.append(f"{name:<30}{_pct(row['a']):>7}{_pct(row['b']):>7}{diff:>9}{_ci(row['ci95'])}")
    return "\n".join(lines)
