"""JSON-schema-constrained decoding for the transformers engine, through xgrammar.

vLLM constrains a judge's reply with xgrammar; this module gives ``model.generate`` the
same: ``SchemaGrammars`` (one per engine) compiles each JSON schema once for the engine's
tokenizer and vocabulary, and ``SchemaLogitsProcessor`` (one per ``generate`` call) keeps
a ``GrammarMatcher`` per batch row and masks every token the schema does not allow.

The grammar is compact JSON (``any_whitespace=False``: ``", "`` and ``": "`` between
items, no newlines), so a small model cannot spend its tokens on whitespace between keys.
Compact JSON holds no raw control character anywhere, so tokens with one are never
allowed: xgrammar's grammar for a string with ``maxLength`` (the judges' reasoning) admits
raw U+0000-U+001F, which JSON forbids and ``json.loads`` rejects (mlc-ai/xgrammar#800, open
for 0.2.8). Nor are the tokenizer's special tokens, which xgrammar reads as their literal
text but decoding drops. A row whose matcher has accepted a stop token, or that ended
otherwise (transformers then feeds pad tokens to it), is allowed only its stop and pad
tokens from then on.

xgrammar and torch are imported when a schema is first used, never at module import.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import re
from collections.abc import Iterable
from typing import Any

from sysbench_gpu.core.errors import SysbenchError

log = logging.getLogger(__name__)

INSTALL_HINT = "the hf engine's JSON-schema decoding needs xgrammar: pip install xgrammar"
_CONTROL_BYTE = re.compile(rb"[\x00-\x1f]")


def xgrammar_version() -> str | None:
    """The installed xgrammar's version (read from its metadata: nothing is imported), or None."""
    try:
        return importlib.metadata.version("xgrammar")
    except importlib.metadata.PackageNotFoundError:
        return None


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError:
        raise SysbenchError(INSTALL_HINT) from None
    return xgrammar


class SchemaGrammars:
    """The compiled JSON-schema grammars of one engine (its tokenizer, its logits width).

    ``vocab_size`` is the model's (``config.vocab_size``, the width of its logits), which
    may exceed the tokenizer's vocabulary. ``stop_token_ids`` end a reply (the engine's
    eos ids); ``pad_token_id`` is what transformers feeds to finished rows.
    """

    def __init__(
        self, tokenizer: Any, vocab_size: int, stop_token_ids: Iterable[int], pad_token_id: int | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size)
        self.stop_token_ids = sorted({int(t) for t in stop_token_ids})
        finished = set(self.stop_token_ids)
        if pad_token_id is not None:
            finished.add(int(pad_token_id))
        self.finished_ids = sorted(t for t in finished if t < self.vocab_size)
        self.banned_ids: list[int] = []  # never allowed in a live row: known once the compiler is built
        self._compiler: Any = None
        self._compiled: dict[str, Any] = {}

    @property
    def backend(self) -> str | None:
        """What the engine's manifest records: ``"xgrammar 0.2.8"`` (None: not installed)."""
        version = xgrammar_version()
        return None if version is None else f"xgrammar {version}"

    def compiled(self, schema: dict[str, Any]) -> Any:
        """The grammar of ``schema``, compiled once per engine (the key keeps the schema's property order)."""
        key = json.dumps(schema, ensure_ascii=False)
        grammar = self._compiled.get(key)
        if grammar is None:
            if not self.stop_token_ids:
                raise SysbenchError("hf engine: JSON-schema decoding needs an end-of-sequence token id")
            xgr = _xgrammar()
            if self._compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
                )
                self._compiler = xgr.GrammarCompiler(info)
                self.banned_ids = self._banned(info.decoded_vocab)
            try:
                grammar = self._compiler.compile_json_schema(key, any_whitespace=False, strict_mode=True)
            except Exception as error:  # noqa: BLE001 (xgrammar raises RuntimeError and its own kinds)
                raise SysbenchError(f"hf engine: xgrammar cannot compile the JSON schema: {error}") from None
            self._compiled[key] = grammar
        return grammar

    def _banned(self, decoded_vocab: list[bytes]) -> list[int]:
        """Tokens holding a raw control character, and special tokens other than the stop tokens."""
        banned = {token for token, piece in enumerate(decoded_vocab) if _CONTROL_BYTE.search(piece)}
        # xgrammar reads a special token (<|im_start|>) as its literal text, which decoding then drops.
        banned.update(int(t) for t in getattr(self.tokenizer, "all_special_ids", None) or [])
        return sorted(t for t in banned - set(self.stop_token_ids) if t < self.vocab_size)

    def processor(self, schema: dict[str, Any]) -> SchemaLogitsProcessor:
        """A fresh logits processor for one ``generate`` call (its matchers hold that call's state)."""
        return SchemaLogitsProcessor(
            self.compiled(schema),
            vocab_size=self.vocab_size,
            stop_token_ids=self.stop_token_ids,
            finished_ids=self.finished_ids,
            banned_ids=self.banned_ids,
        )


class SchemaLogitsProcessor:
    """A transformers logits processor (``__call__(input_ids, scores) -> scores``) for one batch.

    The first call sees the prompts and records their (padded) width; each later call
    accepts the tokens that arrived since into each row's matcher, then masks every token
    the row's grammar does not allow. A row is finished once its matcher terminated, it
    emitted a stop token, or the grammar refused its token (counted in ``rejected``; only
    a processor placed before this one could cause it): it is then allowed its stop and
    pad tokens only, so sampling never sees a row with nothing allowed.
    """

    def __init__(
        self,
        compiled: Any,
        *,
        vocab_size: int,
        stop_token_ids: Iterable[int],
        finished_ids: Iterable[int],
        banned_ids: Iterable[int] = (),
    ) -> None:
        self.compiled = compiled
        self.vocab_size = vocab_size
        self.stop_token_ids = frozenset(stop_token_ids)
        self.finished_ids = list(finished_ids)
        self.banned_ids = list(banned_ids)
        self.matchers: list[Any] = []
        self.finished: list[bool] = []
        self.rejected = 0
        self._width = 0
        self._bitmask: Any = None

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        xgr = _xgrammar()
        rows, width = int(input_ids.shape[0]), int(input_ids.shape[1])
        if not self.matchers:
            self.matchers = [xgr.GrammarMatcher(self.compiled) for _ in range(rows)]
            self.finished = [False] * rows
            self._bitmask = xgr.allocate_token_bitmask(rows, self.vocab_size)
        elif rows != len(self.matchers):
            raise SysbenchError(f"hf engine: a schema processor built for {len(self.matchers)} rows got {rows}")
        else:
            for row, tokens in enumerate(input_ids[:, self._width :].tolist()):
                for token in tokens:
                    self._accept(row, int(token))
        self._width = width
        live = [row for row in range(rows) if not self.finished[row]]
        for row in live:
            self.matchers[row].fill_next_token_bitmask(self._bitmask, row)
        return self._mask(scores, live)

    def _accept(self, row: int, token: int) -> None:
        if self.finished[row]:
            return  # transformers feeds pad (or eos) to rows that are done
        matcher = self.matchers[row]
        if not matcher.accept_token(token):
            self.finished[row] = True
            if token not in self.stop_token_ids:
                self.rejected += 1
                log.warning("hf engine: the JSON-schema grammar refused token %d in batch row %d", token, row)
            return
        if token in self.stop_token_ids or matcher.is_terminated():
            self.finished[row] = True

    def _mask(self, scores: Any, live: list[int]) -> Any:
        xgr = _xgrammar()
        device = scores.device
        # xgrammar applies a bitmask on the CPU or on CUDA; other devices go through the CPU.
        work = scores if device.type in ("cpu", "cuda") else scores.to("cpu")
        width = int(work.shape[-1])
        covered = min(width, self.vocab_size)
        if live:
            xgr.apply_token_bitmask_inplace(work, self._bitmask.to(work.device), vocab_size=covered, indices=live)
            if width > covered:  # logits wider than the grammar's vocabulary: never those ids
                work[live, covered:] = float("-inf")
            if self.banned_ids:
                work[[[row] for row in live], [self.banned_ids]] = float("-inf")
        done = [row for row in range(len(self.finished)) if self.finished[row]]
        if done:  # stop and pad only, and never a row with nothing allowed (sampling would fail)
            work[done] = float("-inf")
            work[[[row] for row in done], [self.finished_ids]] = 0.0
        return work if work is scores else work.to(device)
