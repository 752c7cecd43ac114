"""The calibration arm's reading: how much of a known injected delay a design recovers (docs/methods.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from harness import intervals
from harness.injected import FIGURE, ROLE
from harness.intervals import CONFIDENCE
from harness.stats import measured

MARGIN = 0.1  # an interval inside 0.9-1.1 is recovered even where it misses 1 (the target band)


@dataclass(frozen=True)
class Recovered:
    """Recovered/known: the estimate, its interval, the level it attains, the pairs, and a verdict."""

    estimate: float
    low: float
    high: float
    attained: float
    pairs: int
    verdict: str


def recovered(
    baseline: ArrayLike, delayed: ArrayLike, known_seconds: ArrayLike, level: float = CONFIDENCE
) -> Recovered:
    """The recovered/known ratio of a known delay from paired trial times, with a verdict."""
    b, c = np.asarray(baseline, dtype=float).ravel(), np.asarray(delayed, dtype=float).ravel()
    if b.shape != c.shape:
        raise ValueError(f"need one time per pair from each arm (got {b.size} and {c.size})")
    known = np.broadcast_to(np.asarray(known_seconds, dtype=float), b.shape)
    if np.any(known <= 0) or np.any(np.isinf(known)):
        raise ValueError(f"a known delay is a positive number of seconds (got {known_seconds})")
    keep = np.isfinite(b) & np.isfinite(c) & np.isfinite(known)
    ratio = (c[keep] - b[keep]) / known[keep]
    if ratio.size == 0:
        return Recovered(math.nan, math.nan, math.nan, 0.0, 0, "insufficient")
    median, low, high, attained = intervals.median_log_bounds(ratio, level)
    if not intervals.keeps_level(attained, level):
        verdict = "insufficient"
    else:
        inside = 1.0 - MARGIN <= low and high <= 1.0 + MARGIN
        verdict = "recovered" if low <= 1.0 <= high or inside else "biased"
    return Recovered(float(median), float(low), float(high), attained, int(ratio.size), verdict)


@dataclass(frozen=True)
class Reading:
    """One case's calibration: the known delay (median of the measured sleeps) and what the design recovered."""

    case: str
    known_s: float
    result: Recovered

    @property
    def text(self) -> str:
        """One line: the answer first, in words."""
        r = self.result
        if not math.isfinite(r.estimate):
            return f"calibration: {r.verdict}: no pairs with a finished delay ({self.case})"
        return (
            f"calibration: {r.verdict}: {r.estimate:.2f} of a known {self.known_s:.3g} s delay recovered "
            f"[{r.low:.2f}, {r.high:.2f}] at {r.attained:.1%}, {r.pairs} pairs"
        )


def readings(trials: pd.DataFrame, level: float = CONFIDENCE) -> list[Reading]:
    """The calibration arm's reading per case, from the measured trials of a run's log."""
    if trials.empty or "role" not in trials or not (trials["role"] == ROLE).any():
        return []
    out = []
    for case, group in measured(trials).groupby("case", sort=False):
        base = group[group["role"] == "baseline"].set_index("round")
        delayed = group[group["role"] == ROLE].set_index("round")
        rounds = base.index.intersection(delayed.index)
        if delayed.empty:
            continue
        b, c = (frame.loc[rounds, "effective"].to_numpy(dtype=float) for frame in (base, delayed))
        known = pd.to_numeric(delayed.loc[rounds].get(FIGURE), errors="coerce").to_numpy(dtype=float)
        typical = float(np.nanmedian(known)) if np.isfinite(known).any() else math.nan
        out.append(Reading(str(case), typical, recovered(b, c, known, level)))
    return out
