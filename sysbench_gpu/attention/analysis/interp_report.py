"""``attention-analyze``: heads map, failure probe and decay over attention output directories.

Writes into each directory that holds per-head shares (``attention --per-head``)::

    heads.json        layer x head map: mean share, point-biserial r with turn pass, CI, session-permutation p, BH q
    top_heads.json    {"heads": [[layer, head], ...], "details": [{..., "q", "significant"}], ...}:
                      what `generate --steer-heads` reads
    probe.json        the failure probe's cross-validated AUC and the baseline's, with session-bootstrap CIs
    figures/heads_map.png|pdf, figures/probe_roc.png|pdf

and into ``--out`` (default: the first directory), over all directories (one per history mode)::

    decay.json        share vs turn and vs token distance: fitted slopes with CIs per history, condition, layer
    figures/decay_<layer>.png|pdf

Every input (each folder's manifest, ``turn_shares.jsonl`` and session files, ``analysis.inputs``) is read
and checked before anything is computed, and every output is staged and written at the end, all or none
(``files.staged``).
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from sysbench_gpu.attention.analysis import decay, heads, probe
from sysbench_gpu.attention.analysis.head_table import CONDITION, load_head_table
from sysbench_gpu.attention.analysis.inputs import check_attention_dir
from sysbench_gpu.attention.analysis.turn_stats import DEFAULT_METRIC
from sysbench_gpu.attention.files.staged import StagedOutputs
from sysbench_gpu.attention.files.store import read_manifest
from sysbench_gpu.core.arguments import check_out_folder
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.jsonio import read_json

log = logging.getLogger(__name__)

HEADS_FILE, TOP_HEADS_FILE, PROBE_FILE, DECAY_FILE = "heads.json", "top_heads.json", "probe.json", "decay.json"
SCIPY_HINT = "the heads map needs scipy: pip install 'sysbench-gpu[interp]'"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "attention-analyze",
        help="which heads carry the system message, a failure probe, and decay over turns and distance",
        description="Heads map, failure probe (needs --per-head) and decay fits over attention output directories.",
    )
    parser.add_argument("dirs", nargs="+", help="attention output directories (e.g. one per --history mode)")
    parser.add_argument("--run", help="run directory with the verdicts (default: each manifest's run_dir)")
    parser.add_argument("--out", help="where decay.json and its figures go (default: the first directory)")
    parser.add_argument("--top", type=int, default=8, help="heads written to top_heads.json (default 8)")
    parser.add_argument("--folds", type=int, default=5, help="cross-validation folds, grouped by session (default 5)")
    parser.add_argument("--bootstrap", type=int, default=1000, help="session-bootstrap replicates (default 1000)")
    parser.add_argument(
        "--permutations",
        type=int,
        default=heads.DEFAULT_PERMUTATIONS,
        help=f"session permutations behind each head's p (default {heads.DEFAULT_PERMUTATIONS})",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap, the permutations and the probe")
    parser.add_argument("--no-figures", action="store_true", help="do not draw figures")
    parser.set_defaults(func=cmd_attention_analyze)


def cmd_attention_analyze(args: argparse.Namespace) -> int:
    """Read and check every input, compute everything, then write every output at once (all or none).

    ``--top``, ``--folds``, ``--bootstrap``, ``--permutations`` and ``--seed`` are checked, each with its own
    line, by ``core.arguments.check_shared_flags`` before this runs.
    """
    dirs = [Path(d) for d in args.dirs]
    if args.run and len(dirs) > 1:
        raise SysbenchError("attention-analyze: --run names the run of one directory; give one directory with it")
    run = Path(args.run) if args.run else None
    checked = [check_attention_dir(directory) for directory in dirs]
    out = Path(args.out) if args.out else dirs[0]
    if args.out and out.resolve() not in {directory.resolve() for directory in dirs}:
        runs = [run] if run else [Path(str(item.manifest["run_dir"])) for item in checked if "run_dir" in item.manifest]
        check_out_folder(out, inputs=runs, own_marker=DECAY_FILE, kind="attention-analyze output")
    lines: list[str] = []
    with StagedOutputs() as outputs:
        for directory in dirs:
            lines += analyze_heads(directory, run, args, outputs)
        lines += analyze_decay(dirs, out, args, outputs)
        outputs.commit()
    for line in lines:
        print(line)
    return 0


def has_per_head(out: Path) -> bool:
    files = sorted((out / "sessions").glob(f"*.{CONDITION}.npz"))
    if not files:
        return False
    import zipfile

    try:
        with zipfile.ZipFile(files[0]) as archive:
            return "per_head.npy" in archive.namelist()
    except (OSError, zipfile.BadZipFile) as error:
        raise SysbenchError(f"{files[0]}: not a readable session file ({error or type(error).__name__})") from None


def analyze_heads(
    out: Path, run: Path | None, args: argparse.Namespace, outputs: StagedOutputs | None = None
) -> list[str]:
    """Heads map and failure probe of one directory; returns the lines to print.

    Its files are staged in ``outputs`` (the caller commits them with the rest); without, they are written here.
    """
    if outputs is None:
        with StagedOutputs() as own:
            lines = analyze_heads(out, run, args, own)
            own.commit()
        return lines
    if not has_per_head(out):
        return [f"{out}: no per-head shares (measure with `attention --per-head`); heads and probe skipped"]
    try:
        import scipy  # noqa: F401
    except ImportError:
        return [f"{out}: {SCIPY_HINT}"]
    table = load_head_table(out, run)
    lines = [f"{out}:"]
    model = Path(str(read_manifest(out).get("model", out))).name
    result = heads.head_map(table, n_boot=args.bootstrap, seed=args.seed, permutations=args.permutations)
    top = heads.top_heads(result, args.top)
    outputs.json(out / HEADS_FILE, heads.head_map_json(result, DEFAULT_METRIC))
    outputs.json(out / TOP_HEADS_FILE, top)
    lines += heads.summary_lines(result, top)
    if not args.no_figures:
        base = out / "figures" / "heads_map"
        drawn = heads.plot_head_map(result, outputs.figure_base(base), f"{model}: which heads carry the system message")
        outputs.adopt(drawn, base)
    if not probe.sklearn_available():
        lines.append(f"probe: {probe.INSTALL_HINT}")
        return lines
    scored = probe.run_probe(table, folds=args.folds, n_boot=args.bootstrap, seed=args.seed)
    outputs.json(out / PROBE_FILE, probe.probe_json(scored, DEFAULT_METRIC))
    lines.append(probe.summary_line(scored))
    if not args.no_figures:
        base = out / "figures" / "probe_roc"
        drawn = probe.plot_roc(scored, outputs.figure_base(base), f"{model}: failure probe (out-of-fold)")
        outputs.adopt(drawn, base)
    return lines


def analyze_decay(dirs: list[Path], out: Path, args: argparse.Namespace, outputs: StagedOutputs) -> list[str]:
    series = []
    for directory in dirs:
        series += decay.decay_of_dir(directory, n_boot=args.bootstrap, seed=args.seed)
    outputs.json(out / DECAY_FILE, decay.decay_json(series, DEFAULT_METRIC) | {"dirs": [str(d) for d in dirs]})
    if not args.no_figures:
        model = Path(str(read_manifest(dirs[0]).get("model", dirs[0]))).name
        for label in sorted({item.layer_label for item in series}):
            base = out / "figures" / f"decay_{label}"
            title = f"{model}: system share decay, {label}"
            outputs.adopt(decay.plot_decay(series, label, outputs.figure_base(base), title), base)
    return decay.summary_lines(series)


# ----------------------------------------------------------------- report sections


def report_markdown(dirs: list[Path], report_dir: Path) -> list[str]:
    """``report --attention DIR``: a section per directory from the files ``attention-analyze`` wrote there."""
    lines = ["## Attention: heads, failure probe, decay", ""]
    for out in dirs:
        lines += [f"`{out}`", ""]
        if not (out / HEADS_FILE).exists() and not (out / DECAY_FILE).exists():
            lines += [f"No heads map or decay fit here: run `sysbench-gpu attention-analyze {out}`.", ""]
            continue
        if not (out / PROBE_FILE).exists() and not probe.sklearn_available():
            lines += [f"Failure probe: {probe.INSTALL_HINT}.", ""]
        lines += report_sections(out, report_dir)
    return lines


def report_sections(out: Path, report_dir: Path | None = None) -> list[str]:
    """Markdown lines: Heads, Failure probe and Decay, from the files this verb wrote in ``out`` (none: [])."""
    lines: list[str] = []
    if (out / HEADS_FILE).exists():
        lines += _heads_section(out, report_dir)
    if (out / PROBE_FILE).exists():
        lines += _probe_section(read_json(out / PROBE_FILE, expect=dict))
    if (out / DECAY_FILE).exists():
        lines += _decay_section(out, read_json(out / DECAY_FILE, expect=dict), report_dir)
    return lines


def _link(figure: Path, report_dir: Path | None) -> str:
    """A figure's path as the report links it: relative to the report's folder when one is given."""
    return os.path.relpath(figure.resolve(), report_dir.resolve()) if report_dir else str(figure)


def _heads_section(out: Path, report_dir: Path | None) -> list[str]:
    data = read_json(out / HEADS_FILE, expect=dict)
    top = read_json(out / TOP_HEADS_FILE, expect=dict) if (out / TOP_HEADS_FILE).exists() else {"details": []}
    q = np.asarray([[np.nan if v is None else v for v in row] for row in data["q"]], dtype=np.float64)
    lines = [
        "### Heads",
        "",
        f"{data['n_heads']} heads x {len(data['layers'])} layers over {data['n_turns']} judged turns of "
        f"{data['n_sessions']} sessions (pass rate {data['pass_rate']:.2f}); "
        f"{int((np.nan_to_num(q, nan=1.0) < heads.ALPHA).sum())} heads with BH q < {heads.ALPHA} "
        f"({_p_method(data)}).",
        "",
        "| layer | head | r | 95% CI | q | mean share |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for item in top["details"]:
        ci = item["ci95"]
        ci_text = "n/a" if None in ci else f"[{ci[0]:.3f}, {ci[1]:.3f}]"
        q_text = "n/a" if item["q"] is None else f"{item['q']:.3f}"
        lines.append(
            f"| {item['layer']} | {item['head']} | {item['r']:.3f} | {ci_text} | {q_text} | {item['mean_share']:.4f} |"
        )
    figure = out / "figures" / "heads_map.png"
    if figure.exists():
        lines += ["", f"![heads map]({_link(figure, report_dir)})"]
    return lines + [""]


def _p_method(data: dict[str, Any]) -> str:
    """Where the map's p-values came from; a map written before the session permutation test says so."""
    method = data.get("p_value")
    if not isinstance(method, dict):
        return "p from the turn-level t test, which treats turns as independent: rerun attention-analyze"
    return f"p from {method.get('permutations')} session permutations"


def _probe_section(data: dict[str, Any]) -> list[str]:
    lines = ["### Failure probe", ""]
    if data.get("status") != "ok":
        return lines + [f"{data.get('reason')}.", ""]

    def text(score: dict[str, Any]) -> str:
        ci = score.get("ci95")
        return f"{score['auc']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")

    return lines + [
        f"Cross-validated AUC (GroupKFold by session, {data['cv']['folds']} folds, pooled out-of-fold): "
        f"per-head shares {text(data['probe'])}, baseline (turn, reply length) {text(data['baseline'])}; "
        f"{data['n_failing']} failing of {data['n_turns']} turns.",
        "",
    ]


def _decay_section(out: Path, data: dict[str, Any], report_dir: Path | None) -> list[str]:
    lines = [
        "### Decay",
        "",
        "| history | condition | layer | slope per turn [95% CI] | slope per distance bin [95% CI] |",
        "| --- | --- | --- | --- | --- |",
    ]

    def text(trend: dict[str, Any]) -> str:
        if trend["slope"] is None:
            return "n/a"
        ci = trend["slope_ci95"]
        return f"{trend['slope']:+.4f}" + (f" [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "")

    for item in data["series"]:
        lines.append(
            f"| {item['history']} | {item['condition']} | {item['layer_label']} | "
            f"{text(item['turn'])} | {text(item['distance'])} |"
        )
    for figure in sorted((out / "figures").glob("decay_*.png")):
        lines += ["", f"![decay]({_link(figure, report_dir)})"]
    return lines + [""]
