"""Small-sample inference for paired timings: the intervals beside the primary, verdicts that know their
limits, planning, design diagnostics and instability flags. The primary interval (the median's) is in
``harness.intervals``; the stopping rule in ``harness.sequential``.

Pure functions over numpy arrays. Conventions, stated once:

* A *pair* is a baseline time b and an arm time c (lower is better). Its log ratio is log(c/b) and its
  reduction (b − c)/b = 1 − exp(log ratio). That map is decreasing, so a log-ratio interval [lo, hi] is
  the reduction interval [1 − exp(hi), 1 − exp(lo)].
* A failed trial is a non-finite time. A pair whose two arms both failed is no evidence: ``split_pairs``
  drops and counts it. A pair with one failed arm has a log ratio of +∞ (the arm failed; reduction −∞) or
  −∞ (the baseline failed; reduction +100%): means and Walsh averages do not exist then, order statistics
  still do (the infinities rank at the ends).
* Levels are two-sided confidence levels in (0, 1). Every interval states the level asked for and the level
  it attains with the pairs given, and is ``sufficient`` only when it keeps the asked level.
* The geometric-mean interval (the primary until the median's replaced it; kept beside it) is a Student t
  interval on the log ratios at a *nominal* level calibrated per pair
  count (``harness.t_calibration``, made by ``scripts/calibrate_t_interval.py``) so that its coverage is
  within 1.5 points of the stated level both for normal log ratios and on the *reference skewed law*; where
  no nominal level does that, it is ``insufficient`` at that count.
* The reference skewed law is calibrated from measured noise: the skewness of the committed H200 fit runs'
  log ratios (the sequential design's five runs, each centred on its median, pooled: 1.08 over 19 pairs, 95%
  bootstrap interval −1.26 to 2.28) is matched at its upper end by a pair's log ratio as the difference of
  two arms' delays with unequal scales, G1 − ½·G2, G ~ gamma(0.302), skewness 2.28 (two exponential delays
  reach at most 2). ``difference_of_delays`` draws it; ``harness.t_calibration`` holds the figures.
* The distribution-free checks (sign test, Hodges–Lehmann) attain their levels exactly, and their tests
  also check them on a centred exponential (skewness 2).
* Verdicts read closed intervals: an end that touches the bar (or ±tolerance) exactly counts as straddling
  it, so ``clears``, ``fails``, ``within`` and ``outside`` need strict inequalities.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats

from harness import t_calibration as calibration

CONFIDENCE = 0.95
LEVEL_SLACK = 1e-12  # float slack when comparing an exact attained level with the level asked for
WINDOW = calibration.CALIBRATION_WINDOW  # a calibrated interval covers within this of its stated level
CALIBRATED_UP_TO = max(max(table) for table in calibration.NOMINAL_LEVELS.values())


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"a confidence level is a fraction in (0, 1) (got {level})")


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
    _check_level(level)
    stated = _tabulated(calibration.NOMINAL_LEVELS, level)
    if stated is None or pairs < 2:
        return None
    table = calibration.NOMINAL_LEVELS[stated]
    nominal, skewed, _, keeps = table[min(pairs, max(table))]
    return Calibration(stated, pairs, nominal, skewed, keeps)


def t_min_pairs(level: float = CONFIDENCE) -> int | None:
    """The fewest pairs from which the calibrated t interval keeps ``level`` at every larger count; None for
    a level not calibrated (``harness.t_calibration`` holds 90% and 95%)."""
    _check_level(level)
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
    _check_level(level)
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


# ----------------------------------------------------------------------------------- reference laws


def delays_skewness(delay_shape: float, scale_ratio: float) -> float:
    """Skewness of G1 − r·G2 for independent gamma(k, 1) delays G1, G2: cumulants κ2 = k(1 + r²) and
    κ3 = 2k(1 − r³) give 2(1 − r³) / (√k (1 + r²)^1.5); two exponential delays (k = 1) reach at most 2."""
    return 2.0 * (1.0 - scale_ratio**3) / (math.sqrt(delay_shape) * (1.0 + scale_ratio**2) ** 1.5)


def delay_shape_for(skewness: float, scale_ratio: float) -> float:
    """The gamma shape k at which G1 − r·G2 has the given skewness (the inverse of ``delays_skewness``)."""
    if skewness <= 0:
        raise ValueError(f"a skewed reference law needs a positive skewness (got {skewness})")
    return (2.0 * (1.0 - scale_ratio**3) / (skewness * (1.0 + scale_ratio**2) ** 1.5)) ** 2


def difference_of_delays(
    rng: np.random.Generator, shape: tuple[int, ...], delay_shape: float, scale_ratio: float
) -> NDArray[np.float64]:
    """Draws of a paired log ratio as the difference of two arms' delays, centred: G1 − r·G2 − k(1 − r),
    G1, G2 ~ gamma(k, 1) independent (mean 0, variance k(1 + r²), skewness ``delays_skewness(k, r)``)."""
    first = rng.gamma(delay_shape, 1.0, shape)
    second = rng.gamma(delay_shape, 1.0, shape)
    return first - scale_ratio * second - delay_shape * (1.0 - scale_ratio)


# ---------------------------------------------------------------------------------------------- pairs


@dataclass(frozen=True, eq=False)
class PairSplit:
    """Pairs split into evidence and no evidence: ``log_ratios`` of the usable pairs in their given order
    (±∞ where one arm failed), ``kept`` marks them among the pairs given, ``both_failed`` counts the rest."""

    log_ratios: NDArray[np.float64]
    kept: NDArray[np.bool_]
    both_failed: int

    @property
    def n(self) -> int:
        return int(self.log_ratios.size)

    @property
    def one_failed(self) -> int:
        return int(np.isinf(self.log_ratios).sum())


def split_pairs(baseline: ArrayLike, arm: ArrayLike) -> PairSplit:
    """Log ratios log(c/b) of the pairs (b, c); a non-finite time is a failed trial. Pairs where both arms
    failed are dropped and counted; one failed arm gives ±∞."""
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


def _log_ratios(values: ArrayLike) -> NDArray[np.float64]:
    x = np.asarray(values, dtype=float).ravel()
    if np.any(np.isnan(x)):
        raise ValueError(
            "log ratios must not be NaN (a pair where both arms failed is dropped by split_pairs)"
        )
    return x


def to_reduction(log_ratio: ArrayLike) -> NDArray[np.float64]:
    """Reduction 1 − exp(log ratio): +∞ maps to −∞, −∞ to +100%."""
    return 1.0 - np.exp(np.asarray(log_ratio, dtype=float))


# ------------------------------------------------------------------------------------------- intervals


@dataclass(frozen=True)
class Interval:
    """An interval of reductions with the method that made it and the level it attains with its pairs.

    ``stated_level`` is the level asked for; ``attained_level`` the level this interval attains (exactly,
    under the method's stated assumption; for the calibrated t interval the lower of its coverages on the
    laws it was calibrated on); ``sufficient`` says whether it keeps the stated level (and why not in
    ``reason``). Not computable: ``low`` and ``high`` are NaN."""

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
    nominal_level: float = (
        math.nan
    )  # the level the interval was computed at, where it differs from the stated

    @property
    def computable(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high))

    @property
    def half_width(self) -> float:
        """Half the interval's width in percentage points of reduction (the stopping rule's precision)."""
        return 100.0 * (self.high - self.low) / 2.0

    @classmethod
    def of_logs(
        cls, estimand: str, method: str, centre: Any, low_log: Any, high_log: Any, *rest: Any
    ) -> Interval:
        """An interval from bounds on the log ratio: a higher log ratio is a lower reduction, so the ends
        swap. ``rest``: stated level, attained level, pairs, sufficient, reason (and the nominal level)."""
        return cls(
            estimand,
            method,
            float(to_reduction(centre)),
            float(to_reduction(high_log)),
            float(to_reduction(low_log)),
            *rest,
        )


def _not_computable(estimand: str, method: str, level: float, n: int, reason: str) -> Interval:
    return Interval(estimand, method, math.nan, math.nan, math.nan, level, math.nan, n, False, reason)


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
    _check_level(level)
    x = _log_ratios(log_ratios)
    n = x.size
    estimand = "geometric-mean reduction"
    if n < 2:
        method = "calibrated Student t interval of the mean log ratio"
        return _not_computable(estimand, method, level, n, f"a t interval needs at least 2 pairs ({n} given)")
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
        return _not_computable(estimand, method, level, n, reason)
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


def sign_test_rank(n: int, level: float = CONFIDENCE) -> tuple[int, float]:
    """The order statistic k and the exact level of [x_(k), x_(n+1−k)] as an interval of the median.

    x_(k) lies below the median unless at most k − 1 of n values do, so the interval covers with probability
    1 − 2·P(B ≤ k − 1), B ~ binomial(n, ½), for any continuous law. k is the largest that attains ``level``;
    when even the range (k = 1, level 1 − 2·0.5ⁿ) falls short, k = 1 with the level it attains."""
    _check_level(level)
    if n < 1:
        return 0, 0.0
    ranks = np.arange(1, (n + 1) // 2 + 1)
    attained = 1.0 - 2.0 * stats.binom.cdf(ranks - 1, n, 0.5)
    reaching = ranks[attained >= level - LEVEL_SLACK]
    k = int(reaching.max()) if reaching.size else 1
    return k, float(attained[k - 1])


def _pairs_for_range(level: float) -> int:
    """The fewest pairs whose range attains ``level`` as an interval of the median (6 at 95%)."""
    return max(1, math.ceil(math.log2(2.0 / (1.0 - level)) - 1e-9))


def sign_log_bounds(
    log_ratios: ArrayLike, level: float = CONFIDENCE
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], float]:
    """Median log ratio, the order-statistic bounds along the last axis and their exact level."""
    x = np.sort(np.asarray(log_ratios, dtype=float), axis=-1)
    n = x.shape[-1]
    k, attained = sign_test_rank(n, level)
    with np.errstate(invalid="ignore"):  # a failed arm on each side (+∞ and −∞ in the middle): no median, nan
        median = np.median(x, axis=-1)
    return median, x[..., k - 1], x[..., n - k], attained


def sign_interval(log_ratios: ArrayLike, level: float = CONFIDENCE) -> Interval:
    """Distribution-free check: the exact order-statistic (sign-test) interval of the median reduction.

    Exact for any continuous law of log ratios; infinities (one failed arm) rank at the ends, so it is
    computable with failures. Sufficient when some pair of order statistics attains ``level`` (6 pairs at
    95%); otherwise it gives the range with the level the range attains."""
    _check_level(level)
    x = _log_ratios(log_ratios)
    n = x.size
    estimand = "median reduction"
    if n < 1:
        return _not_computable(estimand, "order-statistic interval of the median", level, 0, "no pairs")
    _, low_log, high_log, attained = sign_log_bounds(x, level)
    k, _ = sign_test_rank(n, level)
    method = (
        f"order statistics {k} and {n + 1 - k} of {n} (sign test, binomial(n, 1/2)); "
        "exact for any continuous law"
    )
    sufficient = attained >= level - LEVEL_SLACK
    reason = (
        ""
        if sufficient
        else f"{n} pairs: even their range attains only {attained:.2%}; "
        f"{level:.0%} needs {_pairs_for_range(level)}"
    )
    return Interval(
        estimand,
        method,
        float(np.median(to_reduction(x))),
        float(to_reduction(high_log)),
        float(to_reduction(low_log)),
        level,
        attained,
        n,
        sufficient,
        reason,
    )


def signed_rank_null(n: int) -> NDArray[np.float64]:
    """Exact null distribution of the Wilcoxon signed-rank statistic T+ of n values: P(T+ = t), t = 0 …
    n(n+1)/2 (each rank joins the sum with probability ½, independently). scipy computes it only inside
    ``scipy.stats.wilcoxon``, so it is built here by convolution, rank by rank."""
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
    """The Walsh-average order statistic k and the exact level of [W_(k), W_(M+1−k)], M = n(n+1)/2: it
    covers the centre with probability 1 − 2·P(T+ ≤ k − 1) for a continuous law symmetric about it. k is
    the largest that attains ``level``; when none does, k = 1 (the range) with the level it attains."""
    _check_level(level)
    if n < 1:
        return 0, 0.0
    cumulative = np.cumsum(signed_rank_null(n))
    total = n * (n + 1) // 2
    ranks = np.arange(1, (total + 1) // 2 + 1)
    attained = 1.0 - 2.0 * cumulative[ranks - 1]
    reaching = ranks[attained >= level - LEVEL_SLACK]
    k = int(reaching.max()) if reaching.size else 1
    return k, float(attained[k - 1])


def walsh_averages(log_ratios: ArrayLike) -> NDArray[np.float64]:
    """(x_i + x_j)/2 for i ≤ j along the last axis, sorted: n(n+1)/2 values."""
    x = np.asarray(log_ratios, dtype=float)
    i, j = np.triu_indices(x.shape[-1])
    return np.sort((x[..., i] + x[..., j]) / 2.0, axis=-1)


def hodges_lehmann_log_bounds(
    log_ratios: ArrayLike, level: float = CONFIDENCE
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], float]:
    """Hodges–Lehmann estimate of the log ratio, its Wilcoxon bounds along the last axis, their level."""
    walsh = walsh_averages(log_ratios)
    n = np.asarray(log_ratios).shape[-1]
    k, attained = signed_rank_rank(n, level)
    total = walsh.shape[-1]
    return np.median(walsh, axis=-1), walsh[..., k - 1], walsh[..., total - k], attained


def hodges_lehmann_interval(log_ratios: ArrayLike, level: float = CONFIDENCE) -> Interval:
    """Distribution-free check: the Hodges–Lehmann estimate (median of the Walsh averages of the log ratios)
    with its Wilcoxon signed-rank interval, from the exact null distribution, as reductions.

    Exact for a continuous law symmetric about its centre; on a skewed law its estimand is the pseudo-median
    (the median of the mean of two pairs) and its coverage of it stays within a point of the attained level
    (94.3% at 95% on the exponential as n grows). Needs finite log ratios; sufficient from 6 pairs at 95%."""
    _check_level(level)
    x = _log_ratios(log_ratios)
    n = x.size
    estimand = "Hodges-Lehmann (pseudo-median) reduction"
    method = (
        "Hodges-Lehmann: median of Walsh averages; Wilcoxon signed-rank interval, exact null distribution"
    )
    if n < 1:
        return _not_computable(estimand, method, level, 0, "no pairs")
    if not np.all(np.isfinite(x)):
        reason = "a pair with one failed arm has an infinite log ratio: Walsh averages are undefined"
        return _not_computable(estimand, method, level, n, reason)
    centre, low_log, high_log, attained = hodges_lehmann_log_bounds(x, level)
    k, _ = signed_rank_rank(n, level)
    method += f", Walsh averages {k} and {n * (n + 1) // 2 + 1 - k} of {n * (n + 1) // 2}"
    sufficient = attained >= level - LEVEL_SLACK
    reason = (
        ""
        if sufficient
        else f"{n} pairs: even the widest Wilcoxon interval attains only {attained:.2%}; "
        f"{level:.0%} needs {_pairs_for_range(level)}"
    )
    return Interval.of_logs(
        estimand,
        method,
        centre,
        low_log,
        high_log,
        level,
        attained,
        n,
        sufficient,
        reason,
    )


# --------------------------------------------------------------------------------------------- verdicts


def claim_verdict(interval: Interval, bar: float) -> str:
    """A claim against a bar (a reduction, as a fraction): ``clears`` when the interval lies wholly above
    it, ``fails`` wholly below, ``ambiguous`` when it straddles or touches it, ``insufficient`` when the
    interval does not keep its stated level (or cannot be computed)."""
    if not (interval.sufficient and interval.computable):
        return "insufficient"
    if interval.low > bar:
        return "clears"
    if interval.high < bar:
        return "fails"
    return "ambiguous"


def control_verdict(interval: Interval, tolerance: float) -> str:
    """An A/A control against ±tolerance (a fraction): ``within`` when the interval lies strictly inside,
    ``outside`` when wholly beyond one side, ``ambiguous`` when it straddles or touches ±tolerance,
    ``insufficient`` as for a claim."""
    if tolerance <= 0:
        raise ValueError(f"a tolerance is a positive fraction (got {tolerance})")
    if not (interval.sufficient and interval.computable):
        return "insufficient"
    if -tolerance < interval.low and interval.high < tolerance:
        return "within"
    if interval.low > tolerance or interval.high < -tolerance:
        return "outside"
    return "ambiguous"


# -------------------------------------------------------------------------------- design diagnostics


@dataclass(frozen=True)
class OrderBalance:
    """How many pairs ran the arm second and first, and a sentence saying so."""

    arm_second: int
    arm_first: int
    text: str

    @property
    def balanced(self) -> bool:
        return self.arm_second == self.arm_first


def order_balance(arm_second: ArrayLike) -> OrderBalance:
    """The order counts of the pairs as a sentence; an odd count cannot be balanced."""
    second = np.asarray(arm_second, dtype=bool).ravel()
    n_second, n_first = int(second.sum()), int((~second).sum())
    total = n_second + n_first
    if n_second == n_first:
        text = f"{total} pairs: the arm ran second in {n_second} and first in {n_first} (balanced)"
    else:
        text = (
            f"{total} pairs: the arm ran second in {n_second} and first in {n_first}, unbalanced by "
            f"{abs(n_second - n_first)}; an order effect is not averaged out of the estimate"
        )
    return OrderBalance(n_second, n_first, text)


# ------------------------------------------------------------------------------------ instability


# Thresholds, argued from the house's measured noise: complete fits on one H200 gave a per-pair spread of
# the log ratio of 5.4% to 9%, i.e. 3.8% to 6.4% per trial. Forty trials of a lognormal law at 6.4% have an
# expected max/min of about exp(4.3 × 0.064) = 1.32 and a MAD/median of about 0.674 × 6.4% = 4.3%, so
# 1.5 and 10% lie beyond the house's ordinary noise and catch the outliers of a loaded machine (one arm's
# 14.9 to 140.4 s). CPU steal has one threshold, per trial, in ``harness.telemetry`` (STEAL_FLAG_SHARE).
MAX_OVER_MIN_LIMIT = 1.5
MAD_OVER_MEDIAN_LIMIT = 0.10


@dataclass(frozen=True)
class ArmSpread:
    """An arm's spread over its finished trials: max/min and MAD/median (raw median absolute deviation over
    the median); ``failed`` counts the trials without a figure (kept in the log and in every statistic)."""

    arm: str
    trials: int
    failed: int
    median: float
    max_over_min: float
    mad_over_median: float


def arm_spread(arm: str, values: ArrayLike) -> ArmSpread:
    """The spread of one arm's figures (non-finite: failed trials, counted, not measured)."""
    x = np.asarray(values, dtype=float).ravel()
    finished = x[np.isfinite(x)]
    if finished.size == 0:
        return ArmSpread(arm, x.size, x.size, math.nan, math.nan, math.nan)
    median = float(np.median(finished))
    mad = float(np.median(np.abs(finished - median)))
    return ArmSpread(
        arm, x.size, int(x.size - finished.size), median, float(finished.max() / finished.min()), mad / median
    )


@dataclass(frozen=True)
class Flag:
    """A warning that travels with the data: what, the figure, the threshold and a sentence."""

    subject: str
    kind: str
    value: float
    threshold: float
    reason: str


def instability_flags(
    values_by_arm: Mapping[str, ArrayLike],
    *,
    load_1min: float | None = None,
    cores: int | None = None,
    max_over_min: float = MAX_OVER_MIN_LIMIT,
    mad_over_median: float = MAD_OVER_MEDIAN_LIMIT,
) -> tuple[Flag, ...]:
    """Flags for unreliable figures: per arm, a max/min or MAD/median above its threshold; for the machine,
    a 1-minute load average above its cores (CPU steal is read per trial: ``harness.telemetry``). Flags only
    warn: every trial stays in the data."""
    flags: list[Flag] = []
    for arm, values in values_by_arm.items():
        spread = arm_spread(arm, values)
        if spread.max_over_min > max_over_min:
            flags.append(
                Flag(
                    arm,
                    "spread",
                    spread.max_over_min,
                    max_over_min,
                    f"{arm}: max/min {spread.max_over_min:.2f} > {max_over_min:g}",
                )
            )
        if spread.mad_over_median > mad_over_median:
            flags.append(
                Flag(
                    arm,
                    "mad",
                    spread.mad_over_median,
                    mad_over_median,
                    f"{arm}: MAD/median {spread.mad_over_median:.1%} > {mad_over_median:.0%}",
                )
            )
    if load_1min is not None and cores is not None and load_1min > cores:
        flags.append(
            Flag("machine", "load", load_1min, float(cores), f"1-minute load {load_1min:.2f} > {cores} cores")
        )
    return tuple(flags)
