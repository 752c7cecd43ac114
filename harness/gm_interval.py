"""The geometric-mean reduction with a calibrated Student t interval, beside the primary median.

* A Student t interval on the log ratios, at a *nominal* level calibrated per pair count
  (``harness.t_calibration``, made by ``scripts/calibrate_t_interval.py``).
* The calibration holds the coverage within 1.5 points of the stated level on normal log ratios and on the
  *reference skewed law*; where no nominal level does that, the interval is ``insufficient`` at that count.
* The reference law is a pair's log ratio as the difference of two arms' delays, G1 − ½·G2, G gamma
  (``harness.laws.difference_of_delays``), at the upper end of the measured skewness.
* A failed arm gives an infinite log ratio: no mean, so no t interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats

from harness import t_calibration as calibration
from harness.inference import CONFIDENCE, Interval, check_level, log_ratios_of, not_computable
from harness.laws import difference_of_delays

WINDOW = calibration.CALIBRATION_WINDOW  # a calibrated interval covers within this of its stated level
CALIBRATED_UP_TO = max(max(table) for table in calibration.NOMINAL_LEVELS.values())


def _tabulated(table: Mapping[float, object], level: float) -> float | None:
    """The tabulated level equal to ``level`` (within float slack), or None."""
    return next((lv for lv in table if abs(lv - level) <= 1e-9), None)


@dataclass(frozen=True)
class Calibration:
    """The t interval's calibration at one stated level and pair count: the nominal level it is computed
    at, its simulated coverage on the reference skewed law (on normal log ratios it covers the nominal level
    exactly) and whether both lie within ``WINDOW`` of the stated level."""

    stated: float
    pairs: int
    nominal: float
    skewed_coverage: float
    keeps: bool

    @property
    def attained(self) -> float:
        """The lower of the two laws' coverages: what the interval attains at worst on the laws checked."""
        return min(self.nominal, self.skewed_coverage)


def t_calibration(pairs: int, level: float = CONFIDENCE) -> Calibration | None:
    """The calibration of the t interval of ``pairs`` log ratios at the stated ``level``; None for a level
    not calibrated or fewer than 2 pairs. Beyond the table's last count its nominal level is used: the
    skewed law's shortfall only shrinks as pairs grow (the central limit theorem), which the tests check at
    twice the table's last count."""
    check_level(level)
    stated = _tabulated(calibration.NOMINAL_LEVELS, level)
    if stated is None or pairs < 2:
        return None
    table = calibration.NOMINAL_LEVELS[stated]
    nominal, skewed, _, keeps = table[min(pairs, max(table))]
    return Calibration(stated, pairs, nominal, skewed, keeps)


def t_min_pairs(level: float = CONFIDENCE) -> int | None:
    """The fewest pairs from which the calibrated t interval keeps ``level`` at every larger count; None for
    a level not calibrated (``harness.t_calibration`` holds 90% and 95%)."""
    check_level(level)
    stated = _tabulated(calibration.NOMINAL_LEVELS, level)
    if stated is None:
        return None
    table = calibration.NOMINAL_LEVELS[stated]
    counts = sorted(table)
    for index, n in enumerate(counts):
        if all(table[m][3] for m in counts[index:]):
            return n
    return None


def t_unkept_counts_text(level: float = CONFIDENCE) -> str:
    """The pair counts at which no nominal level keeps ``level`` on both laws (the calibrated t interval is
    insufficient there), in words: ``from 3 to 24 pairs`` at 95%; runs of counts joined by commas."""
    check_level(level)
    stated = _tabulated(calibration.NOMINAL_LEVELS, level)
    if stated is None:
        return "at every count (the level is not calibrated)"
    table = calibration.NOMINAL_LEVELS[stated]
    unkept = sorted(n for n in table if not table[n][3])
    runs: list[list[int]] = []
    for n in unkept:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    if not runs:
        return "at no count"
    words = [f"from {r[0]} to {r[-1]}" if len(r) > 1 else f"at {r[0]}" for r in runs]
    return ", ".join(words) + " pairs"


def reference_skewed(rng: np.random.Generator, shape: tuple[int, ...]) -> NDArray[np.float64]:
    """Draws of the reference skewed law of log ratios (mean 0, unit-free: scale them to a spread)."""
    return difference_of_delays(
        rng, shape, calibration.REFERENCE_DELAY_SHAPE, calibration.REFERENCE_SCALE_RATIO
    )


def t_log_bounds(
    log_ratios: ArrayLike, level: float = CONFIDENCE
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Mean log ratio and its Student t bounds along the last axis (finite values, at least 2 per row)."""
    x = np.asarray(log_ratios, dtype=float)
    n = x.shape[-1]
    mean = x.mean(axis=-1)
    half = stats.t.ppf(0.5 + level / 2.0, n - 1) * x.std(axis=-1, ddof=1) / math.sqrt(n)
    return mean, mean - half, mean + half


def t_interval(log_ratios: ArrayLike, level: float = CONFIDENCE) -> Interval:
    """The primary interval: Student t on the log ratios (n − 1 degrees of freedom) at the nominal level
    calibrated for n pairs (``t_calibration``), mapped to reductions; the estimate is the geometric-mean
    ratio as a reduction, 1 − exp(mean log ratio).

    Its coverage is within 1.5 points of ``level`` for normal log ratios (exactly the nominal level) and on
    the reference skewed law (simulated); ``attained_level`` is the lower of the two. At a count where no
    nominal level does that, the interval is computed at the best nominal level found and is insufficient
    (from 3 to 24 pairs at 95% on the committed runs' skewness; 2 pairs' 1-df interval is wide enough)."""
    check_level(level)
    x = log_ratios_of(log_ratios)
    n = x.size
    estimand = "geometric-mean reduction"
    if n < 2:
        method = "calibrated Student t interval of the mean log ratio"
        return not_computable(estimand, method, level, n, f"a t interval needs at least 2 pairs ({n} given)")
    fitted = t_calibration(n, level)
    nominal = level if fitted is None else fitted.nominal
    method = (
        f"calibrated Student t interval of the mean log ratio, {n - 1} df, at nominal level {nominal:.2%}"
        + (
            ""
            if fitted is None
            else f" (covers {fitted.nominal:.2%} of normal and {fitted.skewed_coverage:.2%} of reference "
            f"skewed log ratios at {n} pairs)"
        )
    )
    if not np.all(np.isfinite(x)):
        reason = "a pair with one failed arm has an infinite log ratio: no mean, so no t interval"
        return not_computable(estimand, method, level, n, reason)
    mean, low, high = (float(v) for v in t_log_bounds(x, nominal))
    if fitted is None:
        levels = " and ".join(f"{lv:.0%}" for lv in calibration.NOMINAL_LEVELS)
        sufficient, reason, attained = False, f"the t interval is calibrated only at {levels}", math.nan
    else:
        sufficient, attained = fitted.keeps, fitted.attained
        minimum = t_min_pairs(level)
        reason = (
            ""
            if sufficient
            else f"at {n} pairs no nominal level keeps {level:.0%} within {100 * WINDOW:.1f} points on the "
            f"reference skewed law (skewness {calibration.REFERENCE_SKEWNESS:g}, the committed runs' upper "
            f"end): the best covers {fitted.skewed_coverage:.1%} there"
            + ("" if minimum is None else f"; sufficient from {minimum} pairs")
        )
    return Interval.of_logs(
        estimand,
        method,
        mean,
        low,
        high,
        level,
        attained,
        n,
        sufficient,
        reason,
        nominal,
    )


def describe(level: float = CONFIDENCE) -> str:
    """How the t interval is calibrated, in words, with the pair counts where it is insufficient."""
    text = f"calibrated one-sidedly on the claim pairs' law, skewness to {calibration.REFERENCE_SKEWNESS:g}"
    unkept = t_unkept_counts_text(level)
    return text if unkept == "at no count" else f"{text}; {unkept} it is insufficient"
