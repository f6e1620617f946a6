"""Normalization of verifier verdict strings to yes / no / other.

Only ``yes`` satisfies a constraint, and only ``no`` fails a turn (the semantics
that reproduce the paper's tables). Everything else (不适用 "not applicable",
无法判断 "cannot judge", 部分是 "partly", ...) is ``other``: it neither satisfies a
constraint nor fails a turn, and metrics count it separately. The raw string is
always kept beside the normalized value.
"""

from __future__ import annotations

YES = "yes"
NO = "no"
OTHER = "other"

_YES_FORMS = frozenset({"是", "yes", "y", "true", "满足", "符合", "遵循"})
_NO_FORMS = frozenset({"否", "no", "n", "false", "不满足", "不符合", "未遵循"})
_STRIP = " \t\r\n\"'“”‘’`.,;:!?。，；：！？、()（）[]【】"


def normalize_verdict(raw: object) -> str:
    """Map a raw verdict (str, bool or other JSON scalar) to yes / no / other."""
    if isinstance(raw, bool):
        return YES if raw else NO
    if not isinstance(raw, str):
        return OTHER
    text = raw.strip(_STRIP).lower()
    if text in _YES_FORMS:
        return YES
    if text in _NO_FORMS:
        return NO
    return OTHER
