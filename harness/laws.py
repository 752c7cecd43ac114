"""Laws of paired log ratios that the intervals and the stopping rule are checked on (docs/methods.md)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray


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
