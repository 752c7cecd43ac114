"""Drift and the order effect, fitted together on the trials in run order: by hand and by simulation.

Monte-Carlo error: a coverage near 95% from 20 000 draws has a standard error of 0.15 point. The tests allow
1.5 points, ten of them, as for every interval.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from harness import stats as harness_stats

DRAWS = 20_000
TOLERANCE = 0.015


def drift(*args, **kwargs):
    return harness_stats.design_effects(*args, **kwargs)[0]


def _least_squares(design: np.ndarray, noise: np.ndarray, column: int) -> tuple[np.ndarray, np.ndarray]:
    """Each draw's least-squares coefficient of ``column`` and its 95% t half-width, in closed form."""
    fit = np.linalg.lstsq(design, noise.T, rcond=None)[0]
    residual = noise.T - design @ fit
    dof = design.shape[0] - design.shape[1]
    se = np.sqrt((residual**2).sum(axis=0) / dof * np.linalg.inv(design.T @ design)[column, column])
    return fit[column], stats.t.ppf(0.975, dof) * se


def test_the_order_effect_is_set_apart_from_drift_by_hand_and_covers_by_simulation() -> None:
    """Six pairs AB, BA, ...: trials run second are e^0.05 slower and the machine drifts 2% per trial. The
    pairs' order difference reads 0.1 + 0.04; the fit reads 0.1. With noise and no effect, the interval
    covers 0 at 95% (the closed-form least squares on every draw, then the function on one)."""
    arms = np.array(list("bccbbccbbccb"))
    second = np.tile([False, True], 6)
    index = np.arange(12)
    values = np.exp(np.where(arms == "b", 3.0, 2.9) + 0.05 * second + 0.02 * index)
    found = harness_stats.design_effects(values, arms, second=second)[1]
    assert found.estimate == pytest.approx(100 * math.expm1(0.1))
    assert drift(values, arms, second=second).estimate == pytest.approx(100 * math.expm1(0.02))
    rng = np.random.default_rng(16)
    noise = 0.03 * rng.standard_normal((DRAWS, 12)) + 0.02 * index
    design = np.column_stack([index, arms == "b", arms == "c", second]).astype(float)
    estimate, half = _least_squares(design, noise, 3)
    assert float(np.mean(np.abs(estimate) <= half)) == pytest.approx(0.95, abs=TOLERANCE)
    one = harness_stats.design_effects(np.exp(noise[0]), arms, second=second)[1]
    assert (one.low, one.high) == pytest.approx(
        (100 * math.expm1(2 * (estimate[0] - half[0])), 100 * math.expm1(2 * (estimate[0] + half[0])))
    )


def test_drift_by_hand_and_by_simulation() -> None:
    # log(value) = arm level + 0.01 · index exactly: slope 0.01, 100 (e^0.01 − 1) = 1.005% per trial.
    index = np.arange(8)
    arms = np.array(["b", "c", "c", "b", "b", "c", "c", "b"])
    values = np.exp(np.where(arms == "b", 3.0, 2.9) + 0.01 * index)
    trend = drift(values, arms)
    assert trend.estimate == pytest.approx(100 * math.expm1(0.01))
    assert (trend.low, trend.high) == pytest.approx((trend.estimate, trend.estimate))
    # A failed trial is left out, the others keep their schedule index.
    values[3] = math.inf
    assert drift(values, arms).n == 7
    # Coverage of the slope's interval, with noise, no drift: the closed-form least squares on all draws.
    rng = np.random.default_rng(14)
    noise = 0.03 * rng.standard_normal((DRAWS, 12))
    arms = np.array(list("bccbbccbbccb"))
    design = np.column_stack([np.arange(12), arms == "b", arms == "c"]).astype(float)
    estimate, half = _least_squares(design, noise, 0)
    assert float(np.mean(np.abs(estimate) <= half)) == pytest.approx(0.95, abs=TOLERANCE)
    # and the function gives the same interval as this closed form on one draw
    one = drift(np.exp(noise[0]), arms)
    assert (one.low, one.high) == pytest.approx(
        (100 * math.expm1(estimate[0] - half[0]), 100 * math.expm1(estimate[0] + half[0]))
    )


def test_drift_takes_a_level_per_slice_so_a_step_between_machines_is_not_a_trend() -> None:
    """With one level per slice, each resume a new one, a step between slices is not a trend; a trend within
    them is.

    The H200 claim against the baseline ran its last three rounds on a machine twice as fast. Fitted over the
    whole schedule, that step read as a drift of -1.8% per trial.
    """
    index = np.arange(12)
    arms = np.array(list("bccbbccbbccb"))
    level = np.where(arms == "b", 3.0, 2.9)
    blocks = np.array([0] * 6 + [1] * 6)
    step = np.where(blocks == 1, math.log(0.5), 0.0)
    assert drift(np.exp(level + step), arms).estimate < -5  # the step alone, read as a trend
    flat = drift(np.exp(level + step), arms, blocks=blocks)
    assert flat.estimate == pytest.approx(0.0, abs=1e-9) and flat.high - flat.low == pytest.approx(
        0, abs=1e-9
    )
    rising = drift(np.exp(level + step + 0.01 * index), arms, blocks=blocks)
    assert rising.estimate == pytest.approx(100 * math.expm1(0.01))
    # One slice is the plain fit; a slice that holds one arm alone is still estimable from the others.
    assert drift(np.exp(level + 0.01 * index), arms, blocks=np.zeros(12)).estimate == pytest.approx(
        drift(np.exp(level + 0.01 * index), arms).estimate
    )
    with pytest.raises(ValueError, match="one slice"):
        drift(np.exp(level), arms, blocks=np.zeros(11))
    # Coverage of the slope's interval with a step between slices, noise and no drift, by simulation (the
    # closed-form least squares on every draw, as above, with the slice's column).
    rng = np.random.default_rng(15)
    noise = 0.03 * rng.standard_normal((DRAWS, 12)) + np.where(blocks == 1, -0.7, 0.0)
    design = np.column_stack([index, arms == "b", arms == "c", blocks == 1]).astype(float)
    estimate, half = _least_squares(design, noise, 0)
    assert float(np.mean(np.abs(estimate) <= half)) == pytest.approx(0.95, abs=TOLERANCE)
    one = drift(np.exp(noise[0]), arms, blocks=blocks)
    assert (one.low, one.high) == pytest.approx(
        (100 * math.expm1(estimate[0] - half[0]), 100 * math.expm1(estimate[0] + half[0]))
    )
