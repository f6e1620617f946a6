"""The ``attention`` stage: the system message's share of attention for every token of every session.

For each session one teacher-forced forward runs over the whole final conversation
(system + user turns + replies from the run's ``generations.jsonl`` or the reference
replies), built as generation built it (``attn_conversation``: distractor exchanges in
front, MT-Eval context turns with their given replies, one forward per turn for
single-turn runs); ``attn_hooks.AttentionShareCapture`` measures at the selected layers the
share of attention that every token gives to the system text and to the template's
leading tokens. With ``--control`` the same conversation is also run with the system
text sent as user (joined to the first user message).

Output directory::

    OUT/
      manifest.json            how the numbers were made (model, layers, chunking, spans, versions)
      sessions/<id>.<condition>.npz   per session: token ids, per-token shares per layer, boundaries, meta
      sessions/<id>.<condition>.skipped.json   a session that could not be measured (and why)
      shards/rank<r>-of-<w>.jsonl      per-turn rows written by each rank as it goes
      turn_shares.jsonl        merged per-turn table (rank 0, at the end)
      analysis.json            correlation with verdicts, system-vs-user comparison, summaries
      figures/                 token_shares_<id>_<layer>.png/pdf, turn_means_<layer>.png/pdf

Resume is per session and condition: an existing ``.npz`` (written atomically) is
skipped. Under ``torchrun`` (RANK/WORLD_SIZE in the environment) each rank takes every
WORLD_SIZE-th session and rank 0 waits for the others' done markers and merges; with
``--tensor-parallel`` the ranks instead split every layer's heads, run every session
together, and only rank 0 writes (``attn_layout``). Files: ``attn_store``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from sysbench_gpu.attn_layout import Distributed, LoadPlan, mark_done, plan_load, wait_for_ranks
from sysbench_gpu.attn_store import (
    append_lines,
    check_settings,
    load_session,
    merge_turn_table,
    read_manifest,
    save_npz_atomic,
    session_path,
    shard_path,
    skip_path,
)
from sysbench_gpu.attn_conversation import RunConversations, concat_forwards, conversation_turns  # noqa: F401
from sysbench_gpu.data import parse_session_ids, select_sessions
from sysbench_gpu.errors import SysbenchError
from sysbench_gpu.locks import stage_lock

log = logging.getLogger(__name__)

STAGE = "attention"
SPAN_NAMES = ("lead", "system")


# ----------------------------------------------------------------- CLI


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "attention",
        help="share of attention on the system message, per token, per session (teacher-forced)",
        description="Measure the system message's share of attention for every token of every session.",
    )
    parser.add_argument("run_dir", help="run directory (sessions.json, generations.jsonl, judgments.jsonl)")
    parser.add_argument("--model", required=True, help="model path or hub id, or 'smollm2'")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--layers", default="mid,last", help="mid, last, all or layer numbers, comma-separated (default mid,last)")
    parser.add_argument("--sessions", help="system ids, e.g. 1,2,10-20 (default: all sessions of the run)")
    parser.add_argument("--limit", type=int, help="only the first N selected sessions")
    parser.add_argument("--control", action="store_true", help="also run the system text as a user message")
    parser.add_argument(
        "--replies", choices=("auto", "generations", "reference"), default="auto",
        help="assistant replies to teacher-force: the run's generations or the reference replies (auto: generations if any)",
    )
    parser.add_argument("--chunk-tokens", type=int, help="query and key chunk length (default: sized from --chunk-mib)")
    parser.add_argument("--chunk-mib", type=int, default=256, help="memory budget for the score blocks of one layer (MiB)")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    parser.add_argument("--device", default="auto", help="auto (cuda:LOCAL_RANK if available, else cpu), cpu, cuda, cuda:N")
    parser.add_argument("--device-map", help="e.g. auto: spread a large model over all visible GPUs in this process")
    parser.add_argument(
        "--tensor-parallel", action="store_true",
        help="under torchrun: split every layer's heads over the ranks (transformers' tp_plan); every rank runs every session",
    )
    parser.add_argument("--per-head", action="store_true", help="also store per-head shares")
    parser.add_argument("--store-dtype", choices=("float16", "float32"), default="float32", help="dtype of stored shares")
    parser.add_argument("--max-tokens", type=int, help="longest conversation; later turns are dropped to fit (default: model context)")
    parser.add_argument("--no-figures", action="store_true", help="do not draw figures")
    parser.add_argument("--figure-session", type=int, help="session for the per-token figure (default: the first one)")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap replicates for confidence intervals")
    parser.add_argument("--wait-timeout", type=float, default=86400.0, help="rank 0: seconds to wait for other ranks")
    parser.set_defaults(func=cmd_attention)

    plot = subparsers.add_parser(
        "attention-plot",
        help="figures from one or more attention output directories (e.g. several models)",
    )
    plot.add_argument("dirs", nargs="+", help="attention output directories")
    plot.add_argument("--out", required=True, help="figure directory")
    plot.add_argument("--layer", default="mid", help="layer label (mid, last, layerN)")
    plot.add_argument("--names", help="comma-separated model names for the legend (default: from the manifests)")
    plot.add_argument("--session", type=int, help="also draw the per-token figure of this session")
    plot.set_defaults(func=cmd_attention_plot)


# ----------------------------------------------------------------- stored arrays


def session_arrays(layout: Any, results: dict[int, Any], layers: Sequence[int], meta: dict[str, Any], store_dtype: str) -> dict[str, np.ndarray]:
    dtype = np.float16 if store_dtype == "float16" else np.float32
    shares = np.stack([results[layer].mean[0].numpy() for layer in layers]).astype(dtype)  # [L, T, 2]
    arrays = {
        "token_ids": np.asarray(layout.token_ids, dtype=np.int64),
        "layers": np.asarray(layers, dtype=np.int64),
        "shares": shares,
        "span_names": np.asarray(SPAN_NAMES),
        "spans": np.asarray([layout.lead, layout.system], dtype=np.int64),
        "system": np.asarray(layout.system, dtype=np.int64),
        "users": np.asarray(layout.users, dtype=np.int64).reshape(-1, 2),
        "replies": np.asarray(layout.replies, dtype=np.int64).reshape(-1, 2),
        "turns": np.asarray(layout.turns, dtype=np.int64).reshape(-1, 2),
        "turn_numbers": np.asarray(layout.turn_numbers, dtype=np.int64),
        "distractors": np.asarray(layout.distractors, dtype=np.int64).reshape(-1, 2),
        "meta": np.asarray(json.dumps(meta, ensure_ascii=False)),
    }
    if results[layers[0]].per_head is not None:
        arrays["per_head"] = np.stack([results[layer].per_head[0].numpy() for layer in layers]).astype(dtype)
    return arrays


# ----------------------------------------------------------------- the stage


def cmd_attention(args: argparse.Namespace) -> int:
    from sysbench_gpu.runstore import RunDir

    run = RunDir(args.run_dir).require()
    sessions = run.load_sessions()
    sessions = select_sessions(sessions, parse_session_ids(args.sessions), args.limit, source=run.sessions_path)
    generations = run.generations.read()
    replies = args.replies
    if replies == "auto":
        replies = "generations" if generations else "reference"
    if replies == "generations" and not generations:
        raise SysbenchError(f"{run.generations.path}: no generations (use --replies reference)")
    conditions = ("system", "control") if args.control else ("system",)
    conversations = RunConversations.from_run(run)
    out = Path(args.out)
    dist = Distributed.from_env()
    plan = plan_load(args.device, args.device_map, args.tensor_parallel, dist, _cuda_available())
    settings = {
        "run_dir": str(Path(args.run_dir).resolve()),
        "model": args.model,
        "layers_spec": args.layers,
        "replies": replies,
        "store_dtype": args.store_dtype,
        # How the run built its conversations (generate's manifest): what every forward holds.
        "conversation": {"history": conversations.history, "distractor_turns": conversations.distractor_turns},
    }
    # One writer per output directory: each process that writes holds its lock for the whole stage.
    # Data-parallel ranks each write their own files (one lock per rank); under tensor parallel only rank 0 writes.
    writes = plan.splits_sessions or dist.rank == 0
    with stage_lock(out, STAGE if dist.world == 1 else f"{STAGE}.{dist.tag}", enabled=writes):
        return _measure_and_finish(args, run, sessions, generations, replies, conditions, out, dist, plan, settings,
                                   conversations)


def _measure_and_finish(
    args: argparse.Namespace,
    run: Any,
    sessions: list[Any],
    generations: dict[tuple[int, int], Any],
    replies: str,
    conditions: tuple[str, ...],
    out: Path,
    dist: Distributed,
    plan: LoadPlan,
    settings: dict[str, Any],
    conversations: RunConversations,
) -> int:
    check_settings(out, settings, write=dist.rank == 0)
    # Data parallel: each rank its own sessions. Tensor parallel: every rank runs every session (each holds some heads).
    mine = sessions[dist.rank :: dist.world] if plan.splits_sessions else sessions
    runs = [(session, condition) for session in mine for condition in conditions]
    todo = [
        index
        for index, (session, condition) in enumerate(runs)
        if not session_path(out, session.system_id, condition).exists()
        and not skip_path(out, session.system_id, condition).exists()
    ]
    log.info("%s: %d of %d session runs to do (%d already done)", dist.tag, len(todo), len(runs), len(runs) - len(todo))
    if todo:
        measure_sessions(args, runs, todo, generations, replies, out, dist, plan, settings, conversations)
    if plan.splits_sessions:
        mark_done(out, dist)
    if dist.rank != 0:
        return 0
    if plan.splits_sessions:
        wait_for_ranks(out, dist, args.wait_timeout)
    finish(out, run, args)
    return 0


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def measure_sessions(
    args: argparse.Namespace,
    runs: list[tuple[Any, str]],
    todo: list[int],
    generations: dict[tuple[int, int], Any],
    replies: str,
    out: Path,
    dist: Distributed,
    plan: LoadPlan,
    settings: dict[str, Any],
    conversations: RunConversations | None = None,
) -> None:
    """Measure ``runs[i]`` for every i in ``todo``; write its arrays, shard rows or skip note (rank 0 only under TP)."""
    import torch
    from tqdm import tqdm

    from sysbench_gpu.attn_analysis import turn_row_json, turn_shares
    from sysbench_gpu.attn_hooks import AttentionShareCapture, num_layers, resolve_layers
    from sysbench_gpu.attn_layout import broadcast_ints, end_process_group, gather_head_shares, heads_of, input_device, load_model
    from sysbench_gpu.attn_segments import fit_layout
    from sysbench_gpu.runstore import write_json_atomic

    conversations = conversations or RunConversations()
    model, tokenizer, path = load_model(args.model, args.dtype, plan)
    tensor_parallel = plan.layout == "tensor-parallel"
    device = input_device(model)
    if tensor_parallel:
        # Every rank must run the same forwards in the same order, or the collectives inside them hang.
        todo = broadcast_ints(todo, device)
    writes = dist.rank == 0 or not tensor_parallel
    labels = resolve_layers(args.layers, num_layers(model))
    layers = sorted(set(labels.values()))
    by_index = {str(index): label for label, index in labels.items()}
    context = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    max_tokens = args.max_tokens or context
    manifest = check_settings(out, {**settings, "layers": layers}, write=dist.rank == 0)
    if dist.rank == 0:
        manifest.update(_manifest_fields(args, model, tokenizer, path, labels, max_tokens, dist, plan))
        write_json_atomic(out / "manifest.json", manifest)
    shard = shard_path(out, dist.tag)
    budget = int(args.chunk_mib) << 20
    progress = tqdm([runs[index] for index in todo], desc=f"attention {dist.tag}", unit="session", file=sys.stderr, disable=None if writes else True)
    with AttentionShareCapture(model, layers=layers, chunk_tokens=args.chunk_tokens, budget_bytes=budget, per_head=args.per_head) as capture:
        for session, condition in progress:
            forwards, stop_reason = conversations.forwards(session, replies, generations)
            # One forward per conversation (several for single-turn runs); a forward that cannot fit is left out.
            layouts = [fit_layout(tokenizer, f.system_prompt, f.turns, condition, max_tokens, f.prefix) for f in forwards]
            fitted = [layout for layout in layouts if layout is not None]
            if not fitted:
                reason = stop_reason or "no turn"
                if forwards:
                    reason = f"even turn {forwards[0].turns[0].index} exceeds {max_tokens} tokens"
                if writes:
                    write_json_atomic(skip_path(out, session.system_id, condition), {"system_id": session.system_id, "condition": condition, "reason": reason})
                    log.warning("session %d (%s) skipped: %s", session.system_id, condition, reason)
                continue
            started = time.perf_counter()
            measured = []
            for layout in fitted:
                capture.prepare([layout.lead, layout.system])
                ids = torch.tensor([layout.token_ids], device=device)
                results = capture.forward(ids)
                if tensor_parallel:
                    results = gather_head_shares(results, heads_of(model), dist.world, device)
                measured.append((layout, results))
            seconds = time.perf_counter() - started
            if not writes:
                continue
            n_turns = sum(len(f.turns) for f in forwards)
            n_tokens = sum(layout.n_tokens for layout in fitted)
            meta = {
                "system_id": session.system_id,
                "condition": condition,
                "model": args.model,
                "replies": replies,
                "n_tokens": n_tokens,
                "turns_measured": [n for layout in fitted for n in layout.turn_numbers],
                "stopped": stop_reason,
                "turns_dropped_for_length": n_turns - sum(len(layout.turns) for layout in fitted),
                "n_forwards": len(fitted),
                "history": conversations.history,
                "distractor_turns": conversations.distractor_turns,
                "layer_labels_by_index": by_index,
                "seconds": round(seconds, 3),
            }
            arrays = concat_forwards([session_arrays(layout, results, layers, meta, args.store_dtype) for layout, results in measured])
            save_npz_atomic(session_path(out, session.system_id, condition), arrays)
            append_lines(shard, [turn_row_json(row) for row in turn_shares(arrays)])
            progress.set_postfix(tokens=n_tokens, s=f"{seconds:.1f}")
        paths = getattr(capture, "paths", None)
    if dist.rank == 0 and paths:
        manifest["capture_paths"] = {str(layer): str(name) for layer, name in sorted(paths.items())}
        write_json_atomic(out / "manifest.json", manifest)
    if tensor_parallel:
        end_process_group()


def _manifest_fields(args: argparse.Namespace, model: Any, tokenizer: Any, path: str, labels: dict[str, int], max_tokens: Any, dist: Distributed, plan: LoadPlan) -> dict[str, Any]:
    from sysbench_gpu.attn_hooks import num_layers
    from sysbench_gpu.runstore import package_versions, utc_now

    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    softcap = getattr(text_config, "attn_logit_softcapping", None)
    implementation = model.config._attn_implementation
    return {
        "stage": STAGE,
        "model_path": path,
        "layer_labels": labels,
        "n_layers": num_layers(model),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "attn_implementation_wrapped": model.config._attn_implementation,
        "chunk_tokens": args.chunk_tokens,
        "chunk_mib": args.chunk_mib,
        "max_tokens": max_tokens,
        "world_size": dist.world,
        "layout": plan.layout,
        "tensor_parallel_size": plan.tensor_parallel_size,
        "device_map": plan.device_map if plan.layout == "device-map" else None,
        "chat_template_sha256": _sha256(tokenizer.chat_template),
        "spans": {
            "lead": "tokens before the system text (BOS, role header; in control also a template's default system message)",
            "system": "tokens of the system text, located in the rendered chat template through tokenizer offsets",
        },
        "share": "head-mean attention share of the span (over all heads, also under tensor parallel); "
        "share_excl_lead = share / (1 - lead share)",
        "capture_method": "kernel-lse: the layer's output and every row's log-sum-exp from one attention kernel call, "
        "plus the log-sum-exp over the span's keys, share = exp(LSE_span - LSE_all); fallback (eager attention, or no "
        "kernel with LSE): the model's own call, and each row's log-sum-exp recomputed over all keys in chunks; "
        "capture_paths says which ran at each layer",
        "attn_logit_softcapping": None if not softcap else (
            f"{softcap:g} in the config, not applied: the capture runs transformers' SDPA attention (the model was loaded "
            f"with {implementation}), which ignores it; the shares describe that attention" if implementation != "eager"
            else f"{softcap:g}, applied by the model's eager attention and in the shares"
        ),
        "control": f"system text sent as user: system + {json.dumps(_joiner())} + user turn 1",
        "versions": package_versions(),
        "updated": utc_now(),
    }


def _joiner() -> str:
    from sysbench_gpu.attn_segments import CONTROL_JOINER

    return CONTROL_JOINER


def _sha256(text: Any) -> str | None:
    import hashlib

    return hashlib.sha256(str(text).encode("utf-8")).hexdigest() if text else None


def finish(out: Path, run: Any, args: argparse.Namespace) -> None:
    from sysbench_gpu.attn_analysis import compare_conditions, correlate_with_verdicts, summarize
    from sysbench_gpu.runstore import write_json_atomic

    rows = merge_turn_table(out)
    judgments = run.judgments.read()
    analysis = {
        "n_turn_rows": len(rows),
        "n_sessions": len({row.system_id for row in rows}),
        "summary": summarize(rows),
        "verdicts": correlate_with_verdicts(rows, judgments, n_boot=args.bootstrap),
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


# ----------------------------------------------------------------- figures


def draw_figures(dirs: Sequence[Path], figure_dir: Path, names: Sequence[str] | None, session: int | None, layer_label: str | None = None) -> list[Path]:
    from sysbench_gpu.attn_analysis import layer_name, plot_token_shares, plot_turn_means, read_turn_table

    tables = []
    manifests = [read_manifest(d) for d in dirs]
    for position, (directory, manifest) in enumerate(zip(dirs, manifests)):
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
                series, int(layer), figure_dir / f"token_shares_{wanted}_{label}",
                title=f"{tables[0][0]}, session {wanted}, {layer_name(label, int(layer))}",
            )
    for path in written:
        log.info("figure %s", path)
    return written


def cmd_attention_plot(args: argparse.Namespace) -> int:
    dirs = [Path(d) for d in args.dirs]
    names = [n.strip() for n in args.names.split(",")] if args.names else None
    if names and len(names) != len(dirs):
        raise SysbenchError(f"--names gives {len(names)} names for {len(dirs)} directories")
    written = draw_figures(dirs, Path(args.out), names, args.session, layer_label=args.layer)
    for path in written:
        print(path)
    return 0
