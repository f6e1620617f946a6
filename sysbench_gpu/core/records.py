"""The records of a run directory: one generation and one judgment per (session, turn), with strict readers."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sysbench_gpu.core.jsonio import json_type

MIN_SCORE, MAX_SCORE = 0.0, 10.0
_INT, _STR, _DICT = (int,), (str,), (dict,)

Key = tuple[int, int]  # (system_id, turn)


@dataclass
class GenerationRecord:
    """A model's reply to one user turn.

    ``response`` is None only when the turn was not generated (``status`` says why,
    e.g. ``skipped`` on over-length). ``history`` is how earlier turns were shown:
    ``model`` (its own replies), ``reference`` (reference replies), ``single-turn``
    (no earlier turns: the SysBench ablation) or ``upstream`` (imported from a published
    workbook).
    """

    system_id: int
    turn: int
    user: str
    response: str | None
    history: str = "model"
    status: str = "ok"  # ok | skipped
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    finish_reason: str | None = None
    overflow: str | None = None  # None | "truncated-history:<turns dropped>" | "skipped"
    model: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> Key:
        return (self.system_id, self.turn)


VERDICT_VALUES = ("yes", "no", "other")


@dataclass
class Verdict:
    """The judge's verdict on one constraint: the raw string and its normalized value."""

    raw: str
    value: str  # yes | no | other
    type: str  # constraint type, English


@dataclass
class JudgmentRecord:
    """The verifier's verdicts for one (session, turn), keyed by checklist id (as str).

    ``parse_status`` is ``ok`` when the judge's reply parsed and its keys equal the
    checklist numbers, ``unparsed`` when every retry failed (then ``verdicts`` is
    empty and ``raw_reply`` keeps the last reply), ``imported`` for verdicts read
    from a published workbook.

    MT-Eval turns carry a ``score`` instead of verdicts: 1-10 from the LLM judge
    (``scorer`` ``judge``), 0 or 10 from a rule (``cls``, ``ifeval``). Both fields are
    written only when set, so SysBench records keep their exact format.
    """

    OMITTED_WHEN_NULL: ClassVar[tuple[str, ...]] = ("score", "scorer")

    system_id: int
    turn: int
    verdicts: dict[str, Verdict]
    parse_status: str = "ok"  # ok | unparsed | imported
    reasoning: str | None = None
    judge_model: str | None = None
    template_hash: str | None = None
    raw_reply: str | None = None
    attempts: int = 1
    extra: dict[str, Any] = field(default_factory=dict)
    score: float | None = None  # MT-Eval: 0..10
    scorer: str | None = None  # MT-Eval: judge | cls | ifeval

    @property
    def key(self) -> Key:
        return (self.system_id, self.turn)

    @property
    def passed(self) -> bool | None:
        """A turn passes when no verdict is 'no'; None when it has no usable verdicts."""
        if self.parse_status == "unparsed" or not self.verdicts:
            return None
        return all(v.value != "no" for v in self.verdicts.values())


GENERATION_STATUSES = ("ok", "skipped")


HISTORY_MODES = ("model", "reference", "single-turn", "upstream")


PARSE_STATUSES = ("ok", "unparsed", "imported", "skipped")


JUDGE_SCORER = "judge"  # a score the judge stage read from a judge model's reply

#: Who may give a judgment's score: the judge, and the scorers of the registered benchmarks
#: (``Benchmark.scorers``, e.g. MT-Eval's rules ``cls`` and ``ifeval``). The benchmark registry keeps
#: it up to date through :func:`set_scorers`, so this module names no benchmark.
SCORERS: tuple[str, ...] = (JUDGE_SCORER,)


def set_scorers(names: Iterable[str]) -> None:
    """The scorers a judgments file may name besides the judge (called by the benchmark registry)."""
    global SCORERS
    SCORERS = tuple(dict.fromkeys((JUDGE_SCORER, *names)))


def _record_to_json(record: Any) -> str:
    obj = dataclasses.asdict(record)
    for name in getattr(record, "OMITTED_WHEN_NULL", ()):
        if obj.get(name) is None:
            del obj[name]
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


class _FieldError(ValueError):
    """A record field of the wrong type or value; the reader adds file, line, session and turn."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


def _field(obj: dict[str, Any], name: str, kinds: tuple[type, ...], optional: bool = False, default: Any = ...) -> Any:
    if name not in obj:
        if default is not ...:
            return default
        raise _FieldError(name, "is missing")
    value = obj[name]
    if value is None and optional:
        return None
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        wanted = " or ".join({int: "an integer", str: "a string", dict: "an object"}[k] for k in kinds)
        raise _FieldError(name, f"should be {wanted}{' or null' if optional else ''}, found {json_type(value)}")
    return value


def _choice(obj: dict[str, Any], name: str, allowed: tuple[str, ...], default: str) -> str:
    value = _field(obj, name, _STR, default=default)
    if value not in allowed:
        raise _FieldError(name, f"is {value!r}, expected one of {', '.join(allowed)}")
    return value


def _only_known(obj: dict[str, Any], cls: type) -> None:
    unknown = sorted(set(obj) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise _FieldError(unknown[0], "is not a field of this record")


def _key_fields(obj: Any) -> Key:
    if not isinstance(obj, dict):
        raise _FieldError("record", f"should be an object, found {json_type(obj)}")
    return (_field(obj, "system_id", _INT), _field(obj, "turn", _INT))


def _generation_from_dict(obj: Any) -> GenerationRecord:
    system_id, turn = _key_fields(obj)
    _only_known(obj, GenerationRecord)
    status = _choice(obj, "status", GENERATION_STATUSES, "ok")
    response = _field(obj, "response", _STR, optional=True)
    if response is None and status == "ok":
        raise _FieldError("response", "is null but status is 'ok'")
    return GenerationRecord(
        system_id=system_id,
        turn=turn,
        user=_field(obj, "user", _STR),
        response=response,
        history=_choice(obj, "history", HISTORY_MODES, "model"),
        status=status,
        prompt_tokens=_field(obj, "prompt_tokens", _INT, optional=True, default=None),
        output_tokens=_field(obj, "output_tokens", _INT, optional=True, default=None),
        cached_prompt_tokens=_field(obj, "cached_prompt_tokens", _INT, optional=True, default=None),
        finish_reason=_field(obj, "finish_reason", _STR, optional=True, default=None),
        overflow=_field(obj, "overflow", _STR, optional=True, default=None),
        model=_field(obj, "model", _STR, optional=True, default=None),
        extra=_field(obj, "extra", _DICT, default={}),
    )


def _verdict_from_dict(number: str, obj: Any) -> Verdict:
    if not isinstance(obj, dict):
        raise _FieldError(f"verdicts.{number}", f"should be an object, found {json_type(obj)}")
    unknown = sorted(set(obj) - {"raw", "value", "type"})
    if unknown:
        raise _FieldError(f"verdicts.{number}.{unknown[0]}", "is not a field of a verdict")
    values = {}
    for name in ("raw", "value", "type"):
        try:
            values[name] = _field(obj, name, _STR)
        except _FieldError as error:
            raise _FieldError(f"verdicts.{number}.{name}", str(error)) from None
    if values["value"] not in VERDICT_VALUES:
        raise _FieldError(
            f"verdicts.{number}.value", f"is {values['value']!r}, expected one of {', '.join(VERDICT_VALUES)}"
        )
    return Verdict(**values)


def _judgment_from_dict(obj: Any) -> JudgmentRecord:
    system_id, turn = _key_fields(obj)
    _only_known(obj, JudgmentRecord)
    verdicts = _field(obj, "verdicts", _DICT)
    attempts = _field(obj, "attempts", _INT, default=1)
    if attempts < 0:
        raise _FieldError("attempts", f"is {attempts}, expected 0 or more")
    parse_status = _choice(obj, "parse_status", PARSE_STATUSES, "ok")
    score = _score_field(obj)
    scorer = _field(obj, "scorer", _STR, optional=True, default=None)
    if scorer is not None and scorer not in SCORERS:
        raise _FieldError("scorer", f"is {scorer!r}, expected one of {', '.join(SCORERS)} or null")
    if score is not None:
        if scorer is None:
            raise _FieldError("scorer", "is missing: a record with a score names its scorer")
        if parse_status != "ok":
            raise _FieldError(
                "score", f"is {score:g} but parse_status is {parse_status!r}: only an ok record has a score"
            )
        if verdicts:
            raise _FieldError("verdicts", "should be empty on a record with a score")
    elif scorer is not None and parse_status == "ok":
        raise _FieldError("score", f"is missing but parse_status is 'ok' and scorer is {scorer!r}")
    return JudgmentRecord(
        system_id=system_id,
        turn=turn,
        verdicts={str(k): _verdict_from_dict(str(k), v) for k, v in verdicts.items()},
        parse_status=parse_status,
        reasoning=_field(obj, "reasoning", _STR, optional=True, default=None),
        judge_model=_field(obj, "judge_model", _STR, optional=True, default=None),
        template_hash=_field(obj, "template_hash", _STR, optional=True, default=None),
        raw_reply=_field(obj, "raw_reply", _STR, optional=True, default=None),
        attempts=attempts,
        extra=_field(obj, "extra", _DICT, default={}),
        score=score,
        scorer=scorer,
    )


def _score_field(obj: dict[str, Any]) -> float | None:
    """``score``: absent or null, else a finite number from 0 to 10 (read as a float)."""
    value = obj.get("score")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _FieldError("score", f"should be a number from 0 to 10 or null, found {json_type(value)}")
    if not math.isfinite(value) or not MIN_SCORE <= value <= MAX_SCORE:
        raise _FieldError("score", f"is {value!r}, expected a number from 0 to 10")
    return float(value)
