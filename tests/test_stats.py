"""Statistics against hand-computed examples: medians, ranges, reductions, failures, interval, verdict."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from harness import stats


def trials(rows: list[tuple]) -> pd.DataFrame:
    """Rows of (round, arm, role, status, value, phase)."""
    return pd.DataFrame(
        [
            {
                "case": "c",
                "round": r,
                "arm": a,
                "role": role,
                "status": s,
                "value": v,
                "phase": p,
                "order": "AB",
            }
            for r, a, role, s, v, p in rows
        ]
    )


def test_arm_medians_and_ranges_ignore_warmups() -> None:
    frame = trials(
        [
            (0, "baseline", "baseline", "ok", 100.0, "warmup"),
            (0, "baseline", "baseline", "ok", 10.0, "measured"),
            (1, "baseline", "baseline", "ok", 12.0, "measured"),
            (2, "baseline", "baseline", "ok", 11.0, "measured"),
            (0, "candidate", "candidate", "ok", 8.0, "measured"),
            (1, "candidate", "candidate", "ok", 9.0, "measured"),
            (2, "candidate", "candidate", "ok", 7.0, "measured"),
        ]
    )
    arms = stats.arm_table(frame).set_index("arm")
    assert arms.loc["baseline", ["trials", "median", "min", "max"]].tolist() == [3, 11.0, 10.0, 12.0]
    assert arms.loc["candidate", ["median", "min", "max"]].tolist() == [8.0, 7.0, 9.0]


def test_paired_reductions_by_hand() -> None:
    frame = trials(
        [
            (0, "baseline", "baseline", "ok", 10.0, "measured"),
            (0, "candidate", "candidate", "ok", 8.0, "measured"),
            (1, "baseline", "baseline", "ok", 20.0, "measured"),
            (1, "candidate", "candidate", "ok", 15.0, "measured"),
            (2, "baseline", "baseline", "ok", 10.0, "measured"),
            (2, "candidate", "candidate", "ok", 11.0, "measured"),
        ]
    )
    pairs = stats.pair_table(frame)
    assert pairs["reduction"].tolist() == pytest.approx([0.2, 0.25, -0.1])
    claims = stats.claim_table(pairs, stats.ClaimSettings(bar_percent=8, seed=0))
    claim = claims.iloc[0]
    assert claim["median"] == pytest.approx(0.2)
    assert (claim["min"], claim["max"]) == pytest.approx((-0.1, 0.25))
    assert claim["pairs"] == 3
    # With three pairs the bootstrap median can only be one of the three reductions.
    assert claim["ci_low"] == pytest.approx(-0.1) and claim["ci_high"] == pytest.approx(0.25)
    assert claim["verdict"] == "ambiguous"


def test_failed_trials_count_as_infinitely_slow() -> None:
    frame = trials(
        [
            (0, "baseline", "baseline", "ok", 10.0, "measured"),
            (0, "candidate", "candidate", "resource_failure", None, "measured"),
            (1, "baseline", "baseline", "error", None, "measured"),
            (1, "candidate", "candidate", "ok", 5.0, "measured"),
            (2, "baseline", "baseline", "error", None, "measured"),
            (2, "candidate", "candidate", "error", None, "measured"),
        ]
    )
    arms = stats.arm_table(frame).set_index("arm")
    assert arms.loc["candidate", "failed"] == 2 and arms.loc["candidate", "trials"] == 3
    assert math.isinf(arms.loc["candidate", "median"])  # two of three failed
    assert arms.loc["baseline", "min"] == 10.0 and math.isinf(arms.loc["baseline", "max"])
    reductions = stats.pair_table(frame)["reduction"].tolist()
    assert reductions[0] == -math.inf and reductions[1] == 1.0 and reductions[2] == 0.0
    claim = stats.claim_table(stats.pair_table(frame), stats.ClaimSettings(8)).iloc[0]
    assert claim["median"] == 0.0 and claim["min"] == -math.inf


@pytest.mark.parametrize(
    ("low", "high", "bar", "expected"),
    [
        (0.10, 0.13, 0.08, "clears"),
        (0.01, 0.05, 0.08, "fails"),
        (0.05, 0.10, 0.08, "ambiguous"),
        (-math.inf, 0.2, 0.08, "ambiguous"),
        (0.1, 0.2, None, "no bar"),
    ],
)
def test_verdict_three_outcomes(low: float, high: float, bar: float | None, expected: str) -> None:
    assert stats.verdict(low, high, bar) == expected


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (-0.004, 0.009, "within"),
        (-0.01, 0.01, "within"),
        (-0.1363, -0.0123, "outside"),
        (0.02, 0.05, "outside"),
        (-0.05, 0.005, "ambiguous"),
        (-0.02, 0.02, "ambiguous"),
        (-math.inf, -0.02, "outside"),
    ],
)
def test_a_control_is_judged_against_a_tolerance(low: float, high: float, expected: str) -> None:
    """An A/A control's --bar is a tolerance ±bar: inside it, wholly beyond it, or neither."""
    assert stats.verdict(low, high, 0.01, control=True) == expected


def test_clear_win_clears_and_clear_loss_fails() -> None:
    rows = []
    for r, (b, c) in enumerate([(100, 80), (101, 81), (99, 79), (100, 79), (102, 82)]):
        rows += [
            (r, "baseline", "baseline", "ok", b, "measured"),
            (r, "candidate", "candidate", "ok", c, "measured"),
        ]
    pairs = stats.pair_table(trials(rows))
    assert stats.claim_table(pairs, stats.ClaimSettings(8)).iloc[0]["verdict"] == "clears"
    assert stats.claim_table(pairs, stats.ClaimSettings(30)).iloc[0]["verdict"] == "fails"


def test_bootstrap_is_seeded_and_brackets_the_median() -> None:
    values = np.array([0.11, 0.12, 0.13, 0.105, 0.125, 0.118, 0.121])
    first = stats.bootstrap_median_interval(values, seed=3)
    assert first == stats.bootstrap_median_interval(values, seed=3)
    assert first[0] <= np.median(values) <= first[1]
    assert values.min() <= first[0] and first[1] <= values.max()


@pytest.mark.parametrize("pairs", [1, 2, 3, 5, 6])
def test_range_coverage_matches_simulation(pairs: int) -> None:
    """How often [min, max] of n draws covers the true median, simulated on a skewed law (median log 2)."""
    rng = np.random.default_rng(pairs)
    draws = rng.exponential(size=(200_000, pairs))
    median = math.log(2.0)
    covered = (draws.min(axis=1) <= median) & (median <= draws.max(axis=1))
    assert abs(covered.mean() - stats.range_coverage(pairs)) < 0.005  # binomial s.e. of the mean ≤ 0.0012


def test_three_pairs_cannot_reach_the_stated_level() -> None:
    """With 3 pairs the bootstrap interval is the observed range: 75% coverage, not 95%; 6 pairs can reach 95%."""
    values = np.array([0.3313, 0.3712, 0.3984])
    assert stats.bootstrap_median_interval(values) == (values.min(), values.max())
    assert stats.range_coverage(3) == 0.75
    assert stats.pairs_for_level(0.95) == 6 and stats.range_coverage(5) < 0.95 <= stats.range_coverage(6)
    table = stats.claim_table(
        pd.DataFrame({"case": "c", "arm": "cand", "baseline_arm": "base", "reduction": values}),
        stats.ClaimSettings(bar_percent=60),
    )
    assert table["range_coverage"].iloc[0] == 0.75 and table["verdict"].iloc[0] == "fails"


def test_interrupted_round_is_left_out_of_pairs() -> None:
    frame = trials(
        [
            (0, "baseline", "baseline", "ok", 10.0, "measured"),
            (0, "candidate", "candidate", "ok", 8.0, "measured"),
            (1, "baseline", "baseline", "ok", 10.0, "measured"),
        ]
    )
    claim = stats.claim_table(stats.pair_table(frame), stats.ClaimSettings(8), planned_pairs=2).iloc[0]
    assert claim["pairs"] == 1 and claim["planned_pairs"] == 2
