"""The claim's primary interval: the median paired reduction between order statistics (docs/methods.md)."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats

from harness import inference
from harness.inference import CONFIDENCE, LEVEL_SLACK, Interval, check_level, log_ratios_of, to_reduction

WINDOW = 0.015  # an interval's attained level may fall this far below the stated one
ESTIMAND = "median reduction"


def exact_levels(n: int) -> NDArray[np.float64]:
    """γ_k for k = 1 … ⌈n/2⌉: the exact level of [x_(k), x_(n+1−k)] as an interval of the median."""
    ranks = np.arange(1, (n + 1) // 2 + 1)
    return 1.0 - 2.0 * stats.binom.cdf(ranks - 1, n, 0.5)


def attained_level(n: int, level: float = CONFIDENCE) -> float:
    """The level the interval of ``n`` pairs attains: ``level``, or the range's where lower."""
    if n < 1:
        return 0.0
    return min(level, float(exact_levels(n)[0]))


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


def median_log_bounds(
    log_ratios: ArrayLike, level: float = CONFIDENCE, interpolate: bool = True
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], float]:
    """Median log ratio, the interval's bounds along the last axis and the level they attain."""
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


def sign_log_bounds(
    log_ratios: ArrayLike, level: float = CONFIDENCE
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], float]:
    """The median's bounds without interpolation: the sign test's, at their exact level."""
    return median_log_bounds(log_ratios, level, interpolate=False)


def sign_test_rank(n: int, level: float = CONFIDENCE) -> tuple[int, float]:
    """The largest k whose order-statistic interval attains ``level`` (1 where none does), and its level."""
    check_level(level)
    if n < 1:
        return 0, 0.0
    k, _ = _weights(n, level)
    return k, float(exact_levels(n)[k - 1])


def _interval(log_ratios: ArrayLike, level: float, exact: bool) -> Interval:
    """The median's interval: interpolated to ``level``, or exact (the sign test's)."""
    check_level(level)
    x = log_ratios_of(log_ratios)
    n = x.size
    if n < 1:
        method = "sign test" if exact else "order statistics"
        return inference.not_computable(ESTIMAND, method, level, 0, "no pairs")
    median, low, high, attained = median_log_bounds(x, level, interpolate=not exact)
    k, weight = _weights(n, level)
    method = f"order statistics {k} and {n + 1 - k} of {n}"
    if exact:
        method += " (sign test, binomial(n, 1/2)); exact for any continuous law"
        sufficient, needs = attained >= level - LEVEL_SLACK, inference.pairs_for_range(level)
    else:
        if weight:
            method += f", interpolated toward {k + 1} and {n - k} (weight {weight:.3f})"
        method += f"; covers the median at {attained:.2%} on any continuous law"
        sufficient, needs = keeps_level(attained, level), min_pairs(level)
    reason = "" if sufficient else inference.short_of(n, "their range", attained, level, needs)
    estimate = np.median(to_reduction(x)) if exact else to_reduction(median)  # sign test: reductions'
    bounds = (float(to_reduction(v)) for v in (high, low))
    return Interval(ESTIMAND, method, float(estimate), *bounds, level, attained, n, sufficient, reason)


def median_interval(log_ratios: ArrayLike, level: float = CONFIDENCE) -> Interval:
    """The primary interval of the median reduction at ``level`` (see the module's rule)."""
    return _interval(log_ratios, level, exact=False)


def sign_interval(log_ratios: ArrayLike, level: float = CONFIDENCE) -> Interval:
    """The exact sign-test interval of the median reduction."""
    return _interval(log_ratios, level, exact=True)
