"""Paired timings' small-sample inference: log ratios, Hodges-Lehmann, verdicts (docs/methods.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

CONFIDENCE = 0.95
LEVEL_SLACK = 1e-12  # float slack when comparing an exact attained level with the level asked for


def check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"a confidence level is a fraction in (0, 1) (got {level})")


@dataclass(frozen=True, eq=False)
class PairSplit:
    """Usable pairs' log ratios, which pairs were kept, and how many had both arms failed."""

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


def log_ratios_of(values: ArrayLike) -> NDArray[np.float64]:
    x = np.asarray(values, dtype=float).ravel()
    if np.any(np.isnan(x)):
        raise ValueError("log ratios must not be NaN (split_pairs drops a pair whose arms both failed)")
    return x


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

    @classmethod
    def of_logs(
        cls, estimand: str, method: str, centre: Any, low_log: Any, high_log: Any, *rest: Any
    ) -> Interval:
        """An interval from log-ratio bounds; the ends swap, as a higher log ratio is a lower reduction."""
        return cls(estimand, method, *(float(to_reduction(v)) for v in (centre, high_log, low_log)), *rest)


def not_computable(estimand: str, method: str, level: float, n: int, reason: str) -> Interval:
    return Interval(estimand, method, math.nan, math.nan, math.nan, level, math.nan, n, False, reason)


def short_of(n: int, widest: str, attained: float, level: float, needs: int) -> str:
    """Why an interval of ``n`` pairs is insufficient: even its widest form attains less than ``level``."""
    return f"{n} pairs: even {widest} attains only {attained:.2%}; {level:.0%} needs {needs}"


def pairs_for_range(level: float) -> int:
    """The fewest pairs whose range attains ``level`` as an interval of the median (6 at 95%)."""
    return max(1, math.ceil(math.log2(2.0 / (1.0 - level)) - 1e-9))


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
    cumulative = np.cumsum(signed_rank_null(n))
    total = n * (n + 1) // 2
    ranks = np.arange(1, (total + 1) // 2 + 1)
    attained = 1.0 - 2.0 * cumulative[ranks - 1]
    reaching = ranks[attained >= level - LEVEL_SLACK]
    k = int(reaching.max()) if reaching.size else 1
    return k, float(attained[k - 1])


def hodges_lehmann_log_bounds(
    log_ratios: ArrayLike, level: float = CONFIDENCE
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], float]:
    """Hodges–Lehmann estimate of the log ratio, its Wilcoxon bounds along the last axis, their level."""
    x = np.asarray(log_ratios, dtype=float)
    n = x.shape[-1]
    i, j = np.triu_indices(n)
    walsh = np.sort((x[..., i] + x[..., j]) / 2.0, axis=-1)
    k, attained = signed_rank_rank(n, level)
    total = walsh.shape[-1]
    return np.median(walsh, axis=-1), walsh[..., k - 1], walsh[..., total - k], attained


def hodges_lehmann_interval(log_ratios: ArrayLike, level: float = CONFIDENCE) -> Interval:
    """Hodges–Lehmann estimate with its exact Wilcoxon signed-rank interval, as reductions."""
    check_level(level)
    x = log_ratios_of(log_ratios)
    n = x.size
    estimand = "Hodges-Lehmann (pseudo-median) reduction"
    method = (
        "Hodges-Lehmann: median of Walsh averages; Wilcoxon signed-rank interval, exact null distribution"
    )
    if n < 1:
        return not_computable(estimand, method, level, 0, "no pairs")
    if not np.all(np.isfinite(x)):
        reason = "a pair with one failed arm has an infinite log ratio: Walsh averages are undefined"
        return not_computable(estimand, method, level, n, reason)
    centre, low, high, attained = hodges_lehmann_log_bounds(x, level)
    k, _ = signed_rank_rank(n, level)
    method += f", Walsh averages {k} and {n * (n + 1) // 2 + 1 - k} of {n * (n + 1) // 2}"
    sufficient = attained >= level - LEVEL_SLACK
    widest = "the widest Wilcoxon interval"
    reason = "" if sufficient else short_of(n, widest, attained, level, pairs_for_range(level))
    return Interval.of_logs(estimand, method, centre, low, high, level, attained, n, sufficient, reason)


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
