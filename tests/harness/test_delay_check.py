"""The calibration arm's recovered/known ratio: by hand, and its coverage of 1 by simulation.

The simulation holds where the design recovers the delay whole. 20 000 runs give a standard error of 0.15
point against the 1.5-point band.
"""

from __future__ import annotations

import numpy as np
import pytest

from harness import delay_check, intervals


def test_a_known_delay_recovered_whole_and_one_read_short() -> None:
    base = np.array([60.0, 61.0, 59.5, 60.5, 60.2, 59.8])
    whole = delay_check.recovered(base, base + 3.0 + np.array([0.1, -0.1, 0.2, -0.2, 0.05, -0.05]), 3.0)
    assert whole.verdict == "recovered" and whole.estimate == pytest.approx(1.0, abs=0.02)
    short = delay_check.recovered(
        base, base + 0.8 * 3.0 + np.array([0.01, -0.01, 0.02, 0.0, 0.01, -0.02]), 3.0
    )
    assert short.verdict == "biased" and short.high < 1.0  # a duet's slow-down reads so
    assert delay_check.recovered(base[:4], base[:4] + 3.0, 3.0).verdict == "insufficient"
    with pytest.raises(ValueError, match="positive"):
        delay_check.recovered(base, base, 0.0)


def test_the_ratios_interval_covers_one_at_its_level_when_the_delay_is_recovered() -> None:
    rng = np.random.default_rng(5)
    for n in (5, 6, 10):
        base = 60.0 * np.exp(0.03 * rng.standard_normal((20_000, n)))
        arm = (base + 3.0) * np.exp(0.03 * rng.standard_normal((20_000, n)))
        truth = float(np.median(arm - base)) / 3.0  # the ratio's median, from all 20 000 x n draws
        _, low, high, attained = intervals.median_log_bounds((arm - base) / 3.0, 0.95)
        assert float(np.mean((low <= truth) & (truth <= high))) == pytest.approx(attained, abs=0.015)


def test_a_narrow_interval_beside_one_is_recovered_and_one_beyond_the_margin_is_biased() -> None:
    """A fixed overhead of 0.2 ms on a 50 ms delay reads 1.004, with an interval that misses 1.

    Inside 1 ± 0.1 it counts as recovered; 15% short it does not.
    """
    base = np.array([0.25, 0.251, 0.2505, 0.2502, 0.2498, 0.2503])
    jitter = np.array([0.0, 0.00001, -0.00001, 0.00002, 0.0, -0.00002])
    near = delay_check.recovered(base, base + 0.0502 + jitter, 0.05)
    assert near.low > 1.0 and near.verdict == "recovered"
    far = delay_check.recovered(base, base + 0.0425 + jitter, 0.05)
    assert far.high < 0.9 and far.verdict == "biased"
