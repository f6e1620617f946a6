"""The closing half of the attention stage: merge the table, analyse it, print a summary and draw the figures.

Rank 0 runs ``finish`` once every rank is done; ``attention-plot`` calls ``draw_figures``
over one or more output directories (e.g. several models).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sysbench_gpu.attention.analysis.figures import layer_name, plot_token_shares, plot_turn_means
from sysbench_gpu.attention.analysis.outcomes import turn_views
from sysbench_gpu.attention.analysis.turn_stats import compare_conditions, correlate_with_verdicts, summarize
from sysbench_gpu.attention.files.store import load_session, read_manifest, session_path
from sysbench_gpu.attention.files.turn_table import merge_turn_table, read_turn_table
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.rundir import write_json_atomic

log = logging.getLogger(__name__)


def finish(out: Path, run: Any, args: argparse.Namespace) -> None:
    rows = merge_turn_table(out)
    judgments = run.judgments.read()
    analysis = {
        "n_turn_rows": len(rows),
        "n_sessions": len({row.system_id for row in rows}),
        "summary": summarize(rows),
        "verdicts": correlate_with_verdicts(rows, turn_views(run.path), judgments, n_boot=args.bootstrap),
    }
    if any(row.condition == "control" for row in rows):
        analysis["system_vs_user"] = compare_conditions(rows, n_boot=args.bootstrap)
    write_json_atomic(out / "analysis.json", analysis)
    print_summary(out, analysis)
    if not args.no_figures and rows:
        draw_figures([out], out / "figures", names=None, session=args.figure_session)


def print_summary(out: Path, analysis: dict[str, Any]) -> None:
    print(f"{out}: {analysis['n_sessions']} sessions, {analysis['n_turn_rows']} turn rows")
    for label, conditions in analysis["summary"].items():
        for condition, values in conditions.items():
            share = values.get("reply_share_excl_lead")
            text = "n/a" if share is None else f"{share:.4f}"
            print(f"  {label:>8} {condition:<8} mean reply share (lead excluded) {text}")
    verdicts = analysis["verdicts"]
    if verdicts.get("status") != "ok":
        print(f"  verdicts: {verdicts.get('reason')}; correlation skipped")
        return
    for label, entry in verdicts["layers"].items():
        stats = entry["turn_pass"]
        r = stats["r_point_biserial"]
        ci = stats["ci95"]
        ci_text = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
        r_text = "n/a" if r is None else f"{r:.3f}"
        print(f"  {label:>8} share vs turn pass: r = {r_text}{ci_text} over {stats['n']} turns")


def draw_figures(
    dirs: Sequence[Path],
    figure_dir: Path,
    names: Sequence[str] | None,
    session: int | None,
    layer_label: str | None = None,
) -> list[Path]:
    tables = []
    manifests = [read_manifest(d) for d in dirs]
    for position, (directory, manifest) in enumerate(zip(dirs, manifests, strict=False)):
        name = names[position] if names else Path(str(manifest.get("model", directory))).name
        rows = read_turn_table(directory / "turn_shares.jsonl")
        if not rows:
            rows = merge_turn_table(directory)
        tables.append((name, rows))
    labels = [layer_label] if layer_label else list(manifests[0].get("layer_labels", {}) or {"mid": None})
    written: list[Path] = []
    for label in labels:
        try:
            written += plot_turn_means(tables, label, figure_dir / f"turn_means_{label}")
        except SysbenchError as error:
            log.warning("%s", error)
    # Per-token figure: one session of the first directory, both conditions when present.
    first, manifest = dirs[0], manifests[0]
    stored = sorted((first / "sessions").glob("*.npz"))
    if stored:
        wanted = session if session is not None else int(stored[0].name.split(".")[0])
        series = []
        for condition, label in (("system", "as system"), ("control", "as user")):
            path = session_path(first, wanted, condition)
            if path.exists():
                series.append((label, load_session(path)))
        if not series:
            raise SysbenchError(f"{first}: session {wanted} was not measured")
        for label in labels:
            layer = manifest.get("layer_labels", {}).get(label)
            if layer is None:
                continue
            written += plot_token_shares(
                series,
                int(layer),
                figure_dir / f"token_shares_{wanted}_{label}",
                title=f"{tables[0][0]}, session {wanted}, {layer_name(label, int(layer))}",
            )
    for path in written:
        log.info("figure %s", path)
    return written
