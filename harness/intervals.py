"""Paired log ratios' intervals as reductions: the median's (primary), sign test, Hodges-Lehmann, geometric-mean t.

The methods and their conventions are stated in docs/methods.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats

from harness import t_calibration as calibration

CONFIDENCE = 0.95
LEVEL_SLACK = 1e-12  # float slack when comparing an exact attained level with the level asked for
WINDOW = 0.015  # an interval's attained level may fall this far below the stated one
ESTIMAND = "median reduction"
Bounds = tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], float]


def check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"a confidence level is a fraction in (0, 1) (got {level})")


@dataclass(frozen=True, eq=False)
class PairSplit:
    """Usable pairs' log ratios, which pairs were kept, and how many had both arms failed."""

    log_ratios: NDArray[np.float64]
    kept: NDArray[np.bool_]
    both_failed: int


def split_pairs(baseline: ArrayLike, arm: ArrayLike) -> PairSplit:
    """Log ratios log(c/b) of the pairs (b, c); a non-finite time is a failed trial."""
    b = np.asarray(baseline, dtype=float).ravel()
    c = np.asarray(arm, dtype=float).ravel()
    if b.shape != c.shape:
        raise ValueError(f"baseline and arm need one time per pair each (got {b.size} and {c.size})")
    b_failed, c_failed = ~np.isfinite(b), ~np.isfinite(c)
    if np.any(b[~b_failed] <= 0) or np.any(c[~c_failed] <= 0):
        raise ValueError("times must be positive")
    kept = ~(b_failed & c_failed)
    finished = ~(b_failed | c_failed)
    ratios = np.log(np.where(finished, c, 1.0) / np.where(finished, b, 1.0))
    ratios = np.where(c_failed, math.inf, np.where(b_failed, -math.inf, ratios))
    return PairSplit(log_ratios=ratios[kept], kept=kept, both_failed=int((~kept).sum()))


def to_reduction(log_ratio: ArrayLike) -> NDArray[np.float64]:
    """Reduction 1 − exp(log ratio): +∞ maps to −∞, −∞ to +100%."""
    return 1.0 - np.exp(np.asarray(log_ratio, dtype=float))


@dataclass(frozen=True)
class Interval:
    """An interval of reductions with the method that made it and the level it attains with its pairs."""

    estimand: str
    method: str
    estimate: float
    low: float
    high: float
    stated_level: float
    attained_level: float
    n: int
    sufficient: bool
    reason: str = ""
    nominal_level: float = math.nan

    @property
    def computable(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high))

    @property
    def half_width(self) -> float:
        """Half the interval's width in percentage points of reduction (the stopping rule's precision)."""
        return 100.0 * (self.high - self.low) / 2.0


def _of_logs(estimand: str, method: str, estimate: float, low: float, high: float, *rest) -> Interval:
    """An interval from log-ratio bounds; the ends swap, as a higher log ratio is a lower reduction."""
    return Interval(estimand, method, estimate, *(float(to_reduction(v)) for v in (high, low)), *rest)


def log_ratios_of(values: ArrayLike, level: float) -> NDArray[np.float64]:
    """The log ratios as a flat array, once ``level`` and the values are checked."""
    check_level(level)
    x = np.asarray(values, dtype=float).ravel()
    if np.any(np.isnan(x)):
        raise ValueError("log ratios must not be NaN (split_pairs drops a pair whose arms both failed)")
    return x


def _refusal(
    x: NDArray, level: float, estimand: str, method: str, least: int, undefined: str = ""
) -> Interval | None:
    """The not-computable interval where ``x`` has fewer than ``least`` values, or an infinite one."""
    if x.size < least:
        reason = "no pairs" if least == 1 else f"a t interval needs at least 2 pairs ({x.size} given)"
    elif undefined and not np.all(np.isfinite(x)):
        reason = f"a pair with one failed arm has an infinite log ratio: {undefined}"
    else:
        return None
    return Interval(estimand, method, math.nan, math.nan, math.nan, level, math.nan, x.size, False, reason)


def short_of(n: int, widest: str, attained: float, level: float, needs: int) -> str:
    """Why an interval of ``n`` pairs is insufficient: even its widest form attains less than ``level``."""
    return f"{n} pairs: even {widest} attains only {attained:.2%}; {level:.0%} needs {needs}"


def pairs_for_range(level: float) -> int:
    """The fewest pairs whose range attains ``level`` as an interval of the median (6 at 95%)."""
    return max(1, math.ceil(math.log2(2.0 / (1.0 - level)) - 1e-9))


# ------------------------------------------------------------------ the median's: order statistics


def exact_levels(n: int) -> NDArray[np.float64]:
    """γ_k for k = 1 … ⌈n/2⌉: the exact level of [x_(k), x_(n+1−k)] as an interval of the median."""
    ranks = np.arange(1, (n + 1) // 2 + 1)
    return 1.0 - 2.0 * stats.binom.cdf(ranks - 1, n, 0.5)


def attained_level(n: int, level: float = CONFIDENCE) -> float:
    """The level the interval of ``n`` pairs attains: ``level``, or the range's where lower."""
    return min(level, float(exact_levels(n)[0])) if n >= 1 else 0.0


def keeps_level(attained: float, level: float = CONFIDENCE) -> bool:
    """The one sufficiency rule: an attained level no more than ``WINDOW`` below the stated one."""
    return attained >= level - WINDOW - LEVEL_SLACK


def min_pairs(level: float = CONFIDENCE) -> int:
    """The fewest pairs whose interval keeps ``level`` (5 at 95%, 4 at 90%)."""
    n = 1
    while not keeps_level(attained_level(n, level), level):
        n += 1
    return n


def _weights(n: int, level: float) -> tuple[int, float]:
    """The order statistic k and the interpolation weight λ toward x_(k+1) for ``level`` at ``n``."""
    gammas = exact_levels(n)
    reaching = np.nonzero(gammas >= level - LEVEL_SLACK)[0]
    if reaching.size == 0:
        return 1, 0.0  # the range, at its own level
    k = int(reaching.max()) + 1
    if k == gammas.size or abs(gammas[k - 1] - level) <= LEVEL_SLACK:
        return k, 0.0
    share = (gammas[k - 1] - level) / (gammas[k - 1] - gammas[k])
    return k, float((n - k) * share / (k + (n - 2 * k) * share))


def _between(near: NDArray[np.float64], far: NDArray[np.float64], weight: float) -> NDArray[np.float64]:
    """(1 − w)·near + w·far, where an infinite ``near`` (a failure's rank) stays infinite."""
    if weight == 0.0:
        return near
    with np.errstate(invalid="ignore"):
        mixed = (1.0 - weight) * near + weight * far
    return np.where(np.isinf(near), near, mixed)


def median_log_bounds(log_ratios: ArrayLike, level: float = CONFIDENCE, interpolate: bool = True) -> Bounds:
    """Median log ratio, the interval's bounds along the last axis and the level they attain.

    Without ``interpolate``: the sign test's bounds, at their exact level.
    """
    x = np.sort(np.asarray(log_ratios, dtype=float), axis=-1)
    n = x.shape[-1]
    k, weight = _weights(n, level)
    if not interpolate:
        weight, attained = 0.0, sign_test_rank(n, level)[1]
    low = _between(x[..., k - 1], x[..., min(k, n - 1)], weight)
    high = _between(x[..., n - k], x[..., max(n - k - 1, 0)], weight)
    with np.errstate(invalid="ignore"):  # +∞ and −∞ in the middle: no median, NaN
        median = np.median(x, axis=-1)
    return median, low, high, attained_level(n, level) if interpolate else attained


def sign_test_rank(n: int, level: float = CONFIDENCE) -> tuple[int, float]:
    """The largest k whose order-statistic interval attains ``level`` (1 where none does), and its level."""
    check_level(level)
    if n < 1:
        return 0, 0.0
    k, _ = _weights(n, level)
    return k, float(exact_levels(n)[k - 1])


def _median(log_ratios: ArrayLike, level: float, exact: bool) -> Interval:
    """The median's interval: interpolated to ``level``, or exact (the sign test's)."""
    x = log_ratios_of(log_ratios, level)
    n = x.size
    refused = _refusal(x, level, ESTIMAND, "sign test" if exact else "order statistics", 1)
    if refused:
        return refused
    median, low, high, attained = median_log_bounds(x, level, interpolate=not exact)
    k, weight = _weights(n, level)
    method = f"order statistics {k} and {n + 1 - k} of {n}"
    if exact:
        method += " (sign test, binomial(n, 1/2)); exact for any continuous law"
        sufficient, needs = attained >= level - LEVEL_SLACK, pairs_for_range(level)
    else:
        if weight:
            method += f", interpolated toward {k + 1} and {n - k} (weight {weight:.3f})"
        method += f"; covers the median at {attained:.2%} on any continuous law"
        sufficient, needs = keeps_level(attained, level), min_pairs(level)
    reason = "" if sufficient else short_of(n, "their range", attained, level, needs)
    estimate = np.median(to_reduction(x)) if exact else to_reduction(median)  # sign test: reductions'
    return _of_logs(ESTIMAND, method, float(estimate), low, high, level, attained, n, sufficient, reason)


def median_interval(log_ratios: ArrayLike, level: float = CONFIDENCE) -> Interval:
    """The primary interval of the median reduction at ``level`` (see the module's rule)."""
    return _median(log_ratios, level, exact=False)


def sign_interval(log_ratios: ArrayLike, level: float = CONFIDENCE) -> Interval:
    """The exact sign-test interval of the median reduction."""
    return _median(log_ratios, level, exact=True)


# ------------------------------------------------------------------ Hodges-Lehmann: Wilcoxon signed ranks


def signed_rank_null(n: int) -> NDArray[np.float64]:
    """Exact null distribution of the Wilcoxon signed-rank statistic T+ of n values."""
    if n < 0:
        raise ValueError("n must be at least 0")
    total = n * (n + 1) // 2
    probability = np.zeros(total + 1)
    probability[0] = 1.0
    for rank in range(1, n + 1):
        shifted = np.zeros_like(probability)
        shifted[rank:] = probability[: total + 1 - rank]
        probability = (probability + shifted) / 2.0
    return probability


def signed_rank_rank(n: int, level: float = CONFIDENCE) -> tuple[int, float]:
    """The Walsh-average rank k that attains ``level`` (1 where none does) and its exact level."""
    check_level(level)
    if n < 1:
        return 0, 0.0
    total = n * (n + 1) // 2
    ranks = np.arange(1, (total + 1) // 2 + 1)
    attained = 1.0 - 2.0 * np.cumsum(signed_rank_null(n))[ranks - 1]
    reaching = ranks[attained >= level - LEVEL_SLACK]
    k = int(reaching.max()) if reaching.size else 1
    return k, float(attained[k - 1])


def hodges_lehmann_log_bounds(log_ratios: ArrayLike, level: float = CONFIDENCE) -> Bounds:
    """Hodges–Lehmann estimate of the log ratio, its Wilcoxon bounds along the last axis, their level."""
    x = np.asarray(log_ratios, dtype=float)
    i, j = np.triu_indices(x.shape[-1])
    walsh = np.sort((x[..., i] + x[..., j]) / 2.0, axis=-1)
    k, attained = signed_rank_rank(x.shape[-1], level)
    return np.median(walsh, axis=-1), walsh[..., k - 1], walsh[..., walsh.shape[-1] - k], attained


def hodges_lehmann_interval(log_ratios: ArrayLike, level: float = CONFIDENCE) -> Interval:
    """Hodges–Lehmann estimate with its exact Wilcoxon signed-rank interval, as reductions."""
    x = log_ratios_of(log_ratios, level)
    n, total = x.size, x.size * (x.size + 1) // 2
    estimand = "Hodges-Lehmann (pseudo-median) reduction"
    method = (
        "Hodges-Lehmann: median of Walsh averages; Wilcoxon signed-rank interval, exact null distribution"
    )
    refused = _refusal(x, level, estimand, method, 1, "Walsh averages are undefined")
    if refused:
        return refused
    centre, low, high, attained = hodges_lehmann_log_bounds(x, level)
    k, _ = signed_rank_rank(n, level)
    method += f", Walsh averages {k} and {total + 1 - k} of {total}"
    sufficient = attained >= level - LEVEL_SLACK
    widest = "the widest Wilcoxon interval"
    reason = "" if sufficient else short_of(n, widest, attained, level, pairs_for_range(level))
    estimate = float(to_reduction(centre))
    return _of_logs(estimand, method, estimate, low, high, level, attained, n, sufficient, reason)


# ------------------------------------------------------------------ the geometric mean's: calibrated t


class Calibration(NamedTuple):
    """The t interval's calibration at one stated level and pair count: a row of the calibration table."""

    nominal: float
    skewed_coverage: float
    distance: float  # the larger distance from the stated level over the two laws
    keeps: bool


def _table(level: float) -> dict[int, tuple[float, float, float, bool]]:
    """The calibration table of the stated level equal to ``level`` (within float slack); empty if none."""
    check_level(level)
    return next((t for lv, t in calibration.NOMINAL_LEVELS.items() if abs(lv - level) <= 1e-9), {})


def t_calibration(pairs: int, level: float = CONFIDENCE) -> Calibration | None:
    """The t interval's calibration at ``pairs`` and ``level``; None where not calibrated."""
    table = _table(level)
    return Calibration(*table[min(pairs, max(table))]) if table and pairs >= 2 else None


def t_min_pairs(level: float = CONFIDENCE) -> int | None:
    """The fewest pairs from which the t interval keeps ``level`` at every larger count."""
    table = _table(level)
    counts = sorted(table)
    return next((n for i, n in enumerate(counts) if all(table[m][3] for m in counts[i:])), None)


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
    x = log_ratios_of(log_ratios, level)
    n = x.size
    estimand, method = "geometric-mean reduction", "calibrated Student t interval of the mean log ratio"
    refused = _refusal(x, level, estimand, method, 2)
    if refused:
        return refused
    fitted = t_calibration(n, level)
    nominal = level if fitted is None else fitted.nominal
    method += f", {n - 1} df, at nominal level {nominal:.2%}"
    if fitted is not None:
        method += f" (covers {fitted.nominal:.2%} of normal and {fitted.skewed_coverage:.2%} of reference "
        method += f"skewed log ratios at {n} pairs)"
    refused = _refusal(x, level, estimand, method, 0, "no mean, so no t interval")
    if refused:
        return refused
    mean, low, high = (float(v) for v in t_log_bounds(x, nominal))
    if fitted is None:
        levels = " and ".join(f"{lv:.0%}" for lv in calibration.NOMINAL_LEVELS)
        sufficient, attained, reason = False, math.nan, f"the t interval is calibrated only at {levels}"
    else:
        sufficient, attained, reason = fitted.keeps, min(fitted.nominal, fitted.skewed_coverage), ""
    if fitted is not None and not sufficient:
        skew, covers, minimum = calibration.REFERENCE_SKEWNESS, fitted.skewed_coverage, t_min_pairs(level)
        reason = (
            f"at {n} pairs no nominal level keeps {level:.0%} within {100 * calibration.CALIBRATION_WINDOW:.1f} "
            f"points on the reference skewed law (skewness {skew:g}, the committed runs' upper end): the best "
            f"covers {covers:.1%} there" + ("" if minimum is None else f"; sufficient from {minimum} pairs")
        )
    estimate = float(to_reduction(mean))
    return _of_logs(estimand, method, estimate, low, high, level, attained, n, sufficient, reason, nominal)


# ------------------------------------------------------------------ verdicts


def claim_verdict(interval: Interval, bar: float) -> str:
    """A claim's verdict against a bar (a fraction): clears, fails, ambiguous or insufficient."""
    if not (interval.sufficient and interval.computable):
        return "insufficient"
    return "clears" if interval.low > bar else "fails" if interval.high < bar else "ambiguous"


def control_verdict(interval: Interval, tolerance: float) -> str:
    """An A/A control's verdict against ±tolerance: within, outside, ambiguous or insufficient."""
    if tolerance <= 0:
        raise ValueError(f"a tolerance is a positive fraction (got {tolerance})")
    if not (interval.sufficient and interval.computable):
        return "insufficient"
    if -tolerance < interval.low and interval.high < tolerance:
        return "within"
    return "outside" if interval.low > tolerance or interval.high < -tolerance else "ambiguous"
