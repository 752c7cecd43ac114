"""`bench plan` plans the rule the run uses.

It plans the median's interval and the effect against 0, charges a duet pair's real time, and gives the pairs
at σ's upper bound. It never advises more than --pairs accepts.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness import intervals, planning, stats
from harness.limits import MAX_PAIRS
from harness.protocol_options import ProtocolOptions
from harness.schedule import Arm
from tests.harness.test_stats import paired

DRAWS = 20_000


def test_the_planned_chance_is_the_median_intervals_by_simulation() -> None:
    """The chance at the planned count, against fresh draws (another seed): within three standard errors."""
    sigma, effect = 0.054, 0.09
    plan = planning.plan_effect(sigma, effect)
    assert plan.probability >= 0.8 > planning.chance_to_resolve(plan.pairs_for_goal - 1, sigma, effect, 0.0)
    rows = math.log(1 - effect) + sigma * np.random.default_rng(12).standard_normal(
        (DRAWS, plan.pairs_for_goal)
    )
    _, _, high, _ = intervals.median_log_bounds(rows, 0.95)
    simulated = float(np.mean(high < 0))
    assert simulated == pytest.approx(plan.probability, abs=3 * math.sqrt(0.2 * 0.8 / DRAWS) + 0.02)
    # past the simulated counts the large-sample law joins on: the two agree at the seam within 2 points
    seam = planning.SIMULATED_UP_TO
    small = 0.012
    assert planning.chance_to_resolve(seam, 0.05, small, 0.0) == pytest.approx(
        planning.chance_to_resolve(seam + 1, 0.05, small, 0.0), abs=0.02
    )


def test_an_aa_plan_by_simulation_and_a_goal_past_max_pairs_is_refused() -> None:
    plan = planning.plan_control(0.01, 0.01)
    assert plan.probability >= 0.8 > planning.chance_within(plan.pairs_for_goal - 1, 0.01, 0.01)
    with pytest.raises(ValueError, match=f"more than {MAX_PAIRS} pairs"):
        planning.plan_effect(0.09, 0.0005)


def _summaries(order: str, bar: float | None = 5.0):
    ratios = [-0.1, -0.05, -0.15, -0.1, -0.12, -0.08]
    frame = paired([(10.0, 10.0 * math.exp(x)) for x in ratios], orders=["AB", "BA"] * 3)
    frame["trial_seconds"] = [60.0, 50.0] * 6
    pairs = stats.pair_table(frame)
    claims = stats.claim_table(pairs, stats.ClaimSettings(bar_percent=bar), trials=frame)
    protocol = ProtocolOptions(
        (Arm("baseline", "baseline", "b"), Arm("candidate", "candidate", "c")), bar=bar, order=order
    )
    return protocol, type("S", (), {"claims": claims, "pairs": pairs, "trials": frame})(), ratios


def test_plan_rows_plan_against_zero_charge_a_duet_one_fit_and_give_sigmas_upper_bound() -> None:
    """The decisive runs' plan, redone: a 3% effect is planned against 0, not the run's bar.

    A duet pair is charged one fit-time (79 s, not 157 s). The σ of 5 pairs is not taken as known: its
    95% interval is 0.99-4.76%.
    """
    protocol, summaries, ratios = _summaries("alternate")
    (row,) = planning.plan_rows(protocol, summaries, effect=0.03)
    assert row["sigma"] == pytest.approx(np.std(ratios, ddof=1)) and row["seconds_per_pair"] == 110.0
    assert "against 0.0%" in row["goal"]
    expected = planning.plan_effect(row["sigma"], 0.03, 0.0, seconds_per_pair=110.0)
    assert (row["pairs"], row["seconds"]) == (expected.pairs, expected.seconds)
    assert row["sigma_upper"] == pytest.approx(
        row["sigma"] * math.sqrt(5 / 1.1454762), rel=1e-5
    )  # χ²(0.05, 5)
    assert row["pairs_upper"] > row["pairs"]
    protocol, summaries, _ = _summaries("duet")
    (duet,) = planning.plan_rows(protocol, summaries, effect=0.03)
    assert duet["seconds_per_pair"] == 60.0  # the slower arm's fit: both run at once


def test_a_plan_past_max_pairs_says_so_instead_of_a_count() -> None:
    protocol, summaries, _ = _summaries("alternate")
    (row,) = planning.plan_rows(protocol, summaries, effect=0.0002)
    assert row["pairs"] is None and f"more than {MAX_PAIRS} pairs" in row["note"]
