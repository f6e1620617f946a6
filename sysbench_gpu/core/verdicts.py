"""Verdict strings to yes / no / other: imported workbooks and live judges, kept apart.

Only ``yes`` satisfies a constraint, and only ``no`` fails a turn (the semantics
that reproduce the paper's tables). The raw string is always kept beside the value.

Two readings, on purpose:

- :func:`normalize_verdict` reads a published workbook exactly as the paper's
  numbers were made: 是/yes -> yes, 否/no -> no, anything else -> ``other``.
  It must not change, or the 21 workbooks stop reproducing the paper.
- :func:`live_verdict` reads a judge we are running. A judge must say yes or no,
  or explicitly that the constraint does not apply. Yes and no forms, also with a
  short explanation after them ("No, it does not ...", "否，因为 ...", "NO."),
  map to yes and no; the not-applicable family (不适用, 无法判断, N/A, ...) is
  ``other``; anything else (部分满足, "maybe", a quoted line of code) is None: the
  reply is invalid, retried, and recorded ``unparsed`` when every try fails. So an
  off-vocabulary verdict can never pass a turn by accident.
"""

from __future__ import annotations

import re

YES = "yes"
NO = "no"
OTHER = "other"

_YES_FORMS = frozenset({"是", "yes", "y", "true", "满足", "符合", "遵循"})
_NO_FORMS = frozenset({"否", "no", "n", "false", "不满足", "不符合", "未遵循"})
_STRIP = " \t\r\n\"'“”‘’`.,;:!?。，；：！？、()（）[]【】"


def normalize_verdict(raw: object) -> str:
    """Map a raw verdict (str, bool or other JSON scalar) to yes / no / other (workbook import)."""
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


# ---------------------------------------------------------------- live judges

LIVE_YES = frozenset(
    {
        "是",
        "是的",
        "对",
        "满足",
        "已满足",
        "完全满足",
        "符合",
        "已符合",
        "遵循",
        "已遵循",
        "遵守",
        "已遵守",
        "yes",
        "y",
        "true",
        "satisfied",
        "met",
        "pass",
        "passed",
        "correct",
    }
)
LIVE_NO = frozenset(
    {
        "否",
        "不是",
        "不",
        "不对",
        "不满足",
        "未满足",
        "没有满足",
        "没满足",
        "不符合",
        "未符合",
        "没有符合",
        "未遵循",
        "没有遵循",
        "不遵循",
        "未遵守",
        "没有遵守",
        "不遵守",
        "no",
        "n",
        "false",
        "not satisfied",
        "unsatisfied",
        "not met",
        "fail",
        "failed",
        "incorrect",
    }
)
LIVE_NOT_APPLICABLE = frozenset(
    {
        "不适用",
        "无法判断",
        "无法评判",
        "无法判定",
        "无法确定",
        "无法评估",
        "不涉及",
        "不相关",
        "n/a",
        "n.a",
        "na",
        "not applicable",
        "cannot judge",
        "cannot be judged",
        "cannot determine",
        "cannot be determined",
        "unable to judge",
        "unable to determine",
        "irrelevant",
    }
)
_LIVE_FORMS = ((LIVE_YES, YES), (LIVE_NO, NO), (LIVE_NOT_APPLICABLE, OTHER))
# What may follow a verdict word before its explanation: punctuation, a dash, a line break.
_EXPLANATION_START = re.compile(r"\s*(?:[,，.。;；:：!！?？、(（\[【\-—–]|\n|$)")
# A verdict word followed by one of these is hedged ("yes and no", "是但是"), not a verdict.
_HEDGES = ("and ", "or ", "but ", "partially", "partly", "mostly", "but", "但", "或", "和", "部分", "基本", "不完全")
_TRIM = " \t\r\n\"'“”‘’`*_"
_MAX_HEAD = 24  # longest verdict phrase looked for at the start of a reply


def live_verdict(raw: object) -> str | None:
    """yes / no / other for a live judge's verdict; None when it is not a verdict (the reply is invalid)."""
    if isinstance(raw, bool):
        return YES if raw else NO
    if not isinstance(raw, str):
        return None
    text = " ".join(raw.strip(_TRIM).split()).lower()
    whole = text.rstrip(".。!！")
    for forms, value in _LIVE_FORMS:
        if whole in forms:
            return value
    # A verdict phrase, then an explanation: "No, it does not", "否，回答用了表格", "NO. The reply ...".
    best: tuple[int, str] | None = None
    for forms, value in _LIVE_FORMS:
        for form in forms:
            if len(form) > _MAX_HEAD or not text.startswith(form):
                continue
            rest = text[len(form) :]
            if not _EXPLANATION_START.match(rest):
                continue
            if rest.lstrip(" ,，:：-—–").startswith(_HEDGES):
                continue
            if best is None or len(form) > best[0]:
                best = (len(form), value)
    return best[1] if best is not None else None
