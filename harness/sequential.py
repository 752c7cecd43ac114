"""The stopping rule of ``--pairs auto``: few looks, levels calibrated by simulation on the laws below.

The laws of paired log ratios are those the intervals and the stopping rule are checked on (docs/methods.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike, NDArray

from harness import intervals
from harness.intervals import CONFIDENCE, Interval


def delay_shape_for(skewness: float, scale_ratio: float) -> float:
    """The gamma shape k at which G1 − r·G2 has this skewness, 2(1 − r³) / (√k (1 + r²)^1.5)."""
    if skewness <= 0:
        raise ValueError(f"a skewed reference law needs a positive skewness (got {skewness})")
    return (2.0 * (1.0 - scale_ratio**3) / (skewness * (1.0 + scale_ratio**2) ** 1.5)) ** 2


def difference_of_delays(
    rng: np.random.Generator, shape: tuple[int, ...], delay_shape: float, scale_ratio: float
) -> NDArray[np.float64]:
    """Draws of G1 − r·G2 − k(1 − r), G1 and G2 independent gamma(k, 1): a centred log ratio."""
    first = rng.gamma(delay_shape, 1.0, shape)
    second = rng.gamma(delay_shape, 1.0, shape)
    return first - scale_ratio * second - delay_shape * (1.0 - scale_ratio)


Law = Callable[[np.random.Generator, tuple[int, int]], NDArray[np.float64]]
OUTLIER_SHARE = 0.05  # one pair in twenty has a hiccup ...
OUTLIER_SIZE = 6.0  # ... of six spreads
DRIFT_PER_TRIAL = 0.25  # spreads per trial, twice the H200 runs' (0.1-0.15): the arm run second gains it


def _skewed(skewness: float) -> Law:
    shape = delay_shape_for(abs(skewness), 0.5)
    scale = 1.0 / np.sqrt(shape * 1.25)
    sign = 1.0 if skewness > 0 else -1.0
    return lambda rng, size: sign * scale * difference_of_delays(rng, size, shape, 0.5)


def _outliers(either: bool) -> Law:
    def draw(rng: np.random.Generator, size: tuple[int, int]) -> NDArray[np.float64]:
        hit = rng.random(size) < OUTLIER_SHARE
        side = np.where(rng.random(size) < 0.5, -1.0, 1.0) if either else 1.0
        return rng.standard_normal(size) + OUTLIER_SIZE * hit * side

    return draw


def _drift(rng: np.random.Generator, size: tuple[int, int]) -> NDArray[np.float64]:
    order = np.where(np.arange(size[-1]) % 2 == 0, 1.0, -1.0)  # AB, BA, AB ...
    return rng.standard_normal(size) + DRIFT_PER_TRIAL * order


LAWS: dict[str, Law] = {
    "normal": lambda rng, size: rng.standard_normal(size),
    "skewness 1.1": _skewed(1.1),
    "skewness 2.3": _skewed(2.3),
    "skewness -2.3": _skewed(-2.3),
    "t, 3 df": lambda rng, size: rng.standard_t(3, size) / np.sqrt(3.0),
    "5% outliers, one arm": _outliers(either=False),
    "5% outliers, either arm": _outliers(either=True),
    "linear drift": _drift,
}


SYMMETRIC = frozenset({"normal", "t, 3 df", "5% outliers, either arm", "linear drift"})


def median_of(name: str, draws: int = 2_000_000, seed: int = 12345) -> float:
    """The law's median: 0 for a symmetric law, else from a large seeded sample."""
    if name in SYMMETRIC:
        return 0.0
    rng = np.random.default_rng(seed)
    return float(np.median(LAWS[name](rng, (1, draws))))


GROWTH = 0.4  # each look adds about 40% more pairs (at least 4)
SPREAD = 0.05  # the per-pair spread the calibration simulates at (the H200's sequential pairs: 5-9%)
RATIOS = (0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.6, 2.0, 2.4)  # precision targets, in spreads
DRAWS = 6000  # sequences per law in the calibration (standard error 0.3 point at 95%)
MIN_STOP = 10  # the fewest pairs a precision stop takes (see the module's rule)
SEED = 20261204


@dataclass(frozen=True)
class StopDecision:
    """Whether to stop after the pairs given, why, the look's own level and interval (None between looks)."""

    stop: bool
    reason: str
    per_look_level: float | None = None
    interval: Interval | None = None


def looks(first: int = 6, max_pairs: int = 20) -> tuple[int, ...]:
    """The looks: ``first``, then each about 40% (at least 4 pairs) more, even, and ``max_pairs`` last."""
    if first < 2:
        raise ValueError(f"the first look needs at least 2 pairs (got {first})")
    if max_pairs < first:
        raise ValueError(f"max_pairs ({max_pairs}) must be at least the first look ({first})")
    out = [first]
    while out[-1] + (step := max(4, round(GROWTH * out[-1]))) + step % 2 < max_pairs:
        out.append(out[-1] + step + step % 2)
    if len(out) > 1 and max_pairs - out[-1] < 2:
        out[-1] = max_pairs
    elif out[-1] != max_pairs:
        out.append(max_pairs)
    return tuple(out)


def _candidates(level: float, count: int, blocked: int = 0) -> list[tuple[float, ...]]:
    """Candidate look levels: first, middle and last, after the looks blocked by ``MIN_STOP``."""
    alpha = 1.0 - level
    first = [level + alpha * f for f in (0.0, 0.1, 0.2, 0.3, 0.4)]
    middle = [level + alpha * f for f in (-0.2, 0.0, 0.2, 0.4, 0.5, 0.6, 0.7)]
    last = [level + alpha * f for f in (-0.4, -0.3, -0.2, -0.1, 0.0, 0.1, 0.2)]
    free = count - blocked
    heads = [()] if free == 1 else [(a,) for a in first]
    middles = [()] if free <= 2 else [(b,) * (free - 2) for b in middle]
    return [(level,) * blocked + head + body + (c,) for head in heads for body in middles for c in last]


@lru_cache(maxsize=32)
def look_level(level: float, plan: tuple[int, ...]) -> tuple[tuple[float, ...], float, float]:
    """Each look's level for ``plan``, and the worst and best coverage simulated with them.

    The coverage is the median's by the stopped interval, per law and precision ratio.
    """
    rng = np.random.default_rng(SEED)
    draws = {name: SPREAD * law(rng, (DRAWS, plan[-1])) for name, law in LAWS.items()}
    # per law: each look's sorted prefix of the seeded sequences, and the law's median
    prefixes = {name: [np.sort(x[:, :n], axis=1) for n in plan] for name, x in draws.items()}
    medians = {name: SPREAD * median_of(name) for name in LAWS}
    targets, cache, found = 100.0 * SPREAD * np.asarray(RATIOS)[:, None], {}, []
    blocked = sum(1 for n in plan[:-1] if n < MIN_STOP)
    for levels in _candidates(level, len(plan), blocked):
        cells = []
        for name in LAWS:
            stopped = np.zeros((len(RATIOS), DRAWS), dtype=bool)
            covered = np.zeros_like(stopped)
            for index, n in enumerate(plan):
                key = (name, index, round(levels[index], 6))
                if key not in cache:
                    _, low, high, _ = intervals.median_log_bounds(prefixes[name][index], levels[index])
                    hit = (low <= medians[name]) & (medians[name] <= high)
                    cache[key] = (100.0 * (np.exp(high) - np.exp(low)) / 2.0, hit)
                half, hit = cache[key]
                stop = ~stopped & (((half <= targets) & (n >= MIN_STOP)) | (index == len(plan) - 1))
                covered |= stop & hit
                stopped |= stop
            cells.append(covered.mean(axis=1))
        found.append((levels, float(np.min(cells)), float(np.max(cells))))
    # the least stray either way (to a tenth of a point, below this simulation's error); among those, the
    # least shortfall: under-coverage is the side a claim must not err on
    return min(found, key=lambda f: (round(max(level - f[1], f[2] - level), 3), level - f[1]))


def should_stop(
    log_ratios: ArrayLike,
    precision: float,
    level: float = CONFIDENCE,
    first: int = 6,
    max_pairs: int = 20,
    budget_spent: bool = False,
    ended: str = "time budget spent",
) -> StopDecision:
    """The stopping rule, asked after each pair."""
    if precision <= 0:
        raise ValueError(f"precision is a positive half-width in percent (got {precision})")
    x = np.asarray(log_ratios, dtype=float).ravel()
    n = x.size
    plan = looks(first, max_pairs)
    if n > plan[-1]:
        raise ValueError(f"{n} pairs run past the last look ({plan[-1]})")
    if n not in plan and not budget_spent:
        where = "before the first look" if n < plan[0] else "between looks"
        return StopDecision(False, where)
    index = next(i for i, pairs in enumerate(plan) if pairs >= n)
    levels, low, high = look_level(level, plan)
    at, interval, note = levels[index], None, ""
    if n >= 1:  # the median's interval at the look's own level
        found = intervals.median_interval(x, at)
        attained = min(found.attained_level, low)
        method = f"{found.method}; look {index + 1} of {list(plan)} at {at:.2%}, calibrated by simulation: "
        method += f"the stopped interval covers {low:.1%} to {high:.1%} on every law tried"
        sufficient = intervals.keeps_level(attained, level)
        why = "" if sufficient else found.reason or f"the stopping rule attains only {attained:.1%}"
        changed = {"method": method, "stated_level": level, "attained_level": attained, "nominal_level": at}
        interval = replace(found, **changed, sufficient=sufficient, reason=why)
    if n == plan[0] and np.isfinite(x).sum() >= 2 and interval.computable:  # the half-width max_pairs gives
        projected = interval.half_width * math.sqrt(n / plan[-1])
        if projected > precision:
            note = f"; at the spread measured, {plan[-1]} pairs reach about ±{projected:.2f} points, "
            note += f"not the ±{precision:g} asked"
    reached = interval is not None and interval.computable and interval.half_width <= precision
    half = "unknown" if interval is None or not interval.computable else f"{interval.half_width:.2f}"
    stop = (reached and n >= MIN_STOP) or n == plan[-1] or budget_spent
    if reached and n >= MIN_STOP:
        reason = f"precision reached: half-width {half} <= {precision:g} points"
    elif stop:
        reason = "last look (max pairs)" if n == plan[-1] else ended
    elif reached:
        reason = (
            f"precision reached at {n} pairs; a stop takes {MIN_STOP} (the median of fewer is biased){note}"
        )
    else:
        reason = f"precision not reached: half-width {half} > {precision:g} points{note}"
    return StopDecision(stop, reason, at, interval)
