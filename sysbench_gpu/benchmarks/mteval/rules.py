"""Rule scorers for MT-Eval's recollection tasks, under one of two rule sets (``--rules``).

- Recollection cls (and the ``cls_ablation_*`` files): 10 when the gold label occurs in the
  response; else 0. Both sides have ASCII punctuation turned into spaces and are lower-cased.
  ``official``: nothing else, as the authors' ``calculate_score.py`` does (so the label's own
  spaces, trailing ones included, must appear as they are). ``lenient``: whitespace is also
  collapsed and the label trimmed, so "science  fiction" matches "science-fiction".
- Recollection global-inst: 10 when the dialogue's verifiable instruction holds for the
  response; else 0. The 14 instruction names are those of MT-Eval's ``utils/global_inst.py``
  (IFEval's checkers as MT-Eval adapted them, plus start_char and start_emoji); each check
  here follows MT-Eval's semantics, in our own code. Two checks differ under ``lenient``:
  ``number_sentences`` counts with our regex splitter instead of Punkt, and ``start_emoji``
  accepts a whole leading emoji sequence instead of testing the first code point only.
  Why no IFEval library is used: docs/mteval.md.

Language identification uses ``langdetect`` (the library upstream uses), with a fixed seed so
a verdict never changes between runs; emoji detection uses the ``emoji`` package. Both are
imported only when a check needs them. Nothing here evaluates response text as code: the JSON
check is ``json.loads``.
"""

from __future__ import annotations

import functools
import json
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sysbench_gpu.benchmarks.mteval.sentences import DEFAULT_RULES, RULE_SETS, count_sentences
from sysbench_gpu.benchmarks.mteval.tasks import TASKS
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.sessions import Session

MAX_SCORE = 10

# ------------------------------------------------------------------ recollection cls


def normalize_label(text: str) -> str:
    """Lower-case, every ASCII punctuation character turned into a space, whitespace collapsed."""
    lowered = text.lower().translate(_PUNCTUATION_TO_SPACE)
    return " ".join(lowered.split())


_PUNCTUATION_TO_SPACE = str.maketrans({ch: " " for ch in string.punctuation})


def score_cls(response: str, gold: str, rules: str = DEFAULT_RULES) -> int:
    """10 when the gold label occurs in the response (``lenient``: both normalized first), else 0."""
    _check_rules(rules)
    if rules == "official":
        if not gold:
            raise SysbenchError("gold label is empty")
        return MAX_SCORE if official_label(gold) in official_label(response) else 0
    label = normalize_label(gold)
    if not label:
        raise SysbenchError(f"gold label {gold!r} is empty after normalization")
    return MAX_SCORE if label in normalize_label(response) else 0


def official_label(text: str) -> str:
    """ASCII punctuation turned into spaces, then lower-cased; nothing trimmed or collapsed."""
    return text.translate(_PUNCTUATION_TO_SPACE).lower()


def describe_cls(gold: str, rules: str) -> str:
    """The label as the cls rule looks for it, for the judgment record."""
    return repr(official_label(gold) if rules == "official" else normalize_label(gold))


def _check_rules(rules: str) -> None:
    if rules not in RULE_SETS:
        raise SysbenchError(f"unknown MT-Eval rule set {rules!r} (known: {', '.join(RULE_SETS)})")


# ------------------------------------------------------------------ recollection global-inst

# Language names as the data spells them -> langdetect codes (the languages upstream offers).
LANGUAGE_CODES: Mapping[str, str] = {
    "English": "en",
    "Spanish": "es",
    "Portuguese": "pt",
    "Arabic": "ar",
    "Hindi": "hi",
    "French": "fr",
    "Russian": "ru",
    "German": "de",
    "Japanese": "ja",
    "Italian": "it",
    "Bengali": "bn",
    "Ukrainian": "uk",
    "Thai": "th",
    "Urdu": "ur",
    "Tamil": "ta",
    "Telugu": "te",
    "Bulgarian": "bg",
    "Korean": "ko",
    "Polish": "pl",
    "Hebrew": "he",
    "Persian": "fa",
    "Vietnamese": "vi",
    "Nepali": "ne",
    "Swahili": "sw",
    "Kannada": "kn",
    "Marathi": "mr",
    "Gujarati": "gu",
    "Punjabi": "pa",
    "Malayalam": "ml",
    "Finnish": "fi",
}
SENTENCE_RELATIONS: Mapping[str, Callable[[int, int], bool]] = {
    "less than": lambda count, limit: count < limit,
    "at least": lambda count, limit: count >= limit,
    "more than": lambda count, limit: count > limit,
}
TWO_RESPONSES_SEPARATOR = "******"
_JSON_FENCES = ("```json", "```Json", "```JSON", "```")
_BULLET_STAR = re.compile(r"^\s*\*[^*].*$", re.MULTILINE)
_BULLET_DASH = re.compile(r"^\s*-.*$", re.MULTILINE)
_PLACEHOLDER = re.compile(r"\[.*?\]")


def _starts_with_letter(response: str, args: Mapping[str, Any]) -> bool:
    return response.strip().lower().startswith(str(args["letter"]).lower())


def _starts_with_emoji(response: str, args: Mapping[str, Any]) -> bool:
    import emoji

    body = response.strip()
    # As the authors test it: the first code point alone must be an emoji (an empty reply fails).
    return bool(body) and bool(emoji.is_emoji(body[0]))


def _starts_with_emoji_sequence(response: str, args: Mapping[str, Any]) -> bool:
    import emoji

    body = response.strip()
    # Lenient: the whole leading emoji sequence counts (flags, keycaps, ZWJ sequences).
    found = emoji.emoji_list(body[:32])
    return bool(body) and bool(found) and found[0]["match_start"] == 0


def _ends_with_phrase(response: str, args: Mapping[str, Any]) -> bool:
    return response.strip().strip("'").lower().endswith(str(args["end_phrase"]).lower())


def _in_language(response: str, args: Mapping[str, Any]) -> bool:
    body = response.strip()
    if not body:
        return False
    detected = detect_language(body)
    # Like upstream, text with nothing to detect (digits, emoji only) is not held against the response.
    return detected is None or detected == LANGUAGE_CODES[str(args["lang"])]


def _is_json(response: str, args: Mapping[str, Any]) -> bool:
    body = response.strip()
    # A chain, as the authors strip: each opening spelling in turn, so "```json```{...}```" is JSON too.
    for fence in _JSON_FENCES:
        body = body.removeprefix(fence)
    body = body.removesuffix("```").strip()
    try:
        json.loads(body)
    except (ValueError, RecursionError):
        return False
    return True


def _bullet_count_matches(response: str, args: Mapping[str, Any]) -> bool:
    count = len(_BULLET_STAR.findall(response)) + len(_BULLET_DASH.findall(response))
    wanted = int(args["num_bullets"])
    return count > 0 if wanted == 0 else count == wanted  # 0: "only bullet points", at least one


def _sentence_count_matches(response: str, args: Mapping[str, Any]) -> bool:
    return SENTENCE_RELATIONS[str(args["relation"])](count_sentences(response), int(args["num_sentences"]))


def _regex_sentence_count_matches(response: str, args: Mapping[str, Any]) -> bool:
    count = count_sentences(response, "lenient")
    return SENTENCE_RELATIONS[str(args["relation"])](count, int(args["num_sentences"]))


def _has_keywords(response: str, args: Mapping[str, Any]) -> bool:
    lowered = response.lower()
    return all(str(keyword).lower() in lowered for keyword in args["keywords"])


def _all_capitals(response: str, args: Mapping[str, Any]) -> bool:
    return response.isupper()


def _all_lowercase(response: str, args: Mapping[str, Any]) -> bool:
    return response.islower()


def _no_comma(response: str, args: Mapping[str, Any]) -> bool:
    return "," not in response


def _two_responses(response: str, args: Mapping[str, Any]) -> bool:
    parts = response.split(TWO_RESPONSES_SEPARATOR)
    kept = []
    for position, part in enumerate(parts):
        if part.strip():
            kept.append(part.strip())
        elif 0 < position < len(parts) - 1:
            return False  # an empty answer between two separators
    return len(kept) == 2 and kept[0] != kept[1]


def _enough_placeholders(response: str, args: Mapping[str, Any]) -> bool:
    return len(_PLACEHOLDER.findall(response)) >= int(args["num_placeholder"])


def _one_of_options(response: str, args: Mapping[str, Any]) -> bool:
    return any(str(option) in response for option in args["response_options"])


@dataclass(frozen=True)
class Instruction:
    name: str
    check: Callable[[str, Mapping[str, Any]], bool]
    args: Mapping[str, str]  # argument -> kind: "str", "int", "strs", "language", "relation"
    describe: str  # how the check reads, for records and docs


INSTRUCTIONS: Mapping[str, Instruction] = {
    i.name: i
    for i in (
        Instruction("change_case:capital_letter", _all_capitals, {}, "all cased characters are upper-case"),
        Instruction("change_case:lowercase", _all_lowercase, {}, "all cased characters are lower-case"),
        Instruction(
            "combination:two_responses", _two_responses, {}, "exactly two different answers separated by ******"
        ),
        Instruction(
            "content:placeholder",
            _enough_placeholders,
            {"num_placeholder": "int"},
            "at least num_placeholder [bracketed] placeholders",
        ),
        Instruction(
            "format:bullet_list",
            _bullet_count_matches,
            {"num_bullets": "int"},
            "exactly num_bullets markdown bullets (* or -); 0: at least one",
        ),
        Instruction(
            "format:constrained_response",
            _one_of_options,
            {"response_options": "strs"},
            "contains one of response_options",
        ),
        Instruction("format:json_format", _is_json, {}, "parses as JSON (a ```json fence allowed)"),
        Instruction("keywords:existence", _has_keywords, {"keywords": "strs"}, "contains every keyword (any case)"),
        Instruction(
            "language:response_language", _in_language, {"lang": "language"}, "langdetect finds the language lang"
        ),
        Instruction(
            "length_constraints:number_sentences",
            _sentence_count_matches,
            {"num_sentences": "int", "relation": "relation"},
            "sentence count compared with num_sentences",
        ),
        Instruction("punctuation:no_comma", _no_comma, {}, "no comma"),
        Instruction("startend:end_phrase", _ends_with_phrase, {"end_phrase": "str"}, "ends with end_phrase (any case)"),
        Instruction("startend:start_char", _starts_with_letter, {"letter": "str"}, "starts with letter (any case)"),
        Instruction("startend:start_emoji", _starts_with_emoji, {}, "starts with an emoji"),
    )
}
INSTRUCTION_NAMES: tuple[str, ...] = tuple(INSTRUCTIONS)
# The checks that ``--rules lenient`` replaces; every other check is the same under both rule sets.
LENIENT_CHECKS: Mapping[str, Callable[[str, Mapping[str, Any]], bool]] = {
    "length_constraints:number_sentences": _regex_sentence_count_matches,
    "startend:start_emoji": _starts_with_emoji_sequence,
}


_ARG_KINDS: Mapping[str, Callable[[Any], bool]] = {
    "str": lambda v: isinstance(v, str) and bool(v),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "strs": lambda v: isinstance(v, list) and bool(v) and all(isinstance(x, str) and x for x in v),
    "language": lambda v: isinstance(v, str) and v in LANGUAGE_CODES,
    "relation": lambda v: isinstance(v, str) and v in SENTENCE_RELATIONS,
}


def check_instruction_args(name: str, args: Mapping[str, Any]) -> str | None:
    """Why ``args`` do not suit instruction ``name``, or None when they do."""
    spec = INSTRUCTIONS[name].args
    for key, kind in spec.items():
        if key not in args:
            return f"{name} needs {key!r}"
        value = args[key]
        if not _ARG_KINDS[kind](value):
            allowed = {
                "language": f" (one of {', '.join(LANGUAGE_CODES)})",
                "relation": f" (one of {', '.join(SENTENCE_RELATIONS)})",
            }.get(kind, "")
            return f"{name}: {key} = {value!r} is not a valid {kind}{allowed}"
    return None


def check_instruction(name: str, args: Mapping[str, Any], response: str, rules: str = DEFAULT_RULES) -> bool:
    """Whether ``response`` follows instruction ``name`` with ``args`` (validated first) under ``rules``."""
    if name not in INSTRUCTIONS:
        raise SysbenchError(f"unknown instruction {name!r} (known: {', '.join(INSTRUCTION_NAMES)})")
    _check_rules(rules)
    problem = check_instruction_args(name, args)
    if problem:
        raise SysbenchError(problem)
    check = LENIENT_CHECKS.get(name, INSTRUCTIONS[name].check) if rules == "lenient" else INSTRUCTIONS[name].check
    return check(response, args)


@functools.lru_cache(maxsize=1)
def _language_factory() -> Any:
    # A private factory with a fixed seed: langdetect's module-level one is random unless seeded globally.
    try:
        from langdetect.detector_factory import PROFILES_DIRECTORY, DetectorFactory
    except ImportError:
        raise SysbenchError("the language:response_language check needs langdetect (pip install langdetect)") from None
    factory = DetectorFactory()
    factory.load_profile(PROFILES_DIRECTORY)
    factory.set_seed(0)
    return factory


def detect_language(text: str) -> str | None:
    """langdetect's language code for ``text`` (deterministic), or None when it finds no features."""
    from langdetect.lang_detect_exception import LangDetectException

    detector = _language_factory().create()
    detector.append(text)
    try:
        return detector.detect()
    except LangDetectException:
        return None


# ------------------------------------------------------------------ one turn


@dataclass(frozen=True)
class RuleVerdict:
    score: int  # 0 or MAX_SCORE
    rule: str  # "cls" or the instruction name
    detail: str  # what was checked, for the judgment record


def rule_score(session: Session, turn_index: int, response: str, rules: str = DEFAULT_RULES) -> RuleVerdict:
    """Score an answered turn of a rule-scored task (recollection cls / global-inst, cls ablations) under ``rules``."""
    info = TASKS.get(session.task or "")
    turn = session.turn(turn_index)
    where = f"session {session.system_id}, turn {turn_index}"
    if info is None or info.scorer == "judge":
        raise SysbenchError(f"{where}: task {session.task!r} is scored by the LLM judge, not by a rule")
    if not turn.answered:
        raise SysbenchError(f"{where}: a context turn, never answered")
    if info.scorer == "cls":
        if not turn.reference:
            raise SysbenchError(f"{where}, field 'sys': no gold label")
        score = score_cls(response, turn.reference, rules)
        found = "found" if score else "not found"
        return RuleVerdict(score, "cls", f"gold label {describe_cls(turn.reference, rules)} {found} in the response")
    dialogue = session.mteval
    if dialogue is None or dialogue.inst_name is None:
        raise SysbenchError(f"{where}, field 'inst_name': missing")
    followed = check_instruction(dialogue.inst_name, dialogue.inst_args, response, rules)
    args = json.dumps(dict(dialogue.inst_args), ensure_ascii=False)
    return RuleVerdict(
        MAX_SCORE if followed else 0,
        dialogue.inst_name,
        f"{INSTRUCTIONS[dialogue.inst_name].describe} {args}: {'followed' if followed else 'not followed'}",
    )
