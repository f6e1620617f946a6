"""Agreement between the verdicts of two runs on the same responses.

``sysbench-gpu judge agreement RUN_A RUN_B`` answers "how far can I trust judge B
where judge A is the reference" (e.g. a local judge against upstream's GPT-4o
verdicts imported with ``import-upstream``). The two runs must hold the same
responses for every turn both have judged; otherwise the comparison is
meaningless and the command stops, naming the turns that differ.

Reported:

- per constraint: raw agreement over the three values yes / no / other, and
  Cohen's kappa of "yes" against "not yes" (only "yes" satisfies a constraint),
  overall and per constraint type;
- per turn: agreement and kappa of pass/fail (a turn fails when a verdict is no);
- the effect on CSR / ISR / SSR: both runs restricted to the sessions for whose
  every turn both have usable verdicts, scored by ``benchmarks.runs.run_metrics``.

Turns that either run could not judge (``unparsed``, ``skipped``) are counted and
left out of the verdict comparison. A verdict a record lacks for a checklist item
counts as ``other`` (not satisfied, not failing), as metrics treat it.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.registry import load_run_sessions
from sysbench_gpu.benchmarks.runs import run_metrics, same_replies_judged
from sysbench_gpu.benchmarks.sysbench.data import TYPE_ORDER
from sysbench_gpu.benchmarks.sysbench.schema import session_to_upstream
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.records import JudgmentRecord
from sysbench_gpu.core.rundir import MANIFEST, RunDir, write_json_atomic
from sysbench_gpu.core.sessions import Session

USABLE_STATUSES = ("ok", "imported")
VALUES = ("yes", "no", "other")


def cohens_kappa(pairs: Sequence[tuple[bool, bool]]) -> float | None:
    """Cohen's kappa of two binary raters; None when undefined (no items, or chance agreement is 1)."""
    n = len(pairs)
    if n == 0:
        return None
    observed = sum(a == b for a, b in pairs) / n
    p_a = sum(a for a, _ in pairs) / n
    p_b = sum(b for _, b in pairs) / n
    expected = p_a * p_b + (1 - p_a) * (1 - p_b)
    if expected >= 1.0:
        return None
    return (observed - expected) / (1 - expected)


def _rate(hits: int, total: int) -> float | None:
    return hits / total if total else None


def _binary_block(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    yes_pairs = [(a == "yes", b == "yes") for a, b in pairs]
    confusion = Counter(f"{a}/{b}" for a, b in pairs)
    return {
        "n": len(pairs),
        "raw_agreement": _rate(sum(a == b for a, b in pairs), len(pairs)),
        "yes_agreement": _rate(sum(a == b for a, b in yes_pairs), len(pairs)),
        "kappa_yes": cohens_kappa(yes_pairs),
        "confusion": {f"{a}/{b}": confusion.get(f"{a}/{b}", 0) for a in VALUES for b in VALUES},
    }


def _load(path: Path) -> tuple[RunDir, dict[int, Session], dict, dict]:
    run = RunDir(path).require()
    sessions = {s.system_id: s for s in load_run_sessions(run)}
    return run, sessions, run.generations.read(), run.judgments.read()


def compare_runs(path_a: str | Path, path_b: str | Path) -> dict[str, Any]:
    run_a, sessions_a, gens_a, judg_a = _load(Path(path_a))
    run_b, sessions_b, gens_b, judg_b = _load(Path(path_b))
    common = same_replies_judged((run_a, run_b), (gens_a, gens_b), (judg_a, judg_b))
    for system_id, turn in common:
        ids_a = [c.id for c in sessions_a[system_id].turn(turn).constraints]
        ids_b = [c.id for c in sessions_b[system_id].turn(turn).constraints]
        if ids_a != ids_b:
            raise SysbenchError(
                f"{run_b.path}: session {system_id}, turn {turn}: checklist {ids_b} differs from {run_a.path}'s {ids_a}"
            )

    overall: list[tuple[str, str]] = []
    by_type: dict[str, list[tuple[str, str]]] = defaultdict(list)
    turn_pairs: list[tuple[bool, bool]] = []
    unusable = {"a": Counter(), "b": Counter()}
    usable_keys: set[tuple[int, int]] = set()
    for key in common:
        rec_a, rec_b = judg_a[key], judg_b[key]
        usable = True
        for side, record in (("a", rec_a), ("b", rec_b)):
            if record.parse_status not in USABLE_STATUSES:
                unusable[side][record.parse_status] += 1
                usable = False
        if not usable:
            continue
        usable_keys.add(key)
        for constraint in sessions_a[key[0]].turn(key[1]).constraints:
            pair = (_value(rec_a, constraint.id), _value(rec_b, constraint.id))
            overall.append(pair)
            by_type[constraint.type].append(pair)
        turn_pairs.append((_passes(rec_a), _passes(rec_b)))

    report: dict[str, Any] = {
        "run_a": {"path": str(run_a.path), "judge": _judge_name(judg_a, common)},
        "run_b": {"path": str(run_b.path), "judge": _judge_name(judg_b, common)},
        "turns_compared": len(turn_pairs),
        "turns_common": len(common),
        "turns_only_in_a": len(set(judg_a) - set(judg_b)),
        "turns_only_in_b": len(set(judg_b) - set(judg_a)),
        "unusable_turns": {side: dict(counts) for side, counts in unusable.items()},
        "constraints": _binary_block(overall),
        "by_type": {t: _binary_block(by_type[t]) for t in TYPE_ORDER if by_type.get(t)},
        "turns": {
            "n": len(turn_pairs),
            "pass_agreement": _rate(sum(a == b for a, b in turn_pairs), len(turn_pairs)),
            "kappa_pass": cohens_kappa(turn_pairs),
            "pass_rate_a": _rate(sum(a for a, _ in turn_pairs), len(turn_pairs)),
            "pass_rate_b": _rate(sum(b for _, b in turn_pairs), len(turn_pairs)),
        },
        "metrics": _metrics_effect(run_a, run_b, sessions_a, usable_keys),
    }
    return report


def _value(record: JudgmentRecord, number: int) -> str:
    verdict = record.verdicts.get(str(number))
    return verdict.value if verdict is not None else "other"


def _passes(record: JudgmentRecord) -> bool:
    # Every verdict of the record counts, as in metrics (an imported extra line with 否 fails the turn).
    return all(v.value != "no" for v in record.verdicts.values())


def _judge_name(judgments: dict, keys: Sequence[tuple[int, int]]) -> str | None:
    names = Counter(judgments[k].judge_model for k in keys)
    return names.most_common(1)[0][0] if names else None


# ----------------------------------------------------------------------------- metrics effect


def _metrics_effect(
    run_a: RunDir, run_b: RunDir, sessions: dict[int, Session], usable: set[tuple[int, int]]
) -> dict[str, Any]:
    """CSR / ISR / SSR of both runs on the sessions whose every turn both have usable verdicts for."""
    full = [s for s in sessions.values() if all((s.system_id, t.index) in usable for t in s.turns)]
    if not full:
        return {"sessions": 0, "note": "no session has usable verdicts for every turn in both runs"}
    keys = {(s.system_id, t.index) for s in full for t in s.turns}
    scores: dict[str, dict[str, float | None]] = {}
    with tempfile.TemporaryDirectory(prefix="sysbench-agreement-") as tmp:
        for side, run in (("a", run_a), ("b", run_b)):
            subset = _subset_run(run, full, keys, Path(tmp) / side)
            try:
                result = run_metrics(subset.path, resamples=1)  # point values only
            except SysbenchError as error:
                return {"sessions": len(full), "error": f"run {side}: {error}"}
            scores[side] = headline(result)
    delta = {
        name: (scores["b"][name] - scores["a"][name])
        if scores["a"].get(name) is not None and scores["b"].get(name) is not None
        else None
        for name in ("csr", "isr", "ssr")
    }
    return {"sessions": len(full), "a": scores["a"], "b": scores["b"], "b_minus_a": delta}


def _subset_run(run: RunDir, sessions: Sequence[Session], keys: set[tuple[int, int]], path: Path) -> RunDir:
    subset = RunDir(path)
    path.mkdir(parents=True)
    manifest = run.read_manifest()
    write_json_atomic(path / MANIFEST, manifest)
    write_json_atomic(subset.sessions_path, [session_to_upstream(s) for s in sessions])
    gens: dict = run.generations.read()
    judg: dict = run.judgments.read()
    subset.generations.append([gens[k] for k in sorted(keys)], existing=set())
    subset.judgments.append([judg[k] for k in sorted(keys)], existing=set())
    return subset


def headline(result: Any) -> dict[str, float | None]:
    """CSR / ISR / SSR from whatever ``benchmarks.runs.run_metrics`` returns (a mapping or an object)."""
    out: dict[str, float | None] = {}
    for name in ("csr", "isr", "ssr"):
        value = result.get(name) if isinstance(result, dict) else getattr(result, name, None)
        if isinstance(value, dict):  # e.g. {"overall": x, ...}
            value = value.get("overall", value.get("value"))
        out[name] = float(value) if isinstance(value, (int, float)) else None
    return out


# ----------------------------------------------------------------------------- CLI


def _fmt(value: float | None, percent: bool = True) -> str:
    if value is None:
        return "n/a"
    return f"{100 * value:.1f}%" if percent else f"{value:.3f}"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in counts.items()) or "none"


def format_report(report: dict[str, Any]) -> str:
    c, t = report["constraints"], report["turns"]
    lines = [
        f"A: {report['run_a']['path']}  (judge {report['run_a']['judge']})",
        f"B: {report['run_b']['path']}  (judge {report['run_b']['judge']})",
        f"turns compared {report['turns_compared']} of {report['turns_common']} in common"
        f"  (unusable: A {_counts(report['unusable_turns']['a'])}, B {_counts(report['unusable_turns']['b'])};"
        f" only in A {report['turns_only_in_a']}, only in B {report['turns_only_in_b']})",
        "",
        f"{'':12} {'n':>6} {'agree':>7} {'yes-agree':>9} {'kappa':>7}",
        f"{'constraints':12} {c['n']:>6} {_fmt(c['raw_agreement']):>7} {_fmt(c['yes_agreement']):>9} "
        f"{_fmt(c['kappa_yes'], False):>7}",
    ]
    for name, block in report["by_type"].items():
        lines.append(
            f"{'  ' + name:12} {block['n']:>6} {_fmt(block['raw_agreement']):>7} {_fmt(block['yes_agreement']):>9} "
            f"{_fmt(block['kappa_yes'], False):>7}"
        )
    lines.append(
        f"{'turns (pass)':12} {t['n']:>6} {_fmt(t['pass_agreement']):>7} {'':>9} {_fmt(t['kappa_pass'], False):>7}"
    )
    m = report["metrics"]
    lines.append("")
    if "a" in m:
        lines.append(
            f"metrics on {m['sessions']} session(s) with usable verdicts for every turn in both:  A -> B (B - A)"
        )
        for name in ("csr", "isr", "ssr"):
            a, b, d = m["a"][name], m["b"][name], m["b_minus_a"][name]
            delta = "n/a" if d is None else f"{100 * d:+.1f} pts"
            lines.append(f"  {name.upper()}  {_fmt(a)} -> {_fmt(b)}  ({delta})")
    else:
        lines.append(f"metrics: {m.get('error') or m.get('note')}")
    return "\n".join(lines)


def agreement_main(path_a: Path, path_b: Path, as_json: bool) -> int:
    report = compare_runs(path_a, path_b)
    print(json.dumps(report, ensure_ascii=False, indent=2) if as_json else format_report(report))
    return 0
