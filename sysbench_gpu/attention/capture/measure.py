"""The measuring half of the attention stage: load the model, run every session's forwards, write what they give.

``measure_sessions`` loads the model as ``layout`` plans it, lays out each session's
conversation (``conversation``, ``segments``), captures the shares at the chosen layers
(``hooks``) and writes per session the arrays (``session_arrays``), the shard rows and
the manifest fields that say how they were made (``files.store``, ``files.turn_table``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

# The capture class and the model loader are looked up on their modules at call time
# (``attn_hooks.AttentionShareCapture``, ``attn_layout.load_model``) so tests can replace them.
from sysbench_gpu.attention.capture import hooks as attn_hooks
from sysbench_gpu.attention.capture import layout as attn_layout
from sysbench_gpu.attention.capture.conversation import RunConversations, concat_forwards
from sysbench_gpu.attention.capture.layers import num_layers, resolve_layers
from sysbench_gpu.attention.capture.layout import (
    Distributed,
    LoadPlan,
    broadcast_ints,
    end_process_group,
    gather_head_shares,
    heads_of,
    input_device,
)
from sysbench_gpu.attention.capture.segments import CONTROL_JOINER, fit_layout
from sysbench_gpu.attention.files.store import (
    append_lines,
    check_settings,
    save_npz_atomic,
    session_path,
    shard_path,
    skip_path,
)
from sysbench_gpu.attention.files.turn_table import turn_row_json, turn_shares
from sysbench_gpu.core.progress import DEFAULT_LOG_EVERY, ProgressLog, quiet_library_bars
from sysbench_gpu.core.rundir import package_versions, utc_now, write_json_atomic

log = logging.getLogger(__name__)

STAGE = "attention"
SPAN_NAMES = ("lead", "system")


def session_arrays(
    layout: Any, results: dict[int, Any], layers: Sequence[int], meta: dict[str, Any], store_dtype: str
) -> dict[str, np.ndarray]:
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

    conversations = conversations or RunConversations()
    quiet_library_bars(force=getattr(args, "no_progress", False))
    model, tokenizer, path = attn_layout.load_model(args.model, args.dtype, plan)
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
    # A bar on a terminal, else a line every --log-every seconds (core.progress); one per writing process.
    progress = ProgressLog(
        "attention" if dist.world == 1 else f"attention {dist.tag}",
        len(todo),
        "session",
        log_every=getattr(args, "log_every", DEFAULT_LOG_EVERY),
        enabled=writes and not getattr(args, "no_progress", False),
    )
    with (
        progress,
        attn_hooks.AttentionShareCapture(
            model, layers=layers, chunk_tokens=args.chunk_tokens, budget_bytes=budget, per_head=args.per_head
        ) as capture,
    ):
        for session, condition in [runs[index] for index in todo]:
            forwards, stop_reason = conversations.forwards(session, replies, generations)
            # One forward per conversation (several for single-turn runs); a forward that cannot fit is left out.
            layouts = [
                fit_layout(tokenizer, f.system_prompt, f.turns, condition, max_tokens, f.prefix) for f in forwards
            ]
            fitted = [layout for layout in layouts if layout is not None]
            if not fitted:
                reason = stop_reason or "no turn"
                if forwards:
                    reason = f"even turn {forwards[0].turns[0].index} exceeds {max_tokens} tokens"
                if writes:
                    write_json_atomic(
                        skip_path(out, session.system_id, condition),
                        {"system_id": session.system_id, "condition": condition, "reason": reason},
                    )
                    log.warning("session %d (%s) skipped: %s", session.system_id, condition, reason)
                progress.update(1)
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
                progress.update(1)
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
            arrays = concat_forwards(
                [session_arrays(layout, results, layers, meta, args.store_dtype) for layout, results in measured]
            )
            save_npz_atomic(session_path(out, session.system_id, condition), arrays)
            append_lines(shard, [turn_row_json(row) for row in turn_shares(arrays)])
            progress.update(1, tokens=n_tokens)
            progress.postfix(tokens=n_tokens, s=f"{seconds:.1f}")
        paths = getattr(capture, "paths", None)
    if dist.rank == 0 and paths:
        manifest["capture_paths"] = {str(layer): str(name) for layer, name in sorted(paths.items())}
        write_json_atomic(out / "manifest.json", manifest)
    if tensor_parallel:
        end_process_group()


def _manifest_fields(
    args: argparse.Namespace,
    model: Any,
    tokenizer: Any,
    path: str,
    labels: dict[str, int],
    max_tokens: Any,
    dist: Distributed,
    plan: LoadPlan,
) -> dict[str, Any]:
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
            "lead": "tokens before the system text (BOS, role header; "
            "in control also a template's default system message)",
            "system": "tokens of the system text, located in the rendered chat template through tokenizer offsets",
        },
        "share": "head-mean attention share of the span (over all heads, also under tensor parallel); "
        "share_excl_lead = share / (1 - lead share)",
        "capture_method": "kernel-lse: the layer's output and every row's log-sum-exp from one attention kernel call, "
        "plus the log-sum-exp over the span's keys, share = exp(LSE_span - LSE_all); fallback (eager attention, or no "
        "kernel with LSE): the model's own call, and each row's log-sum-exp recomputed over all keys in chunks; "
        "capture_paths says which ran at each layer",
        "attn_logit_softcapping": None
        if not softcap
        else (
            f"{softcap:g} in the config, not applied: the capture runs transformers' SDPA attention "
            f"(the model was loaded with {implementation}), which ignores it; the shares describe that attention"
            if implementation != "eager"
            else f"{softcap:g}, applied by the model's eager attention and in the shares"
        ),
        "control": f"system text sent as user: system + {json.dumps(_joiner())} + user turn 1",
        "versions": package_versions(),
        "updated": utc_now(),
    }


def _joiner() -> str:
    return CONTROL_JOINER


def _sha256(text: Any) -> str | None:
    return hashlib.sha256(str(text).encode("utf-8")).hexdigest() if text else None
