"""Verdict words and the failure rate beside a timing claim (the rule is stated once in docs/methods.md)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
from scipy import stats

from harness.intervals import Interval, claim_verdict

DIRECTION_WORDS = {"clears": "faster", "fails": "slower", "ambiguous": "no difference detected"}


def direction(interval: Interval) -> str:
    """The verdict without a bar: is the arm faster than the baseline at all?"""
    verdict = claim_verdict(interval, 0.0)
    return DIRECTION_WORDS.get(verdict, verdict)


def rate_interval(failed: int, trials: int, level: float) -> tuple[float, float]:
    """The Clopper-Pearson interval of a failure rate (exact; NaN without trials)."""
    if trials < 1:
        return math.nan, math.nan
    found = stats.binomtest(failed, trials).proportion_ci(level, method="exact")
    return float(found.low), float(found.high)


def failure_rate(trials: pd.DataFrame, case: Any, arm: Any, level: float) -> dict[str, Any]:
    """The arm's measured trials that failed, as its own figure with an interval."""
    if trials.empty or "phase" not in trials:
        mine = trials
    else:
        mine = trials[(trials["phase"] == "measured") & (trials["case"] == case) & (trials["arm"] == arm)]
    count = len(mine)
    failed = int((mine["status"] != "ok").sum()) if count else 0
    low, high = rate_interval(failed, count, level)
    keys = ("failed_trials", "arm_trials", "failure_rate", "failure_low", "failure_high")
    return dict(zip(keys, (failed, count, failed / count if count else math.nan, low, high), strict=True))
