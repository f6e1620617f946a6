"""The ``attention`` stage: the system message's share of attention for every token of every session.

For each session one teacher-forced forward runs over the whole final conversation
(system + user turns + replies from the run's ``generations.jsonl`` or the reference
replies), built as generation built it (``capture.conversation``: distractor exchanges in
front, MT-Eval context turns with their given replies, one forward per turn for
single-turn runs); ``capture.hooks.AttentionShareCapture`` measures at the selected layers the
share of attention that every token gives to the system text and to the template's
leading tokens. With ``--control`` the same conversation is also run with the system
text sent as user (joined to the first user message). With ``--knockout system`` rank 0
then runs ``capture.knockout`` on every session, in both arms (``knockout.jsonl``).

Output directory::

    OUT/
      manifest.json            how the numbers were made (model, layers, chunking, spans, versions)
      sessions/<id>.<condition>.npz   per session: token ids, per-token shares per layer, boundaries, meta
      sessions/<id>.<condition>.skipped.json   a session that could not be measured (and why)
      shards/rank<r>-of-<w>.jsonl      per-turn rows written by each rank as it goes
      turn_shares.jsonl        merged per-turn table (rank 0, at the end)
      analysis.json            correlation with verdicts, system-vs-user comparison, summaries
      knockout.jsonl           --knockout: per session, turn and arm, the reply's mean log p plain and knocked out
      knockout_summary.json    --knockout: mean Δ per arm (session-bootstrap CI), by turn, by verdict
      figures/                 token_shares_<id>_<layer>.png/pdf, turn_means_<layer>.png/pdf

Resume is per session and condition: an existing ``.npz`` (written atomically) is
skipped. Under ``torchrun`` (RANK/WORLD_SIZE in the environment) each rank takes every
WORLD_SIZE-th session and rank 0 waits for the others' done markers and merges; with
``--tensor-parallel`` the ranks instead split every layer's heads, run every session
together, and only rank 0 writes (``capture.layout``). Files: ``files``; measuring:
``capture.measure``; merge, analysis and figures: ``analysis.report``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from sysbench_gpu.attention.analysis.knockout_report import finish_knockout
from sysbench_gpu.attention.analysis.report import draw_figures, finish, print_summary
from sysbench_gpu.attention.capture.conversation import RunConversations, conversation_turns
from sysbench_gpu.attention.capture.knockout import check_knockout_settings, run_knockout
from sysbench_gpu.attention.capture.layers import resolve_layers
from sysbench_gpu.attention.capture.layout import (
    TORCH_DTYPES,
    Distributed,
    LoadPlan,
    check_tensor_parallel_heads,
    end_process_group,
    mark_done,
    plan_load,
    wait_for_ranks,
)
from sysbench_gpu.attention.capture.measure import SPAN_NAMES, STAGE, measure_sessions, session_arrays
from sysbench_gpu.attention.files.store import (
    check_attention_out,
    check_settings,
    load_session,
    read_manifest,
    session_path,
    skip_path,
)
from sysbench_gpu.attention.files.turn_table import merge_turn_table
from sysbench_gpu.benchmarks.registry import load_run_sessions
from sysbench_gpu.core.arguments import check_finite, check_integer, check_out_folder, parse_layer_spec
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.locks import stage_lock
from sysbench_gpu.core.progress import add_progress_flags
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.core.sessions import parse_session_ids, select_sessions
from sysbench_gpu.engines.model_depth import config_depth
from sysbench_gpu.engines.models import resolve_model

# Names other modules and tests import from here (the stage's former contents, now in its parts).
__all__ = [
    "SPAN_NAMES",
    "STAGE",
    "cmd_attention",
    "cmd_attention_plot",
    "conversation_turns",
    "draw_figures",
    "finish",
    "load_session",
    "measure_sessions",
    "merge_turn_table",
    "print_summary",
    "read_manifest",
    "register",
    "session_arrays",
    "session_path",
]

log = logging.getLogger(__name__)


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
    parser.add_argument(
        "--layers", default="mid,last", help="mid, last, all or layer numbers, comma-separated (default mid,last)"
    )
    parser.add_argument("--sessions", help="system ids, e.g. 1,2,10-20 (default: all sessions of the run)")
    parser.add_argument("--limit", type=int, help="only the first N selected sessions")
    parser.add_argument("--control", action="store_true", help="also run the system text as a user message")
    parser.add_argument(
        "--replies",
        choices=("auto", "generations", "reference"),
        default="auto",
        help="assistant replies to teacher-force: the run's generations or the reference replies "
        "(auto: generations if any)",
    )
    parser.add_argument("--chunk-tokens", type=int, help="query and key chunk length (default: sized from --chunk-mib)")
    parser.add_argument(
        "--chunk-mib", type=int, default=256, help="memory budget for the score blocks of one layer (MiB)"
    )
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    parser.add_argument(
        "--device", default="auto", help="auto (cuda:LOCAL_RANK if available, else cpu), cpu, cuda, cuda:N"
    )
    parser.add_argument("--device-map", help="e.g. auto: spread a large model over all visible GPUs in this process")
    parser.add_argument(
        "--tensor-parallel",
        action="store_true",
        help="under torchrun: split every layer's heads over the ranks (transformers' tp_plan); "
        "every rank runs every session",
    )
    parser.add_argument(
        "--knockout",
        choices=("system",),
        help="also measure causal reliance: each reply's mean log p with the span's keys masked from later queries, "
        "beside the plain forward, in both arms (implies --control); writes knockout.jsonl",
    )
    parser.add_argument(
        "--knockout-layers",
        default="mid-band",
        help="layers where --knockout masks: mid-band (the middle third), all, N or N-M (inclusive), comma-separated",
    )
    parser.add_argument("--per-head", action="store_true", help="also store per-head shares")
    parser.add_argument(
        "--store-dtype", choices=("float16", "float32"), default="float32", help="dtype of stored shares"
    )
    parser.add_argument(
        "--max-tokens", type=int, help="longest conversation; later turns are dropped to fit (default: model context)"
    )
    parser.add_argument("--no-figures", action="store_true", help="do not draw figures")
    parser.add_argument("--figure-session", type=int, help="session for the per-token figure (default: the first one)")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap replicates for confidence intervals")
    parser.add_argument("--wait-timeout", type=float, default=86400.0, help="rank 0: seconds to wait for other ranks")
    add_progress_flags(parser)
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


def cmd_attention(args: argparse.Namespace) -> int:
    run = RunDir(args.run_dir).require()
    sessions = load_run_sessions(run)
    sessions = select_sessions(sessions, parse_session_ids(args.sessions), args.limit, source=run.sessions_path)
    generations = run.generations.read()
    replies = args.replies
    if replies == "auto":
        replies = "generations" if generations else "reference"
    if replies == "generations" and not generations:
        raise SysbenchError(f"{run.generations.path}: no generations (use --replies reference)")
    knockout = getattr(args, "knockout", None)
    # Knockout has a control arm, and its reply spans point into the capture's arrays of both arms.
    conditions = ("system", "control") if args.control or knockout else ("system",)
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
    check_attention_args(args, run, sessions, out, dist, plan, settings)
    # One writer per output directory: each process that writes holds its lock for the whole stage.
    # Data-parallel ranks each write their own files (one lock per rank); under tensor parallel only rank 0 writes.
    writes = plan.splits_sessions or dist.rank == 0
    with stage_lock(out, STAGE if dist.world == 1 else f"{STAGE}.{dist.tag}", enabled=writes):
        return _measure_and_finish(
            args, run, sessions, generations, replies, conditions, out, dist, plan, settings, conversations
        )


def check_attention_args(
    args: argparse.Namespace,
    run: RunDir,
    sessions: list[Any],
    out: Path,
    dist: Distributed,
    plan: LoadPlan,
    settings: dict[str, Any],
) -> None:
    """Every flag, --out and an earlier output's settings, checked before --out is made or the model loads.

    Layer numbers are checked against the model's config (no weights): ``5-2`` is empty, ``99`` out of range.
    """
    check_integer(args.chunk_tokens, "--chunk-tokens", 1)
    check_integer(args.chunk_mib, "--chunk-mib", 1)
    check_finite(args.wait_timeout, "--wait-timeout", positive=True)
    if args.dtype != "auto" and args.dtype not in TORCH_DTYPES:  # the load's own check, which runs after the manifest
        raise SysbenchError(f"--dtype: unknown dtype {args.dtype!r} (auto, float32, bfloat16, float16)")
    knockout = getattr(args, "knockout", None)
    if knockout:
        parse_layer_spec(args.knockout_layers, None, "--knockout-layers")
        if plan.layout == "tensor-parallel":
            raise SysbenchError("--knockout does not run under --tensor-parallel; run it on one device or a device map")
    check_attention_out(out, run.path, alone=dist.world == 1)
    if plan.layout == "tensor-parallel":
        check_model_splits(args.model, dist.world)
    if (out / "manifest.json").exists():
        check_settings(out, settings, write=False)  # a refused rerun stores nothing
        if knockout:
            check_knockout_settings(out, {"span": knockout, "layers_spec": args.knockout_layers})
    if args.figure_session is not None and not args.no_figures:
        measured = {session.system_id for session in sessions}
        if args.figure_session not in measured and not session_path(out, args.figure_session, "system").exists():
            raise SysbenchError(f"--figure-session {args.figure_session}: not among the sessions this command measures")
    n_layers = config_depth(args.model).n_layers
    if n_layers is not None:
        resolve_layers(args.layers, n_layers)
        if knockout:
            parse_layer_spec(args.knockout_layers, n_layers, "--knockout-layers")


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
    if plan.layout == "tensor-parallel":
        check_model_splits(args.model, dist.world)  # a user error is one line before any process group is joined
        # Ranks may see the output folder differently (a shared file system's lag): rank 0's list decides, before
        # the `if todo` below, because the model load and every forward inside it are collectives.
        todo = agree_on_todo(todo, dist)
    log.info("%s: %d of %d session runs to do (%d already done)", dist.tag, len(todo), len(runs), len(runs) - len(todo))
    if todo:
        measure_sessions(args, runs, todo, generations, replies, out, dist, plan, settings, conversations)
    elif plan.layout == "tensor-parallel":
        end_process_group()  # measure_sessions ends it otherwise
    if plan.splits_sessions:
        mark_done(out, dist)
    if dist.rank != 0:
        return 0
    if plan.splits_sessions:
        wait_for_ranks(out, dist, args.wait_timeout)
    if getattr(args, "knockout", None):
        run_knockout(args, sessions, generations, replies, out, plan, conversations)
    finish(out, run, args)
    finish_knockout(out, run, args.bootstrap, figures=not args.no_figures)
    return 0


def check_model_splits(model: str, world: int) -> None:
    """The heads check of the tensor-parallel load, from the config alone (the load repeats it)."""
    from transformers import AutoConfig

    path = resolve_model(model)
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception:  # noqa: BLE001 (an unreadable model: the load reports it, as one line)
        return
    check_tensor_parallel_heads(config, world, model)


def agree_on_todo(todo: list[int], dist: Distributed) -> list[int]:
    """Rank 0's to-do list on every rank (torchrun's environment; starts the process group if none is).

    The group is started as transformers' tensor-parallel load would start it (NCCL on CUDA, else
    gloo), so the load then reuses it; the list itself travels over a gloo group, on the CPU.
    """
    import torch.distributed as torch_dist

    if not torch_dist.is_initialized():
        _init_process_group(dist)
    group = torch_dist.new_group(backend="gloo")
    box: list[Any] = [list(todo) if dist.rank == 0 else None]
    torch_dist.broadcast_object_list(box, src=0, group=group)
    torch_dist.destroy_process_group(group)
    return [int(index) for index in box[0]]


def _init_process_group(dist: Distributed) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as torch_dist

    if torch.cuda.is_available():
        torch.cuda.set_device(dist.local_rank)
        device = torch.device("cuda", dist.local_rank)
        backend, device_id = "nccl", device
    else:
        backend, device_id = "gloo", None
    # Loading a sharded model can keep ranks apart for long; transformers waits two hours too.
    torch_dist.init_process_group(
        backend=backend, rank=dist.rank, world_size=dist.world, device_id=device_id, timeout=timedelta(hours=2)
    )


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


FIGURE_STEMS = ("turn_means_", "token_shares_")


def _holds_only_figures(folder: Path) -> bool:
    """An earlier ``attention-plot --out``: nothing in it but the figures it draws."""
    return all(entry.is_file() and entry.name.startswith(FIGURE_STEMS) for entry in folder.iterdir())


def cmd_attention_plot(args: argparse.Namespace) -> int:
    dirs = [Path(d) for d in args.dirs]
    names = [n.strip() for n in args.names.split(",")] if args.names else None
    if names and len(names) != len(dirs):
        raise SysbenchError(f"--names gives {len(names)} names for {len(dirs)} directories")
    for directory in dirs:
        read_manifest(directory)  # a folder that is not an attention output: one line before any figure
    # A figure folder inside an attention folder is fine (ATT/figures); the attention folder itself is not.
    check_out_folder(args.out, inputs=dirs, inside_inputs=True, is_own=_holds_only_figures, kind="figure folder")
    if args.session is not None and not any(
        session_path(dirs[0], args.session, condition).exists() for condition in ("system", "control")
    ):
        raise SysbenchError(f"--session {args.session}: not measured in {dirs[0]}")
    written = draw_figures(dirs, Path(args.out), names, args.session, layer_label=args.layer)
    for path in written:
        print(path)
    return 0
