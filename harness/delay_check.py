"""The calibration arm's reading: how much of a known injected delay a design recovers.

A calibration arm is the baseline with a known host-side delay of D seconds per trial, run in the same
schedule. Each pair gives the delay the design saw, arm time − baseline time. Their median over D is the
recovered/known ratio, with the primary's order-statistic interval (``harness.intervals``) on the same
differences, so its coverage is that interval's. A ratio whose interval holds 1 shows no bias at that size;
a duet's mutual slow-down, for one, reads below 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from harness import intervals
from harness.inference import CONFIDENCE


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
    baseline: ArrayLike, delayed: ArrayLike, known_seconds: float, level: float = CONFIDENCE
) -> Recovered:
    """The recovered/known ratio of a known delay from paired trial times (seconds; a failed trial is NaN or
    ∞ and leaves its pair out). ``verdict``: ``recovered`` (the interval holds 1), ``biased`` (it does not)
    or ``insufficient`` (too few pairs for the stated level)."""
    if not (known_seconds > 0 and math.isfinite(known_seconds)):
        raise ValueError(f"a known delay is a positive number of seconds (got {known_seconds})")
    b, c = np.asarray(baseline, dtype=float).ravel(), np.asarray(delayed, dtype=float).ravel()
    if b.shape != c.shape:
        raise ValueError(f"need one time per pair from each arm (got {b.size} and {c.size})")
    keep = np.isfinite(b) & np.isfinite(c)
    ratio = (c[keep] - b[keep]) / known_seconds
    if ratio.size == 0:
        return Recovered(math.nan, math.nan, math.nan, 0.0, 0, "insufficient")
    median, low, high, attained = intervals.median_log_bounds(ratio, level)
    if not intervals.keeps_level(attained, level):
        verdict = "insufficient"
    else:
        verdict = "recovered" if low <= 1.0 <= high else "biased"
    return Recovered(float(median), float(low), float(high), attained, int(ratio.size), verdict)
