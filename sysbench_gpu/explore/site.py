"""``sysbench-gpu explore``: a static site to read runs, sessions, verdicts or scores, and attention (docs/explore.md).

::

    SITE/
      index.html, session.html, explore.css, explore*.js  the pages (copied from explore/assets/)
      data/index.js                 runs with their metrics, one row per session (keyed <benchmark>-<system_id>)
      data/sessions/<key>.js        one session: texts, checklists, every run's replies and verdicts or scores
      data/attention/<key>.js       one session's token-level attention (only sessions that have it)
      manifest.json                 how the site was made: runs, attention directories, options, versions

The pages open from disk (file://) without a server or network: data files are
scripts that assign to a global (browsers refuse fetch() of local files), and every
text is put into the page with ``textContent``, never as HTML.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from tqdm import tqdm

from sysbench_gpu import __version__
from sysbench_gpu.core.arguments import check_out_folder
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.rundir import package_versions, utc_now, write_bytes_atomic, write_json_atomic
from sysbench_gpu.explore import attention as attn
from sysbench_gpu.explore import data, interp, sessions
from sysbench_gpu.explore.arena import ArenaPages, load_arena_pages, write_arena_pages
from sysbench_gpu.explore.scripts import js_assignment, keyed_assignment
from sysbench_gpu.reporting.report import EXPLORER_DIRNAME

log = logging.getLogger(__name__)

ASSETS = (
    "index.html",
    "session.html",
    "explore.css",
    "explore.js",
    "explore_index.js",
    "explore_session.js",
    "explore_attention.js",
    "explore_interp.js",
)
DATA_INDEX = "data/index.js"
ARENA_INDEX = "data/arena/index.js"
INDEX_GLOBAL = "SYSBENCH_EXPLORE_INDEX"
SESSIONS_GLOBAL = "SYSBENCH_EXPLORE_SESSIONS"
ATTENTION_GLOBAL = "SYSBENCH_EXPLORE_ATTENTION"


# ---------------------------------------------------------------- data files


def session_file(kind: str, key: str) -> str:
    """A session's data file: ``data/<kind>/<benchmark>-<system_id>.js`` (``key`` as ``data.key_text``)."""
    if not key or "/" in key or key.startswith("."):
        raise SysbenchError(f"explore: {key!r} is not a session key")
    return f"data/{kind}/{key}.js"


# ---------------------------------------------------------------- the site


def is_site(path: Path) -> bool:
    """An earlier explorer site: the runs' pages, an arena's, or both."""
    return (path / DATA_INDEX).is_file() or (path / ARENA_INDEX).is_file()


def check_site_out(out: str | Path, inputs: Sequence[str | Path]) -> Path:
    """``--out``: none of the inputs (runs, attention or arena folders) nor inside one, and empty or a site."""
    return check_out_folder(out, inputs=inputs, kind="explorer site", is_own=is_site)


def _write(out: Path, relative: str, payload: bytes, written: set[str]) -> int:
    write_bytes_atomic(out / relative, payload)
    written.add(relative)
    return len(payload)


def _remove_stale(out: Path, written: set[str]) -> int:
    """Data files of an earlier build that this build did not write (sessions no longer explored)."""
    removed = 0
    for kind in ("sessions", "attention"):
        for path in sorted((out / "data" / kind).glob("*.js")):
            if f"data/{kind}/{path.name}" not in written:
                path.unlink()
                removed += 1
    return removed


def copy_assets(out: Path, written: set[str]) -> None:
    folder = resources.files("sysbench_gpu.explore") / "assets"
    for name in ASSETS:
        _write(out, name, (folder / name).read_bytes(), written)


def _progress(items: Sequence[Any], desc: str, unit: str, progress: bool) -> Any:
    return tqdm(items, desc=desc, unit=unit, file=sys.stderr, disable=None if progress else True)


def build_site(
    run_dirs: Sequence[str | Path],
    out: str | Path,
    attention_dirs: Sequence[str | Path] = (),
    resamples: int = 1000,
    seed: int = 0,
    title: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Write the site; returns counts and sizes (also recorded in the site's manifest.json)."""
    if not run_dirs:
        raise SysbenchError("explore: give at least one run directory")
    if resamples < 1:
        # Checked here: a run whose metrics fail is shown as unscored, which would hide a bad flag.
        raise SysbenchError(f"--resamples must be at least 1, got {resamples}")
    started = time.perf_counter()
    out = check_site_out(out, [*run_dirs, *attention_dirs])
    views = [data.load_run_view(path, resamples, seed) for path in _progress(run_dirs, "runs", "run", progress)]
    views = data.unique_labels(views)
    by_path = {view.path.resolve(): (view.label, data.run_keys(view)) for view in views}
    sources = [attn.load_source(path, by_path) for path in attention_dirs]
    texts = {source.tokenizer_path: attn.TokenText(source.tokenizer_path) for source in sources}
    for text in texts.values():
        text.load()  # a missing tokenizer stops the build before anything is written
    order = sessions.session_order(views)
    keys = [data.key_text(key) for key in order]
    arms = attn.arms_by_session(sources)
    unmatched = sorted(set(arms) - set(keys))
    if unmatched:
        log.warning("attention for %d session(s) not in any run is left out: %s", len(unmatched), unmatched[:10])

    written: set[str] = set()
    total = 0
    rows = {}
    n_attention = 0
    for key, text_key in _progress(list(zip(order, keys, strict=True)), "sessions", "session", progress):
        row = sessions.session_index_row(views, key)
        row["attention"] = arms.get(text_key, [])
        rows[text_key] = row
        detail = sessions.session_detail(views, key)
        total += _write(
            out, session_file("sessions", text_key), keyed_assignment(SESSIONS_GLOBAL, text_key, detail), written
        )
        attention = attn.session_attention(text_key, key[2], sources, texts) if sources else None
        if attention is not None:
            n_attention += 1
            total += _write(
                out,
                session_file("attention", text_key),
                keyed_assignment(ATTENTION_GLOBAL, text_key, attention),
                written,
            )
    # What `attention-analyze` wrote in the attention folders: a section of the index, figures copied beside.
    found = [interp.interp_entry(source.path, i, source.name) for i, source in enumerate(sources)]
    interp_entries = [entry for entry in found if entry is not None]
    for entry in interp_entries:
        for relative, payload in entry.files.items():
            total += _write(out, relative, payload, written)
    created = utc_now()
    index = {
        "tool": "sysbench-gpu",
        "version": __version__,
        "created": created,
        "title": title or data.site_title(views),
        "benchmarks": data.benchmark_summaries(views),
        "runs": [data.run_summary(view) for view in views],
        "attention": [source.describe() for source in sources],
        "interp": [entry.summary for entry in interp_entries],
        "order": keys,
        "sessions": rows,
        "quantization": f"per-token attention shares as uint8 levels round({attn.QUANT_LEVELS} * share), base64",
    }
    total += _write(out, DATA_INDEX, js_assignment(f"window.{INDEX_GLOBAL}", index), written)
    copy_assets(out, written)
    removed = _remove_stale(out, written)
    seconds = time.perf_counter() - started
    summary = {
        "n_runs": len(views),
        "n_sessions": len(order),
        "n_sessions_with_attention": n_attention,
        "attention_left_out": unmatched,
        "data_bytes": total,
        "files_written": len(written),
        "stale_files_removed": removed,
        "seconds": round(seconds, 2),
    }
    write_json_atomic(
        out / "manifest.json",
        {
            "tool": "sysbench-gpu explore",
            "created": created,
            "versions": package_versions(("sysbench-gpu", "transformers", "tokenizers")),
            "runs": [
                {
                    "label": view.label,
                    "path": str(view.path.resolve()),
                    "benchmark": view.benchmark.name,
                    "status": view.status,
                    "note": view.note,
                }
                for view in views
            ],
            "attention": [source.describe() for source in sources],
            "metrics": {
                "resamples": resamples,
                "seed": seed,
                "unit": "session",
                "partial_rule": "a run metrics refuses is scored with --allow-partial --exclude-unparsed "
                "--exclude-skipped and shown as partial",
            },
            "quantization": index["quantization"] + "; per-turn means at full precision, rounded to 5 decimals",
            "summary": summary,
        },
    )
    return summary


# ---------------------------------------------------------------- CLI


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "explore",
        help="a static HTML site to read sessions, verdicts or scores, and token-level attention",
        description="Write a self-contained static site (opens from disk, no server) for one or more runs.",
    )
    parser.add_argument("runs", nargs="*", metavar="RUN_DIR", help="run directories (generated, judged or imported)")
    parser.add_argument(
        "--attention",
        nargs="+",
        default=[],
        metavar="ATTN_DIR",
        help="attention output directories (sysbench-gpu attention --out)",
    )
    parser.add_argument(
        "--out",
        required=True,
        help="site folder (created; an earlier site there is updated); a report whose folder is "
        f"beside a folder named {EXPLORER_DIRNAME!r} links to it",
    )
    parser.add_argument(
        "--arena", metavar="ARENA_DIR", help="also a page of this arena's battles (sysbench-gpu arena --out)"
    )
    parser.add_argument("--title", help="page title (default: the run labels)")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples for the metric CIs")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    parser.set_defaults(func=_cmd_explore)


def _cmd_explore(args: argparse.Namespace) -> int:
    # Every input is read and checked before the first file is written: --out, then the arena, then the runs.
    out = check_site_out(args.out, [*args.runs, *args.attention, *([args.arena] if args.arena else [])])
    pages = load_arena_pages(args.arena) if args.arena else None
    if args.runs or not args.arena:
        summary = build_site(args.runs, out, args.attention, resamples=args.resamples, seed=args.seed, title=args.title)
        print(
            f"wrote {out / 'index.html'}: {summary['n_runs']} run(s), {summary['n_sessions']} sessions "
            f"({summary['n_sessions_with_attention']} with attention), {summary['files_written']} files, "
            f"{summary['data_bytes'] / 1e6:.1f} MB of data in {summary['seconds']:.1f} s"
        )
    if pages is not None:
        _write_arena(pages, out)
    return 0


def _write_arena(pages: ArenaPages, out: Path) -> None:
    """The arena page, beside a site of the runs or alone."""
    arena = write_arena_pages(pages, out)
    print(
        f"wrote {out / 'arena.html'}: {arena['n_battles']} battles in {arena['n_sessions']} sessions, "
        f"{arena['data_bytes'] / 1e6:.1f} MB of data"
    )
