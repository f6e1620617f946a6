"""The report's numeric tables: what goes in them (the paper's layouts); ``core.tables`` renders them."""

from __future__ import annotations

from collections.abc import Sequence

from sysbench_gpu.benchmarks.sysbench.data import (
    ALIGNMENT_ORDER,
    GROUP_ORDER,
    TYPE_ORDER,
)
from sysbench_gpu.benchmarks.sysbench.report_runs import N_TURNS, GtPair, RunSummary, _diff_points, as_sequence
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.tables import Table, _num, pct

SORT_KEYS = ("given", "csr", "isr", "ssr")


# ---------------------------------------------------------------- tables


def table_overall(runs: Sequence[RunSummary]) -> Table:
    rows, notes = [], []
    for run in runs:
        m = run.metrics
        rows.append((run.label, [pct(m.get("csr")), pct(m.get("isr")), pct(m.get("ssr"))]))
        ci = m.get("ci95") or {}
        row_notes = []
        for key in ("csr", "isr", "ssr"):
            bounds = ci.get(key)
            if bounds and len(bounds) == 2 and None not in bounds:
                row_notes.append(f" [{100 * bounds[0]:.1f}, {100 * bounds[1]:.1f}]")
            else:
                row_notes.append("")
        notes.append(row_notes)
    return Table(
        name="table2_overall",
        title="Overall: constraint, instruction and session satisfaction rates",
        caption="CSR, ISR and SSR (%) per model; best per column in bold.",
        groups=[("", ["CSR", "ISR", "SSR"])],
        rows=rows,
        notes=notes,
    )


def table_alignment(runs: Sequence[RunSummary]) -> Table:
    rows = []
    for run in runs:
        by_group = run.metrics.get("isr_by_group") or {}
        overall = run.metrics.get("isr_by_alignment") or {}
        values = []
        for group in GROUP_ORDER:
            values += [pct((by_group.get(group) or {}).get(alignment)) for alignment in ALIGNMENT_ORDER]
        values += [pct(overall.get(alignment)) for alignment in ALIGNMENT_ORDER]
        rows.append((run.label, values))
    headers = [alignment.capitalize() for alignment in ALIGNMENT_ORDER]
    return Table(
        name="table3_alignment",
        title="ISR on aligned and misaligned instructions",
        caption="ISR (%) on aligned and misaligned user instructions within multi-turn dependent "
        "sessions, multi-turn parallel sessions and overall; best per column in bold.",
        groups=[("Dependent", headers), ("Parallel", headers), ("Overall", headers)],
        rows=rows,
    )


def table_rounds(runs: Sequence[RunSummary]) -> Table:
    rows = []
    for run in runs:
        rounds = run.metrics.get("rounds") or {}
        ssr_by_group = run.metrics.get("ssr_by_group") or {}
        values = []
        for group in GROUP_ORDER:
            values += [pct(v) for v in as_sequence(rounds.get(group))]
            values.append(pct(ssr_by_group.get(group)))
        rows.append((run.label, values))
    headers = [f"R{n}" for n in range(1, N_TURNS + 1)] + ["SSR"]
    return Table(
        name="table4_rounds",
        title="Session satisfaction by round",
        caption="Rn: share of sessions whose first n turns all pass (%), and SSR (the mean of R1..R5), "
        "within multi-turn dependent and parallel sessions; best per column in bold.",
        latex_caption="R$_n$: share of sessions whose first $n$ turns all pass (\\%), and SSR (the mean of "
        "R$_1$..R$_5$), within multi-turn dependent and parallel sessions; best per column in bold.",
        groups=[("Dependent", headers), ("Parallel", headers)],
        rows=rows,
    )


def table_csr_by_type(runs: Sequence[RunSummary]) -> Table:
    rows = []
    for run in runs:
        by_type = run.metrics.get("csr_by_type") or {}
        rows.append((run.label, [pct(by_type.get(kind)) for kind in TYPE_ORDER] + [pct(run.metrics.get("csr"))]))
    return Table(
        name="table6_csr_by_type",
        title="CSR by constraint type",
        caption="CSR (%) per constraint type and overall; best per column in bold.",
        groups=[("", [kind.capitalize() for kind in TYPE_ORDER] + ["Overall"])],
        rows=rows,
    )


def table_gt_gain(pairs: Sequence[GtPair]) -> Table:
    rows = []
    for pair in pairs:
        gains = pair.turn_gains
        overall = [
            _diff_points(pair.gt.metrics.get("isr"), pair.base.metrics.get("isr")),
            _diff_points(pair.gt.metrics.get("ssr"), pair.base.metrics.get("ssr")),
        ]
        rows.append((pair.label, gains + overall))
    return Table(
        name="table_gt_history_gain",
        title="Gain from ground-truth history",
        caption="ISR per turn, ISR and SSR with ground-truth history minus with the model's own "
        "history, in percentage points. Turn 1 has no history, so its gain should be about zero.",
        groups=[("ISR gain per turn", [f"T{n}" for n in range(1, N_TURNS + 1)]), ("Overall gain", ["ISR", "SSR"])],
        rows=rows,
        bold_best=False,
        signed=True,
        markdown_headers=[f"T{n}" for n in range(1, N_TURNS + 1)] + ["ISR", "SSR"],
    )


def build_tables(runs: Sequence[RunSummary], pairs: Sequence[GtPair] = ()) -> list[Table]:
    tables = [table_overall(runs), table_alignment(runs), table_rounds(runs), table_csr_by_type(runs)]
    if pairs:
        tables.append(table_gt_gain(pairs))
    return tables


def sort_runs(runs: Sequence[RunSummary], key: str) -> list[RunSummary]:
    """Runs as given, or by a headline metric, best first (stable for ties)."""
    if key == "given":
        return list(runs)
    if key not in SORT_KEYS:
        raise SysbenchError(f"--sort: unknown key {key!r} (choose from {', '.join(SORT_KEYS)})")
    return sorted(runs, key=lambda run: -(_num(run.metrics.get(key)) or 0.0))


# ---------------------------------------------------------------- rendering
