"""Simulation helpers of the statistics' tests: the stopping rule vectorised, the reference skewed law."""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import groupby

import numpy as np
from numpy.typing import ArrayLike, NDArray

from harness import intervals, t_calibration
from harness.intervals import CONFIDENCE, to_reduction
from harness.sequential import LAWS, MIN_STOP, difference_of_delays, look_level, looks


@dataclass(frozen=True, eq=False)
class Stopped:
    """The rule over many sequences: pairs at the stop, the interval then and the estimate (reductions)."""

    pairs: NDArray[np.int64]
    low: NDArray[np.float64]
    high: NDArray[np.float64]
    estimate: NDArray[np.float64]


def simulate(
    rows: ArrayLike, precision: float, level: float = CONFIDENCE, first: int = 6, max_pairs: int = 20
) -> Stopped:
    """``should_stop`` over each row of a (sequences × max_pairs) matrix of log ratios, vectorised."""
    x = np.asarray(rows, dtype=float)
    plan = looks(first, max_pairs)
    levels = look_level(level, plan)[0]
    count = x.shape[0]
    stopped = np.zeros(count, dtype=bool)
    pairs = np.zeros(count, dtype=np.int64)
    low, high, estimate = (np.full(count, math.nan) for _ in range(3))
    for index, n in enumerate(plan):
        median, lo, hi, _ = intervals.median_log_bounds(x[:, :n], levels[index])
        r_low, r_high = to_reduction(hi), to_reduction(lo)
        narrow = (100.0 * (r_high - r_low) / 2.0 <= precision) & (n >= MIN_STOP)
        stop = ~stopped & (narrow | (index == len(plan) - 1))
        pairs[stop], low[stop], high[stop] = n, r_low[stop], r_high[stop]
        estimate[stop] = to_reduction(median[stop])
        stopped |= stop
    return Stopped(pairs, low, high, estimate)


def delays_skewness(delay_shape: float, scale_ratio: float) -> float:
    """Skewness of G1 − r·G2 for independent gamma(k, 1) delays: 2(1 − r³) / (√k (1 + r²)^1.5)."""
    return 2.0 * (1.0 - scale_ratio**3) / (math.sqrt(delay_shape) * (1.0 + scale_ratio**2) ** 1.5)


def mean_of(name: str, draws: int = 2_000_000, seed: int = 12345) -> float:
    """The law's mean, from a large seeded sample."""
    rng = np.random.default_rng(seed)
    return float(np.mean(LAWS[name](rng, (1, draws))))


def reference_skewed(rng: np.random.Generator, shape: tuple[int, ...]) -> NDArray[np.float64]:
    """Draws of the reference skewed law of log ratios (mean 0, unit-free: scale them to a spread)."""
    shape_k, ratio = t_calibration.REFERENCE_DELAY_SHAPE, t_calibration.REFERENCE_SCALE_RATIO
    return difference_of_delays(rng, shape, shape_k, ratio)


def t_unkept_counts_text(level: float = CONFIDENCE) -> str:
    """The pair counts where the calibrated t interval is insufficient, in words."""
    table = next((t for lv, t in t_calibration.NOMINAL_LEVELS.items() if abs(lv - level) <= 1e-9), None)
    if table is None:
        return "at every count (the level is not calibrated)"
    unkept = sorted(n for n, row in table.items() if not row[3])
    runs = [[n for _, n in run] for _, run in groupby(enumerate(unkept), lambda pair: pair[1] - pair[0])]
    if not runs:
        return "at no count"
    words = [f"from {r[0]} to {r[-1]}" if len(r) > 1 else f"at {r[0]}" for r in runs]
    return ", ".join(words) + " pairs"
