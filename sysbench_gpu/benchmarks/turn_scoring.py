"""What every benchmark's metrics share: which turns are scored (finished, missing, unparsed, skipped), per-session
sufficient statistics, and naming turns in errors.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.records import JudgmentRecord
from sysbench_gpu.core.sessions import Session

_NAMED = 5  # turns named in an error message before "... and N more"

Key = tuple[int, int]  # (system_id, turn)


@dataclass(frozen=True)
class SessionTable:
    """Per-session sufficient statistics: every metric is sum(num) / sum(den) over sessions."""

    system_ids: tuple[int, ...]
    groups: tuple[str, ...]
    leading: np.ndarray  # leading passing turns per session
    n_rounds: int  # T: the largest number of turns in a session
    ratios: dict[str, tuple[np.ndarray, np.ndarray]]  # metric name -> (num, den) per session

    def point(self, name: str, rows: np.ndarray | None = None) -> float | None:
        num, den = self.ratios[name]
        if rows is not None:
            num, den = num[rows], den[rows]
        total = float(den.sum())
        return float(num.sum()) / total if total else None

    def resampled(self, name: str, index: np.ndarray) -> np.ndarray:
        """The metric on each bootstrap resample (rows of ``index``); NaN where undefined."""
        num, den = self.ratios[name]
        top, bottom = num[index].sum(axis=1), den[index].sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(bottom > 0, top / np.where(bottom > 0, bottom, 1), np.nan)


def all_turns(session: Session) -> list[Key]:
    return [(session.system_id, t.index) for t in session.turns]


def split_turns(
    sessions: Sequence[Session],
    judgments: Mapping[Key, JudgmentRecord],
    expected: set[Key] | None,
    allow_partial: bool,
    exclude_unparsed: bool,
    exclude_skipped: bool = False,
    unfinished_stages: Sequence[str] = (),
    turns_of: Callable[[Session], list[Key]] = all_turns,
) -> tuple[dict[Key, JudgmentRecord], list[Session], Counter]:
    """The judgments that can be scored, the sessions that have expected turns, and what was left out.

    ``turns_of`` names the turns of a session that are scored (SysBench: all of them;
    MT-Eval: the answered ones). Ungenerated turns, a running stage and missing
    judgments are errors unless ``allow_partial``; unparsed and skipped turns are errors
    unless excluded. Every error names the turns briefly (``name_keys``).
    """
    counts: Counter = Counter()
    ungenerated: list[Key] = []
    missing: list[Key] = []
    unparsed: list[Key] = []
    skipped: list[Key] = []  # the model gave no reply (over-length): neither passed nor failed silently
    usable: dict[Key, JudgmentRecord] = {}
    kept: list[Session] = []
    for session in sessions:
        keys = turns_of(session)
        wanted = [k for k in keys if expected is None or k in expected]
        ungenerated += [k for k in keys if expected is not None and k not in expected]
        if not wanted:
            continue  # a session this run never generated
        kept.append(session)
        for key in wanted:
            judgment = judgments.get(key)
            if judgment is None:
                missing.append(key)
            elif judgment.parse_status == "unparsed":
                unparsed.append(key)
            elif judgment.parse_status == "skipped":
                skipped.append(key)
            else:
                usable[key] = judgment
    if not allow_partial and (ungenerated or unfinished_stages):
        stages = " and ".join(f"`{stage}`" for stage in unfinished_stages)
        parts = []
        if ungenerated:
            parts.append(f"{len(ungenerated)} turn(s) were never generated ({name_keys(ungenerated)})")
        if unfinished_stages:
            parts.append(f"the manifest says {stages} is still running (or was stopped part-way)")
        raise SysbenchError(
            f"unfinished run: {'; '.join(parts)}; finish it by rerunning the same command, "
            "or pass --allow-partial to score what is there"
        )
    if missing and not allow_partial:
        raise SysbenchError(
            f"{len(missing)} expected turn(s) have no judgment: {name_keys(missing)}; "
            "run judge to finish them, or pass --allow-partial to score the judged subset"
        )
    if unparsed and not exclude_unparsed:
        raise SysbenchError(
            f"{len(unparsed)} judgment(s) are unparsed (the judge's reply never parsed): {name_keys(unparsed)}; "
            "rerun judge to retry them, or pass --exclude-unparsed to leave them out (they are counted)"
        )
    if skipped and not exclude_skipped:
        raise SysbenchError(
            f"{len(skipped)} turn(s) were skipped at generation (no reply, e.g. over-length): {name_keys(skipped)}; "
            "regenerate with --on-overflow truncate-history, or pass --exclude-skipped to leave them out (they are "
            "counted)"
        )
    counts["ungenerated"] = len(ungenerated)
    counts["missing"] = len(missing)
    counts["unparsed"] = len(unparsed)
    counts["skipped"] = len(skipped)
    return usable, kept, counts


def name_keys(keys: Sequence[Key], sessions_named: int = _NAMED) -> str:
    """Turns briefly, by session: ``session 3, turns 2-5; session 4, turn 1; ... and 4 more``."""
    by_session: dict[int, list[int]] = {}
    for system_id, turn in sorted(keys):
        by_session.setdefault(system_id, []).append(turn)
    named = []
    for system_id, turns in list(by_session.items())[:sessions_named]:
        spans: list[list[int]] = []
        for turn in turns:
            if spans and turn == spans[-1][1] + 1:
                spans[-1][1] = turn
            else:
                spans.append([turn, turn])
        listed = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
        named.append(f"session {system_id}, turn{'s' if len(turns) > 1 else ''} {listed}")
    more = len(by_session) - sessions_named
    return "; ".join(named) + (f"; ... and {more} more session{'s' if more > 1 else ''}" if more > 0 else "")
