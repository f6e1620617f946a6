"""Token-level attention for the explorer: stored shares as text pieces and quantized values.

An attention output directory (``sysbench-gpu attention --out``) stores, per session
and arm (``system``, ``control``), the token ids and the per-token shares at the
captured layers. Its sessions are those of the run it measured (its manifest's
``run_dir``), keyed like the site's (``data.key_text``). For the site each arm becomes

- ``text``: the conversation decoded from the token ids with the model's tokenizer, and
  ``lengths``: how many UTF-16 code units of ``text`` each token owns (JavaScript string
  units), so the page can cut the text into tokens without splitting a character;
- ``values[layer label]``: ``share`` and ``excl`` (share with the template's leading
  tokens excluded) per token, quantized to uint8 (``round(255 * value)``, resolution
  1/255) and base64-encoded;
- ``turn_means[layer label]``: the per-turn means from ``attention.files.turn_table.turn_shares``,
  computed at full precision before quantization;
- per source, ``knockout[arm][turn]``: Δ mean log p of the reply with the system text's keys
  hidden, and both log p (``knockout.jsonl``, where ``attention --knockout`` ran).

Token pieces: the ids are decoded once and re-encoded with offsets; when that
reproduces the ids (it does for the rendered chat templates the attention stage
tokenized), each token owns the text from its offset to the next token's. Otherwise
the pieces come from incremental decoding (a token that ends inside a multi-byte
character owns nothing; the next one owns the whole character).
"""

from __future__ import annotations

import base64
import json
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sysbench_gpu.attention.files.knockout_rows import read_knockout
from sysbench_gpu.attention.files.store import load_session, read_manifest
from sysbench_gpu.attention.files.turn_table import token_series, turn_shares
from sysbench_gpu.benchmarks.registry import load_run_sessions
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.engines.models import resolve_model
from sysbench_gpu.explore.data import keys_of

log = logging.getLogger(__name__)

ARMS = ("system", "control")
QUANT_LEVELS = 255


@dataclass(frozen=True)
class AttentionSource:
    """One attention output directory and the sessions it measured."""

    path: Path
    name: str
    model: str | None
    tokenizer_path: str
    layer_labels: dict[str, int]  # label -> layer index, e.g. {"mid": 15, "last": 29}
    run_label: str | None  # the explored run whose replies it measured, when it is one of them
    files: dict[str, dict[str, Path]]  # session key (``<benchmark>-<system_id>``) -> arm -> .npz
    skipped: dict[str, dict[str, str]]  # session key -> arm -> reason

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": str(self.path.resolve()),
            "model": self.model,
            "tokenizer": self.tokenizer_path,
            "layers": [{"label": label, "index": index} for label, index in self.layer_labels.items()],
            "run": self.run_label,
        }


def _session_files(folder: Path, pattern: str, keys: Mapping[int, str]) -> dict[str, dict[str, Path]]:
    """Files by session key; a session the keys do not know is kept under ``?-<system_id>`` (left out later)."""
    found: dict[str, dict[str, Path]] = {}
    for path in sorted(folder.glob(pattern)):
        parts = path.name.split(".")
        try:
            system_id = int(parts[0])
        except ValueError:
            continue
        if parts[1] in ARMS:
            found.setdefault(keys.get(system_id, f"?-{system_id}"), {})[parts[1]] = path
    return found


def _measured_keys(run_dir: str | None, explored: Mapping[Path, tuple[str, Mapping[int, str]]]) -> Mapping[int, str]:
    """The site keys of the sessions of the run an attention directory measured, by system_id.

    An explored run's; else read from the run directory; else (no such run) the explored
    sessions whose system_id no other explored session has.
    """
    if run_dir and Path(run_dir).resolve() in explored:
        return explored[Path(run_dir).resolve()][1]
    if run_dir and Path(run_dir).is_dir():
        try:
            return keys_of(load_run_sessions(RunDir(run_dir)))
        except SysbenchError:
            pass
    counts = Counter(system_id for _, keys in explored.values() for system_id in set(keys))
    return {
        system_id: key for _, keys in explored.values() for system_id, key in keys.items() if counts[system_id] == 1
    }


def load_source(path: str | Path, runs_by_path: Mapping[Path, tuple[str, Mapping[int, str]]]) -> AttentionSource:
    """Read an attention directory's manifest and list its session files.

    ``runs_by_path``: the explored runs' label and site keys by system_id, by resolved directory.
    """
    folder = Path(path)
    manifest = read_manifest(folder)
    model = manifest.get("model")
    tokenizer_path = manifest.get("model_path")
    if not tokenizer_path or not Path(tokenizer_path).exists():
        if not model:
            raise SysbenchError(f"{folder / 'manifest.json'}: field 'model' is missing; cannot find the tokenizer")
        tokenizer_path = resolve_model(str(model))
    labels = manifest.get("layer_labels") or {}
    if not isinstance(labels, dict) or not labels:
        raise SysbenchError(f"{folder / 'manifest.json'}: field 'layer_labels' is missing (no session was measured)")
    run_dir = manifest.get("run_dir")
    explored = runs_by_path.get(Path(run_dir).resolve()) if run_dir else None
    run_label = explored[0] if explored else None
    keys = _measured_keys(run_dir, runs_by_path)
    model_name = Path(str(model)).name if model else folder.name
    name = f"{run_label} · {model_name}" if run_label else f"{folder.resolve().name} · {model_name}"
    skipped: dict[str, dict[str, str]] = {}
    for key, arms in _session_files(folder / "sessions", "*.skipped.json", keys).items():
        for arm, skip in arms.items():
            try:
                reason = json.loads(skip.read_text(encoding="utf-8")).get("reason")
            except (OSError, json.JSONDecodeError, AttributeError):
                reason = None
            skipped.setdefault(key, {})[arm] = str(reason or "skipped")
    return AttentionSource(
        path=folder,
        name=name,
        model=str(model) if model else None,
        tokenizer_path=str(tokenizer_path),
        layer_labels={str(k): int(v) for k, v in labels.items()},
        run_label=run_label,
        files=_session_files(folder / "sessions", "*.npz", keys),
        skipped=skipped,
    )


# ---------------------------------------------------------------- token text


class TokenText:
    """Decodes token ids to text pieces with one tokenizer (loaded lazily, once)."""

    def __init__(self, tokenizer_path: str) -> None:
        self.tokenizer_path = tokenizer_path
        self._tokenizer: Any = None

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            try:
                from transformers import AutoTokenizer
            except ImportError:
                raise SysbenchError("explore --attention needs transformers (pip install 'sysbench-gpu[hf]')") from None
            try:
                self._tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
            except (OSError, ValueError) as error:
                first = (str(error).strip().splitlines() or [type(error).__name__])[0]
                raise SysbenchError(
                    f"could not load the tokenizer from {self.tokenizer_path} (the attention manifest's model_path "
                    f"or model): {first}"
                ) from None
        return self._tokenizer

    def load(self) -> Any:
        return self.tokenizer

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The text of each token; their concatenation is the decoded conversation."""
        ids = [int(i) for i in ids]
        if not ids:
            return []
        text = self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        pieces = self._pieces_from_offsets(ids, text)
        return pieces if pieces is not None else self.incremental_pieces(ids)

    def _pieces_from_offsets(self, ids: list[int], text: str) -> list[str] | None:
        try:
            encoding = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        except (NotImplementedError, ValueError, TypeError):  # slow tokenizers have no offsets
            return None
        if list(encoding["input_ids"]) != ids:
            return None
        starts = [int(start) for start, _ in encoding["offset_mapping"]]
        if any(b < a for a, b in zip(starts, starts[1:], strict=False)):
            return None
        starts[0] = 0
        bounds = starts + [len(text)]
        return [text[bounds[i] : bounds[i + 1]] for i in range(len(ids))]

    def incremental_pieces(self, ids: Sequence[int]) -> list[str]:
        """Pieces by decoding short windows, as streaming detokenizers do (linear in the length)."""
        decode = self.tokenizer.decode
        pieces: list[str] = []
        prefix, read = 0, 0  # ids[prefix:read] is context already emitted
        for position in range(len(ids)):
            before = decode(ids[prefix:read], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            after = decode(ids[prefix : position + 1], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            if len(after) > len(before) and not after.endswith("\ufffd"):
                pieces.append(after[len(before) :])
                prefix, read = read, position + 1
            else:
                pieces.append("")  # ends inside a character: the next token carries it
        return pieces


def utf16_length(text: str) -> int:
    """Length in JavaScript string units (characters beyond the BMP count twice)."""
    return len(text.encode("utf-16-le")) // 2


# ---------------------------------------------------------------- values


def quantize(values: np.ndarray) -> str:
    """Values in [0, 1] as base64 of uint8 levels round(255 * v)."""
    levels = np.clip(np.rint(np.asarray(values, dtype=np.float64) * QUANT_LEVELS), 0, QUANT_LEVELS).astype(np.uint8)
    return base64.b64encode(levels.tobytes()).decode("ascii")


def dequantize(encoded: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(encoded), dtype=np.uint8).astype(np.float64) / QUANT_LEVELS


def _pairs(array: Any) -> list[list[int]]:
    return [[int(a), int(b)] for a, b in np.asarray(array).reshape(-1, 2)]


def arm_record(stored: Mapping[str, Any], source: AttentionSource, text: TokenText) -> dict[str, Any]:
    """One arm of one session for the page: text pieces, quantized per-token values, spans, turn means."""
    meta = json.loads(str(stored["meta"]))
    ids = np.asarray(stored["token_ids"]).tolist()
    pieces = text.pieces(ids)
    layers = [int(x) for x in stored["layers"]]
    label_of = {index: label for label, index in source.layer_labels.items()}
    values: dict[str, dict[str, str]] = {}
    for position, layer in enumerate(layers):
        share, excl = token_series(np.asarray(stored["shares"][position]))
        values[label_of.get(layer, f"layer{layer}")] = {"share": quantize(share), "excl": quantize(excl)}
    means: dict[str, list[dict[str, Any]]] = {}
    for row in turn_shares(stored):
        means.setdefault(label_of.get(row.layer, row.layer_label), []).append(
            {
                "turn": row.turn,
                "share": _round(row.share),
                "excl": _round(row.share_excl_lead),
                "reply_share": _round(row.reply_share),
                "reply_excl": _round(row.reply_share_excl_lead),
            }
        )
    spans = np.asarray(stored["spans"]) if "spans" in stored else None
    lead_end = int(spans[0][1]) if spans is not None else int(np.asarray(stored["system"])[0])
    return {
        "text": "".join(pieces),
        "lengths": [utf16_length(piece) for piece in pieces],
        "lead_end": lead_end,
        "system": [int(x) for x in np.asarray(stored["system"])],
        "users": _pairs(stored["users"]),
        "replies": _pairs(stored["replies"]),
        "turns": _pairs(stored["turns"]),
        "turn_numbers": [int(x) for x in stored["turn_numbers"]],
        "values": values,
        "turn_means": means,
        "stopped": meta.get("stopped"),
        "turns_dropped_for_length": meta.get("turns_dropped_for_length"),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 5)


def session_attention(
    key: str, system_id: int, sources: Sequence[AttentionSource], texts: Mapping[str, TokenText]
) -> dict[str, Any] | None:
    """The attention file of one session (``key``, as :func:`~sysbench_gpu.explore.data.key_text`): every
    source that measured it, both arms where present."""
    entries = []
    for number, source in enumerate(sources):
        files = source.files.get(key, {})
        skipped = source.skipped.get(key, {})
        if not files and not skipped:
            continue
        arms = {}
        for arm in ARMS:
            if arm in files:
                try:
                    arms[arm] = arm_record(load_session(files[arm]), source, texts[source.tokenizer_path])
                except (KeyError, ValueError) as error:
                    raise SysbenchError(
                        f"{files[arm]}: session {system_id}, arm {arm}: not a session file of the "
                        f"attention stage ({error})"
                    ) from None
        entry = {"source": number, "arms": arms, "skipped": skipped}
        knockout = knockout_by_turn(source.path, system_id)
        if knockout:
            entry["knockout"] = knockout
        entries.append(entry)
    if not entries:
        return None
    return {"key": key, "id": system_id, "sources": entries}


def knockout_by_turn(folder: Path, system_id: int) -> dict[str, dict[str, dict[str, float | None]]]:
    """The session's ``knockout.jsonl`` rows as arm -> turn -> Δ and both mean log p (empty without knockout)."""
    found: dict[str, dict[str, dict[str, float | None]]] = {}
    for row in read_knockout(folder):
        if row.system_id == system_id:
            found.setdefault(row.arm, {})[str(row.turn)] = {
                "delta": _round(row.delta),
                "logp_plain": _round(row.logp_plain),
                "logp_knockout": _round(row.logp_knockout),
            }
    return found


def arms_by_session(sources: Sequence[AttentionSource]) -> dict[str, list[str]]:
    """For the index: which arms some source measured for each session (by session key)."""
    found: dict[str, set[str]] = {}
    for source in sources:
        for key, files in source.files.items():
            found.setdefault(key, set()).update(files)
    return {key: [arm for arm in ARMS if arm in arms] for key, arms in found.items()}
