"""From battle records to ratings: both orders combined, the fit with its CIs, and the comparisons beside it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sysbench_gpu.arena.battles import BattleKey, BattleRecord
from sysbench_gpu.arena.bt import (
    ANCHOR,
    COVARIATE_STEP,
    Battles,
    fit_mm,
    fit_with_ci,
    online_elo,
    unbounded,
    win_rates,
)
from sysbench_gpu.arena.runs import ArenaRun, run_labels

SCORE = {"a": 1.0, "b": 0.0, "tie": 0.5}


@dataclass(frozen=True)
class Outcome:
    a: str
    b: str
    system_id: int
    turn: int
    score: float  # a's: 1, 0.5 or 0
    len_a: int
    len_b: int


@dataclass
class Consistency:
    """How often the judge picked the same run in both orders (ties included), over battles parsed in both."""

    both_parsed: int = 0
    agreed: int = 0
    unparsed: int = 0  # battles dropped because an order never parsed
    first_position_wins: int = 0  # answers "A" over all parsed answers: the judge's pull towards the first
    answers: int = 0

    def summary(self) -> dict[str, Any]:
        return {
            "battles_parsed_in_both_orders": self.both_parsed,
            "agreed": self.agreed,
            "rate": self.agreed / self.both_parsed if self.both_parsed else None,
            "battles_dropped_unparsed": self.unparsed,
            "first_position_share": self.first_position_wins / self.answers if self.answers else None,
            "disagreements_count_as": "tie",
        }


def outcomes(
    records: Mapping[BattleKey, BattleRecord], pairs: set[tuple[str, str]]
) -> tuple[list[Outcome], Consistency | None]:
    """One outcome per battle of the ``pairs`` (run keys, a < b) played in this call's mode; judged battles need
    both orders (disagreeing ones are ties)."""
    consistency: Consistency | None = None
    result = []
    by_battle: dict[tuple[str, str, int, int], dict[str, BattleRecord]] = {}
    for record in records.values():
        if (record.a, record.b) in pairs:
            by_battle.setdefault((record.a, record.b, record.system_id, record.turn), {})[record.order] = record
    for (a, b, system_id, turn), orders in sorted(by_battle.items(), key=lambda item: (item[0][2], item[0][3])):
        first = next(iter(orders.values()))
        if first.by == "verdicts":
            score = SCORE[first.winner]
        else:
            consistency = consistency or Consistency()
            parsed = [r for r in orders.values() if r.status == "ok"]
            consistency.answers += len(parsed)
            consistency.first_position_wins += sum(1 for r in parsed if r.answer == "A")
            if len(parsed) < 2:
                consistency.unparsed += int(len(orders) == 2)
                continue  # a battle still missing an order, or one that never parsed, has no outcome
            consistency.both_parsed += 1
            winners = {r.winner for r in parsed}
            consistency.agreed += int(len(winners) == 1)
            score = SCORE[winners.pop()] if len(winners) == 1 else 0.5
        result.append(Outcome(a, b, system_id, turn, score, first.len_a, first.len_b))
    return result, consistency


def battles_of(found: Sequence[Outcome], runs: Sequence[ArenaRun]) -> Battles:
    index = {run.key: i for i, run in enumerate(runs)}
    sessions = {sid: i for i, sid in enumerate(sorted({o.system_id for o in found}))}
    lengths = [(o.len_a - o.len_b) / (o.len_a + o.len_b) if o.len_a + o.len_b else 0.0 for o in found]
    return Battles.of(
        a=[index[o.a] for o in found],
        b=[index[o.b] for o in found],
        score=[o.score for o in found],
        session=[sessions[o.system_id] for o in found],
        n_players=len(runs),
        covariate=lengths,
    )


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None or not np.isfinite(value) else round(float(value), digits)


def rate(
    runs: Sequence[ArenaRun],
    found: Sequence[Outcome],
    *,
    baseline: ArenaRun | None,
    resamples: int,
    seed: int,
    length_control: bool,
    unrated: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """ratings.json's content: the runs by rating, the fit's settings, the win-rate matrix and the checks.

    A run without a battle is unrated: no rating, CI or online Elo, and ``unrated`` says why (``unrated``
    maps a run's key to the reason; "no battles" where it has none).
    """
    battles = battles_of(found, runs)
    anchor = runs.index(baseline) if baseline is not None else None
    fit = fit_with_ci(battles, anchor=anchor, resamples=resamples, seed=seed)
    mm = fit_mm(battles, anchor=anchor)
    elo = online_elo(battles)
    lc = (
        fit_with_ci(battles, anchor=anchor, resamples=resamples, seed=seed, with_covariate=True)
        if length_control
        else None
    )
    counts = np.zeros((len(runs), 3), dtype=int)  # wins, ties, losses
    for a, b, score in zip(battles.a.tolist(), battles.b.tolist(), battles.score.tolist(), strict=True):
        column = 0 if score == 1.0 else 1 if score == 0.5 else 2
        counts[a, column] += 1
        counts[b, 2 - column] += 1
    labels = run_labels([(run.name, run.given) for run in runs])
    rows = []
    for i, run in enumerate(runs):
        played = int(counts[i].sum())
        row: dict[str, Any] = {
            "run": run.given,
            "model": run.name,
            "label": labels[i],
            "rating": _round(fit.ratings[i]) if played else None,
            "ci": [_round(v) for v in fit.ci[i]] if fit.ci[i] and played else None,
            "ci_resamples": fit.ci_resamples[i] if fit.ci_resamples is not None and played else None,
            "battles": played,
            "wins": int(counts[i, 0]),
            "ties": int(counts[i, 1]),
            "losses": int(counts[i, 2]),
            "online_elo": _round(elo[i]) if played else None,
        }
        if not played:
            row["unrated"] = (unrated or {}).get(run.key, "no battles")
        elif row["rating"] is None:
            row["unrated"] = "no finite maximum-likelihood rating (see fit.warning)"
        if lc is not None:
            row["rating_length_controlled"] = _round(lc.ratings[i]) if played else None
            row["ci_length_controlled"] = [_round(v) for v in lc.ci[i]] if lc.ci[i] and played else None
        rows.append(row)
    order = sorted(range(len(runs)), key=lambda i: -np.nan_to_num(fit.ratings[i], nan=-np.inf))
    difference = np.abs(fit.ratings - mm)
    finite = difference[np.isfinite(difference)]
    result: dict[str, Any] = {
        "ratings": [rows[i] for i in order],
        "fit": {
            "model": "Bradley-Terry, maximum likelihood (scikit-learn logistic regression, no penalty, +1/-1 design)",
            "scale": "Elo: 400 * log10 of the strength",
            "anchor": ANCHOR,
            "anchored_to": baseline.given if baseline is not None else "the mean rating",
            "ties": "half a win each way",
            "ci": "95% percentile interval over session resamples (sessions, not battles)",
            "resamples": resamples,
            "resamples_failed": fit.failed,
            "resamples_failed_means": "resamples whose battles had no finite fit (one side won every battle drawn), "
            "left out of every CI; ci_resamples per run counts the resamples its CI rests on",
            "seed": seed,
            "sessions": battles.n_sessions,
            "battles": int(len(battles.a)),
            "mm_check": {
                "method": "Hunter (2004) MM iterations on the same battles",
                "max_abs_difference": _round(float(finite.max()) if finite.size else None, 6),
            },
            "online_elo": {"k": 32, "start": ANCHOR, "order": "session, turn, then pair"},
        },
        "win_rates": {
            "runs": [run.given for run in runs],
            "models": labels,
            "matrix": [[_round(v, 4) for v in row] for row in win_rates(battles).tolist()],
            "reads": "row run's share of its battles against the column run, ties counted half",
        },
    }
    separated = unbounded(battles)
    if separated:
        names = ", ".join(runs[i].given for i in separated)
        result["fit"]["warning"] = (
            f"{names} won or lost every battle: the maximum-likelihood rating is unbounded, and the value shown "
            "is where the solver stopped"
        )
    if lc is not None:
        result["length_control"] = {
            "covariate": f"(len_a - len_b) / (len_a + len_b) of the replies in characters, rounded to {COVARIATE_STEP}",
            "coefficient_elo": _round(lc.coefficient, 2),
            "coefficient_ci": [_round(v, 2) for v in lc.coefficient_ci] if lc.coefficient_ci else None,
            "resamples_failed": lc.failed,
        }
    return result
