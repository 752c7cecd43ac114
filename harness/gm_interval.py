"""The geometric-mean reduction with a calibrated Student t interval (docs/methods.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats

from harness import t_calibration as calibration
from harness.inference import CONFIDENCE, Interval, check_level, log_ratios_of, not_computable

WINDOW = calibration.CALIBRATION_WINDOW  # a calibrated interval covers within this of its stated level
CALIBRATED_UP_TO = max(max(table) for table in calibration.NOMINAL_LEVELS.values())


def _table(level: float) -> tuple[float, dict[int, tuple[float, float, float, bool]]] | None:
    """The tabulated stated level equal to ``level`` (within float slack) and its table, or None."""
    check_level(level)
    stated = next((lv for lv in calibration.NOMINAL_LEVELS if abs(lv - level) <= 1e-9), None)
    return None if stated is None else (stated, calibration.NOMINAL_LEVELS[stated])


@dataclass(frozen=True)
class Calibration:
    """The t interval's calibration at one stated level and pair count."""

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
    """The t interval's calibration at ``pairs`` and ``level``; None where not calibrated."""
    found = _table(level)
    if found is None or pairs < 2:
        return None
    stated, table = found
    nominal, skewed, _, keeps = table[min(pairs, max(table))]
    return Calibration(stated, pairs, nominal, skewed, keeps)


def t_min_pairs(level: float = CONFIDENCE) -> int | None:
    """The fewest pairs from which the t interval keeps ``level`` at every larger count."""
    found = _table(level)
    counts = sorted(found[1]) if found else []
    return next((n for i, n in enumerate(counts) if all(found[1][m][3] for m in counts[i:])), None)


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
    """Student t interval of the log ratios at the calibrated nominal level, as reductions."""
    check_level(level)
    x = log_ratios_of(log_ratios)
    n = x.size
    estimand, method = "geometric-mean reduction", "calibrated Student t interval of the mean log ratio"
    if n < 2:
        return not_computable(estimand, method, level, n, f"a t interval needs at least 2 pairs ({n} given)")
    fitted = t_calibration(n, level)
    nominal = level if fitted is None else fitted.nominal
    method += f", {n - 1} df, at nominal level {nominal:.2%}"
    if fitted is not None:
        method += f" (covers {fitted.nominal:.2%} of normal and {fitted.skewed_coverage:.2%} of reference "
        method += f"skewed log ratios at {n} pairs)"
    if not np.all(np.isfinite(x)):
        reason = "a pair with one failed arm has an infinite log ratio: no mean, so no t interval"
        return not_computable(estimand, method, level, n, reason)
    mean, low, high = (float(v) for v in t_log_bounds(x, nominal))
    if fitted is None:
        levels = " and ".join(f"{lv:.0%}" for lv in calibration.NOMINAL_LEVELS)
        sufficient, reason, attained = False, f"the t interval is calibrated only at {levels}", math.nan
    else:
        sufficient, attained, minimum, reason = fitted.keeps, fitted.attained, t_min_pairs(level), ""
    if fitted is not None and not sufficient:
        skew, covers = calibration.REFERENCE_SKEWNESS, fitted.skewed_coverage
        reason = (
            f"at {n} pairs no nominal level keeps {level:.0%} within {100 * WINDOW:.1f} points on the reference "
            f"skewed law (skewness {skew:g}, the committed runs' upper end): the best covers {covers:.1%} there"
            + ("" if minimum is None else f"; sufficient from {minimum} pairs")
        )
    return Interval.of_logs(
        estimand, method, mean, low, high, level, attained, n, sufficient, reason, nominal
    )
