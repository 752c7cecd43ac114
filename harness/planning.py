"""The pairs (and time) a goal needs under a run's rule, at a measured per-pair spread (docs/methods.md)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from harness import intervals, sequential
from harness.formatting import format_probability
from harness.intervals import CONFIDENCE
from harness.limits import MAX_PAIRS
from harness.schedule import CONCURRENT_ORDERS
from harness.stats import ClaimSettings, measured, median_of

DRAWS = 4000
SIMULATED_UP_TO = 400
SEED = 41
MEDIAN_EFFICIENCY = math.sqrt(math.pi / 2)  # the median's standard error over the mean's, normal law


@dataclass(frozen=True)
class Plan:
    """Pairs (and seconds) a goal needs, with the chance they meet it."""

    goal: str
    pairs: int
    pairs_for_goal: int
    probability: float
    minimum_pairs: int
    seconds: float | None


def _bounds(n: int, sigma: float, centre: float, level: float) -> tuple[np.ndarray, np.ndarray]:
    """The median interval's log-ratio bounds over ``DRAWS`` normal sequences of n pairs."""
    rng = np.random.default_rng(SEED)
    _, low, high, _ = intervals.median_log_bounds(centre + sigma * rng.standard_normal((DRAWS, n)), level)
    return low, high


def chance_to_resolve(n: int, sigma: float, effect: float, bar: float, level: float = CONFIDENCE) -> float:
    """The chance that the interval of n pairs lies wholly on the true effect's side of the bar."""
    if not intervals.keeps_level(intervals.attained_level(n, level), level):
        return 0.0
    centre, against = math.log1p(-effect), math.log1p(-bar)
    if n > SIMULATED_UP_TO:
        z = stats.norm.ppf(0.5 + level / 2.0)
        return float(stats.norm.cdf(abs(centre - against) * math.sqrt(n) / (MEDIAN_EFFICIENCY * sigma) - z))
    low, high = _bounds(n, sigma, centre, level)
    return float(np.mean(high < against) if centre < against else np.mean(low > against))


def chance_within(n: int, sigma: float, tolerance: float, level: float = CONFIDENCE) -> float:
    """The chance that an A/A control's interval of n pairs lies strictly within ±tolerance."""
    if not intervals.keeps_level(intervals.attained_level(n, level), level):
        return 0.0
    upper, lower = math.log1p(tolerance), math.log1p(-tolerance)
    if n > SIMULATED_UP_TO:
        z, se = stats.norm.ppf(0.5 + level / 2.0), MEDIAN_EFFICIENCY * sigma / math.sqrt(n)
        return float(max(0.0, 2.0 * stats.norm.cdf(((upper - lower) / 2.0 - z * se) / se) - 1.0))
    low, high = _bounds(n, sigma, 0.0, level)
    return float(np.mean((low > lower) & (high < upper)))


def _fewest(meets: Callable[[int], bool], start: int) -> int | None:
    """The fewest pairs from ``start`` to ``MAX_PAIRS`` for which ``meets`` holds (rising with n)."""
    high = start
    while not meets(high):
        if high >= MAX_PAIRS:
            return None
        high = min(2 * high, MAX_PAIRS)
    low = max(start, high // 2)
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if meets(middle) else (middle + 1, high)
    return low


def plan_goal(goal: str, chance: Callable[[int], float], power: float, level: float, seconds: float | None):
    """The plan for a goal whose chance at n pairs is ``chance(n)``; ValueError past ``MAX_PAIRS``."""
    minimum = intervals.min_pairs(level)
    found = _fewest(lambda n: chance(n) >= power, minimum)
    if found is None:
        raise ValueError(f"{goal}: needs more than {MAX_PAIRS} pairs, the most --pairs accepts")
    pairs = min(found + found % 2, MAX_PAIRS)
    return Plan(goal, pairs, found, chance(found), minimum, None if seconds is None else pairs * seconds)


def plan_effect(sigma, effect, bar=0.0, level=CONFIDENCE, power=0.8, seconds_per_pair=None) -> Plan:
    """Pairs to resolve a true reduction ``effect`` against ``bar`` (fractions; 0: faster at all)."""
    if sigma <= 0 or effect == bar or max(effect, bar) >= 1:
        raise ValueError("need a positive spread, and an effect and a bar below 100% that differ")
    goal = f"resolve a {effect:.1%} reduction against {bar:.1%} with {format_probability(power)} power"
    chance = lambda n: chance_to_resolve(n, sigma, effect, bar, level)  # noqa: E731
    return plan_goal(goal, chance, power, level, seconds_per_pair)


def plan_control(sigma, tolerance, level=CONFIDENCE, power=0.8, seconds_per_pair=None) -> Plan:
    """Pairs for an A/A control's interval to fall within ±``tolerance`` with probability ``power``."""
    if sigma <= 0 or not 0 < tolerance < 1:
        raise ValueError("need a positive spread and a tolerance in (0, 1)")
    goal = f"bring an A/A within +/-{tolerance:.1%} with probability {format_probability(power)}"
    chance = lambda n: chance_within(n, sigma, tolerance, level)  # noqa: E731
    return plan_goal(goal, chance, power, level, seconds_per_pair)


def sigma_upper(sigma: float, pairs: int, level: float = 0.95) -> float:
    """σ's one-sided upper confidence bound from ``pairs`` log ratios (normal law)."""
    if pairs < 2 or not math.isfinite(sigma):
        return math.nan
    return sigma * math.sqrt((pairs - 1) / stats.chi2.ppf(1.0 - level, pairs - 1))


def per_pair_spread(pairs: pd.DataFrame, case: Any, arm: Any) -> tuple[float, int]:
    """The standard deviation of one claim's finite log ratios (the per-pair σ) and how many it rests on."""
    mine = pairs[(pairs["case"] == case) & (pairs["arm"] == arm)]
    x = mine["log_ratio"].to_numpy(dtype=float)
    x = x[np.isfinite(x)]
    return (float(np.std(x, ddof=1)) if x.size >= 2 else math.nan), int(x.size)


def seconds_per_pair(
    trials: pd.DataFrame, case: Any, arms: tuple[Any, Any], cooldown: float = 0.0, duet: bool = False
) -> float:
    """The seconds one pair takes by the log, with cool-downs; NaN where the log holds no time."""
    rows = measured(trials)
    if rows.empty or "trial_seconds" not in rows:
        return math.nan
    times = [median_of(rows[(rows["case"] == case) & (rows["arm"] == arm)], "trial_seconds") for arm in arms]
    if any(math.isnan(t) for t in times):
        return math.nan
    return (max(times) + cooldown) if duet else (sum(times) + cooldown * len(times))


def _goal(claim: Any, effect, tolerance, bar, level: float, power: float) -> Callable[[float, Any], Plan]:
    """A claim's goal, planned at a spread and seconds per pair; ValueError where it has none."""
    if claim["kind"] == "control":
        limit = tolerance if tolerance is not None else claim["bar"]
        if pd.isna(limit):
            raise ValueError("no tolerance to plan for (give one, e.g. --tolerance 1%)")
        return lambda sigma, seconds: plan_control(sigma, float(limit), level, power, seconds)
    target = float(claim["estimate"]) if effect is None else effect
    if not math.isfinite(target):
        raise ValueError("no finite effect to plan for (give one, e.g. --effect 3%)")
    against = 0.0 if bar is None else bar
    return lambda sigma, seconds: plan_effect(sigma, target, against, level, power, seconds)


def _upper_pairs(goal: Callable[[float, Any], Plan], sigma: float) -> int | str | None:
    """The pairs the goal needs at σ's upper bound (None where that bound does not exist)."""
    if not math.isfinite(sigma):
        return None
    try:
        return goal(sigma, None).pairs
    except ValueError:
        return f"more than {MAX_PAIRS}"


PLAN_COLUMNS = tuple(
    "case arm baseline_arm kind sigma sigma_upper sigma_pairs seconds_per_pair goal pairs pairs_for_goal "
    "pairs_upper probability minimum_pairs seconds note".split()
)


def plan_rows(
    protocol: Any,
    summaries: Any,
    effect: float | None = None,
    tolerance: float | None = None,
    bar: float | None = None,
    power: float = 0.8,
) -> list[dict[str, Any]]:
    """Per claim of a run, the pairs (and seconds) a goal needs at its measured σ and at σ's upper bound."""
    settings = ClaimSettings.from_protocol(protocol)
    level = settings.level
    if getattr(protocol, "pairs", None) == "auto":  # the last look's level is the one a long run reads
        plan = sequential.looks(settings.first_look, protocol.max_pairs)
        level = sequential.look_level(settings.level, plan)[0][-1]
    duet = getattr(protocol, "order", "") in CONCURRENT_ORDERS
    cooldown = float(getattr(protocol, "cooldown", 0))
    out: list[dict[str, Any]] = []
    for _, claim in summaries.claims.iterrows():
        case, arm, base = claim["case"], claim["arm"], claim["baseline_arm"]
        sigma, used = per_pair_spread(summaries.pairs, case, arm)
        seconds = seconds_per_pair(summaries.trials, case, (base, arm), cooldown, duet)
        values = (case, arm, base, claim["kind"], sigma, sigma_upper(sigma, used), used, seconds, "")
        values += (None, None, None, math.nan, intervals.min_pairs(settings.level), math.nan, "")
        row: dict[str, Any] = dict(zip(PLAN_COLUMNS, values, strict=True))
        try:
            goal = _goal(claim, effect, tolerance, bar, level, power)
            if not math.isfinite(sigma) or sigma <= 0:
                raise ValueError(f"needs a spread: {used} finished pair(s) with a finite log ratio")
            found = goal(sigma, seconds if math.isfinite(seconds) else None)
        except ValueError as exc:
            row["note"] = str(exc)
        else:
            row.update(asdict(found), seconds=math.nan if found.seconds is None else found.seconds)
            row["pairs_upper"] = _upper_pairs(goal, row["sigma_upper"])
        out.append(row)
    return out
