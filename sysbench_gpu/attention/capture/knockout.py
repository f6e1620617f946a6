"""Knockout: how much each reply leans on the system text, by hiding its keys from every later query.

For one conversation (laid out as the capture lays it out, ``segments.fit_layout``) two
teacher-forced forwards run: the plain one, and one where the system span's keys are
masked from every query at or after the span's end at the chosen layers
(``modeling.key_bias`` with -inf). Per turn, the mean log-probability of the reply's
tokens in each, and ``delta = logp_knockout - logp_plain`` (negative: the reply needed
the system text). The control arm does the same with the system text where the control
places it (inside the first user message), so the two arms differ only in the role.

Rows go to ``knockout.jsonl`` (``files.knockout_rows``), one per session, turn and arm,
appended per session and arm; a rerun skips the pairs already there.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sysbench_gpu.attention.capture import layout as attn_layout
from sysbench_gpu.attention.capture.conversation import RunConversations
from sysbench_gpu.attention.capture.layers import num_layers
from sysbench_gpu.attention.capture.layout import LoadPlan, input_device
from sysbench_gpu.attention.capture.segments import ConversationLayout, fit_layout
from sysbench_gpu.attention.files.knockout_rows import ARMS, KNOCKOUT_FILE, KnockoutRow, done_pairs
from sysbench_gpu.attention.files.store import append_lines, read_manifest
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.progress import DEFAULT_LOG_EVERY, ProgressLog, quiet_library_bars
from sysbench_gpu.core.rundir import write_json_atomic
from sysbench_gpu.modeling.key_bias import PATH, key_bias
from sysbench_gpu.modeling.layer_bands import parse_layer_band

log = logging.getLogger(__name__)

SPANS = ("system",)


def reply_logps(model: Any, ids: Any, replies: Sequence[tuple[int, int]]) -> list[float | None]:
    """Mean log-probability of each reply span's tokens, each predicted from the tokens before it."""
    import torch

    with torch.inference_mode():
        logits = model(input_ids=ids, use_cache=False).logits[0]
    means: list[float | None] = []
    for start, end in replies:
        if end <= start or start < 1:
            means.append(None)
            continue
        rows = torch.log_softmax(logits[start - 1 : end - 1].float(), dim=-1)
        targets = ids[0, start:end].to(rows.device)
        means.append(float(rows.gather(1, targets[:, None]).mean()))
    return means


def knockout_layout(
    model: Any, bias: Any, layout: ConversationLayout, system_id: int, arm: str, offset: int, device: Any
) -> list[KnockoutRow]:
    """The rows of one forward: the plain and the knocked-out mean log p of every reply."""
    import torch

    ids = torch.tensor([layout.token_ids], device=device)
    bias.set_spans([])  # the hooked layers run their plain SDPA call
    plain = reply_logps(model, ids, layout.replies)
    bias.set_spans([layout.system])
    knocked = reply_logps(model, ids, layout.replies)
    bias.set_spans([])
    rows = []
    for turn, (start, end), before, after in zip(layout.turn_numbers, layout.replies, plain, knocked, strict=True):
        delta = None if before is None or after is None else after - before
        rows.append(KnockoutRow(system_id, int(turn), arm, (start + offset, end + offset), before, after, delta))
    return rows


def check_knockout_settings(out: Path, wanted: Mapping[str, Any]) -> None:
    """A rerun into a folder with knockout rows must ask for the same span and layers."""
    stored = read_manifest(out).get("knockout") if (out / "manifest.json").exists() else None
    if not stored or not (out / KNOCKOUT_FILE).exists():
        return
    for name in ("span", "layers_spec"):
        if stored.get(name) != wanted.get(name):
            raise SysbenchError(
                f"{out / 'manifest.json'}: field 'knockout.{name}' was {stored.get(name)!r}, this command asks for "
                f"{wanted.get(name)!r}; use a new --out"
            )


def run_knockout(
    args: Any,
    sessions: Sequence[Any],
    generations: Mapping[tuple[int, int], Any],
    replies: str,
    out: Path,
    plan: LoadPlan,
    conversations: RunConversations,
) -> None:
    """Both arms of every session not yet in ``knockout.jsonl``; the manifest's ``knockout`` section."""
    if plan.layout == "tensor-parallel":
        raise SysbenchError("--knockout does not run under --tensor-parallel; run it on one device or a device map")
    wanted = {"span": args.knockout, "layers_spec": args.knockout_layers}
    check_knockout_settings(out, wanted)
    done = done_pairs(out)
    todo = [(s, arm) for s in sessions for arm in ARMS if (s.system_id, arm) not in done]
    if not todo:
        return
    quiet_library_bars(force=getattr(args, "no_progress", False))
    model, tokenizer, _ = attn_layout.load_model(args.model, args.dtype, plan)
    n_layers = num_layers(model)
    layers = parse_layer_band(args.knockout_layers, n_layers)
    manifest = read_manifest(out) if (out / "manifest.json").exists() else {}
    manifest["knockout"] = {
        **wanted,
        "layers": layers,
        "arms": list(ARMS),
        "path": PATH,
        "cuda_path": "none yet: on CUDA too the dense additive mask runs (T×T per hooked layer)",
        "masked": "the system span's keys, from every query at or after the span's end, at the listed layers",
        "logp": "mean log-probability per reply token (teacher-forced); delta = logp_knockout - logp_plain",
    }
    write_json_atomic(out / "manifest.json", manifest)
    device = input_device(model)
    max_tokens = args.max_tokens or getattr(model.config.get_text_config(), "max_position_embeddings", None)
    progress = ProgressLog(
        "knockout",
        len(todo),
        "session",
        log_every=getattr(args, "log_every", DEFAULT_LOG_EVERY),
        enabled=not getattr(args, "no_progress", False),
    )
    with progress, key_bias(model, layers, float("-inf")) as bias:
        for session, arm in todo:
            forwards, _ = conversations.forwards(session, replies, generations)
            rows: list[KnockoutRow] = []
            offset = 0
            for forward in forwards:
                layout = fit_layout(tokenizer, forward.system_prompt, forward.turns, arm, max_tokens, forward.prefix)
                if layout is None:
                    continue
                rows += knockout_layout(model, bias, layout, session.system_id, arm, offset, device)
                offset += layout.n_tokens
            if rows:
                append_lines(out / KNOCKOUT_FILE, [row.to_json() for row in rows])
            else:
                log.warning("session %d (%s): no turn fits; no knockout rows", session.system_id, arm)
            progress.update(1)
