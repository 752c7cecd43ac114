"""Small-sample inference, by simulation and by hand.

Coverage of every interval and of the stopping rule by simulation; hand-computed examples, failed pairs,
verdict boundaries, planning, diagnostics and instability flags.

Coverage is simulated on the laws each method is judged on. The geometric-mean t interval: normal log ratios
and the reference skewed law (`sim.reference_skewed`, skewness 1.13). That skewness is the upper end
of the committed claim pairs'. Every law of `harness.sequential.LAWS` is in `test_the_geometric_mean_t_on_every_law`. The
distribution-free checks use normal and a centred standard exponential law (skewness 2).

The tolerance is the one the methods promise: coverage within 1.5 points of the stated level, unless the
interval says `insufficient`. With 20 000 draws a coverage near 95% has a simulation standard error of 0.15
points. Where a calibrated coverage lies closer than that to the window's edge, the check draws more, so a
pass is not luck. Every simulation is seeded.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats

from harness import instability, intervals, sequential, t_calibration
from tests import stats_simulations as sim

DRAWS = 20_000
SIZES = (4, 6, 8, 12, 20)
TOLERANCE = 0.015
LAWS = ("normal", "exponential")
T_LAWS = ("normal", "reference")
# Estimands of the centred exponential X − 1: mean 0; median log 2 − 1; pseudo-median (the median of the
# mean of two draws) = median of gamma(2) / 2 − 1, since X1 + X2 is gamma(2).
ESTIMANDS = {
    "normal": {"mean": 0.0, "median": 0.0, "pseudo_median": 0.0},
    "exponential": {"mean": 0.0, "median": math.log(2) - 1, "pseudo_median": stats.gamma.median(2) / 2 - 1},
}
REFERENCE_SD = math.sqrt(t_calibration.REFERENCE_DELAY_SHAPE * (1 + t_calibration.REFERENCE_SCALE_RATIO**2))


def draw(law: str, shape: tuple[int, int], seed: int, scale: float = 0.05) -> np.ndarray:
    """Log ratios with spread ``scale``: normal, the centred standard exponential, or the reference skewed
    law scaled to standard deviation ``scale``."""
    rng = np.random.default_rng(seed)
    if law == "normal":
        return scale * rng.standard_normal(shape)
    if law == "reference":
        return scale / REFERENCE_SD * sim.reference_skewed(rng, shape)
    return scale * (rng.standard_exponential(shape) - 1.0)


def covered(low: np.ndarray, high: np.ndarray, value: float) -> float:
    return float(np.mean((low <= value) & (value <= high)))


def simulation_error(level: float, draws: int) -> float:
    return 3 * math.sqrt(level * (1 - level) / draws)  # three standard errors of a simulated coverage


# ------------------------------------------------------------------------------------ coverage


# Pair counts beyond the five: where the calibrated interval is sufficient (2 pairs, whose 1-df
# interval is wide enough, and from 25 pairs at 95%), and past the table's last count (30), where the last
# nominal level is used. More draws where the calibrated coverage lies within a few simulation errors of the
# window's edge (0.21 point at 25 pairs).
T_CHECKS = {2: DRAWS, **{n: DRAWS for n in SIZES}, 25: 300_000, 46: 60_000, 120: DRAWS}


@pytest.mark.parametrize("law", T_LAWS)
@pytest.mark.parametrize("n", sorted(T_CHECKS))
def test_calibrated_t_interval_keeps_the_stated_level_or_says_insufficient(law: str, n: int) -> None:
    draws = T_CHECKS[n]
    x = draw(law, (draws, n), seed=100 + n + (0 if law == "normal" else 50))
    stated = intervals.t_interval(x[0])
    calibration = intervals.t_calibration(n)
    assert stated.stated_level == 0.95 and stated.nominal_level == calibration.nominal
    _, low, high = intervals.t_log_bounds(x, calibration.nominal)
    coverage = covered(low, high, 0.0)
    error = simulation_error(0.95, draws)
    if stated.sufficient:
        assert abs(coverage - 0.95) <= TOLERANCE, coverage
        assert stated.attained_level == pytest.approx(min(calibration.nominal, calibration.skewed_coverage))
    else:
        assert n < intervals.t_min_pairs(0.95) and "sufficient from 25 pairs" in stated.reason
    if law == "normal":  # the t interval is exact there: it covers its nominal level
        assert abs(coverage - calibration.nominal) <= error, coverage
    elif not stated.sufficient:  # why it says insufficient: even the best nominal level misses the window
        # (less the calibration's margin for its own simulation error: 1.47 points at 20 pairs is not kept)
        assert coverage < 0.95 - (TOLERANCE - t_calibration.CALIBRATION_MARGIN) + error, coverage
        assert abs(coverage - calibration.skewed_coverage) <= error + 0.002, coverage
    elif n <= max(t_calibration.NOMINAL_LEVELS[0.95]):  # what the table says it covers there
        assert abs(coverage - calibration.skewed_coverage) <= error + 0.002, coverage
    else:  # past the table the shortfall only shrinks
        assert coverage >= calibration.skewed_coverage - error, coverage


def test_the_uncalibrated_t_interval_is_why_a_calibration_exists() -> None:
    """At the stated 95% itself, the t interval covers the reference law's mean 93.7% at 6 pairs (400 000
    draws).

    That is more than the one-sided calibration's 0.75 point short.
    """
    x = draw("reference", (DRAWS, 6), seed=206)
    _, low, high = intervals.t_log_bounds(x, 0.95)
    assert covered(low, high, 0.0) < 0.95 - TOLERANCE / 2


LAW_COUNTS = (5, 6, 8, 10, 14, 25)
IN_BAND = ("normal", "skewness 1.1", "linear drift")  # up to the claim pairs' skewness: within 1.5 points
CONSERVATIVE = ("t, 3 df", "5% outliers, either arm")  # symmetric heavy tails: it covers more, 96.2-97.0%
SHORT = ("skewness 2.3", "skewness -2.3", "5% outliers, one arm")  # 90-94.4%: why the median is primary


def test_the_geometric_mean_t_on_every_law() -> None:
    """Coverage of each law's mean at the calibrated nominal level, 20 000 draws (0.15-point error).

    It holds the band up to skewness 1.1 and errs wide on symmetric heavy tails. It falls short on skewness
    2.3 and one-sided hiccups. So the t is a check beside the median, not the primary.
    """
    rng = np.random.default_rng(41)
    coverage = {}
    for name, law in sequential.LAWS.items():
        for n in LAW_COUNTS:
            _, low, high = intervals.t_log_bounds(law(rng, (DRAWS, n)), intervals.t_calibration(n).nominal)
            coverage[name, n] = covered(low, high, sim.mean_of(name))
    assert all(abs(coverage[k] - 0.95) <= TOLERANCE for k in coverage if k[0] in IN_BAND), coverage
    assert all(0.95 - TOLERANCE <= coverage[k] <= 0.975 for k in coverage if k[0] in CONSERVATIVE), coverage
    assert all(coverage[k] < 0.95 for k in coverage if k[0] in SHORT), coverage
    assert all(min(coverage[name, n] for n in LAW_COUNTS) < 0.95 - TOLERANCE for name in SHORT), coverage


def test_the_calibration_table_is_consistent() -> None:
    """The calibration table's one-sided nominal levels are consistent.

    Each is at or above the stated level and within 1.5 points of it. The reference law's coverage there is at
    most 0.75 point short. A count is sufficient exactly where the calibrated distance is within the window
    less the margin. The claim pairs' skewness is 1.13 at its upper end, not 2.28. The reference law matches
    the measured skewness's upper end.
    """
    assert (
        intervals.t_min_pairs(0.95) == 2
        and intervals.t_min_pairs(0.90) == 2
        and intervals.t_min_pairs(0.99) is None
    )
    assert t_calibration.MEASURED_PAIRS == 40 and t_calibration.MEASURED_SKEWNESS == pytest.approx(
        0.30, abs=0.01
    )
    for stated, table in t_calibration.NOMINAL_LEVELS.items():
        assert sorted(table) == list(range(2, 31))
        for nominal, skewed, distance, keeps in table.values():
            assert stated <= nominal <= stated + TOLERANCE + 1e-9
            assert skewed >= stated - TOLERANCE / 2 - 1e-6
            assert distance == pytest.approx(max(abs(nominal - stated), abs(skewed - stated)), abs=1e-6)
            assert keeps == (distance <= TOLERANCE - t_calibration.CALIBRATION_MARGIN)
    low, high = t_calibration.MEASURED_SKEWNESS_INTERVAL
    assert t_calibration.REFERENCE_SKEWNESS >= max(abs(low), abs(high))
    assert sim.delays_skewness(
        t_calibration.REFERENCE_DELAY_SHAPE, t_calibration.REFERENCE_SCALE_RATIO
    ) == pytest.approx(t_calibration.REFERENCE_SKEWNESS, abs=1e-5)
    x = sim.reference_skewed(np.random.default_rng(17), (2_000_000,))
    assert abs(float(x.mean())) < 0.002 and stats.skew(x) == pytest.approx(1.13, abs=0.05)
    # two exponential delays at scales 1 and 1/2 (the brief's example) give 1.25, and never more than 2
    assert sim.delays_skewness(1.0, 0.5) == pytest.approx(1.2522, abs=1e-4)
    assert sim.delays_skewness(1.0, 0.0) == 2.0


@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("n", SIZES)
def test_distribution_free_checks_keep_the_level_they_state(law: str, n: int) -> None:
    x = draw(law, (DRAWS, n), seed=100 + n + (0 if law == "normal" else 50))
    truth = ESTIMANDS[law]
    scale = 0.05

    checks = [
        # Sign-test order statistics of the median: exact for any continuous law, at its attained level.
        (intervals.median_log_bounds(x, 0.95, interpolate=False), intervals.sign_interval(x[0]), "median"),
        # Hodges–Lehmann with the Wilcoxon interval, of the centre (the pseudo-median on the skewed law).
        (
            intervals.hodges_lehmann_log_bounds(x, 0.95),
            intervals.hodges_lehmann_interval(x[0]),
            "pseudo_median",
        ),
    ]
    for (_, low, high, attained), stated, estimand in checks:
        coverage = covered(low, high, scale * truth[estimand])
        assert stated.attained_level == attained
        assert abs(coverage - attained) <= TOLERANCE, (estimand, coverage, attained)
        assert stated.sufficient == (n >= 6)
        if stated.sufficient:
            assert coverage >= 0.95 - TOLERANCE


def test_public_intervals_match_the_vectorized_bounds() -> None:
    x = draw("exponential", (20, 9), seed=3)
    for row in x:
        nominal = intervals.t_calibration(9).nominal
        mean, low, high = intervals.t_log_bounds(row, nominal)
        t = intervals.t_interval(row)
        assert (t.estimate, t.low, t.high) == pytest.approx(
            (1 - math.exp(mean), 1 - math.exp(high), 1 - math.exp(low))
        )
        _, low, high, _ = intervals.median_log_bounds(row, 0.95, interpolate=False)
        sign = intervals.sign_interval(row)
        assert (sign.low, sign.high) == pytest.approx((1 - math.exp(high), 1 - math.exp(low)))
        centre, low, high, _ = intervals.hodges_lehmann_log_bounds(row)
        hl = intervals.hodges_lehmann_interval(row)
        assert (hl.estimate, hl.low, hl.high) == pytest.approx(
            (1 - math.exp(centre), 1 - math.exp(high), 1 - math.exp(low))
        )


# ------------------------------------------------------------------------------- hand examples


def test_t_interval_by_hand_at_the_calibrated_level() -> None:
    # Log ratios 0.1, −0.1, 0.2, 0.0: mean 0.05; squared deviations 0.0025 + 0.0225 + 0.0225 + 0.0025 =
    # 0.05, s = √(0.05/3) = 0.129099, s/√4 = 0.0645497. At 4 pairs the 95% interval is computed at the
    # nominal 95.42% of the table: t(3 df, 0.9771) = 3.298061 (scipy), half-width 0.212889, log interval
    # [−0.162889, 0.262889]. As reductions: 1 − e^0.262889 = −0.300682, 1 − e^−0.162889 = 0.150314;
    # estimate 1 − e^0.05 = −0.051271. It attains 94.26% on the reference law: sufficient.
    assert t_calibration.NOMINAL_LEVELS[0.95][4][0] == 0.9542
    interval = intervals.t_interval([0.1, -0.1, 0.2, 0.0])
    assert interval.stated_level == 0.95 and interval.nominal_level == 0.9542
    assert interval.attained_level == 0.94255  # the simulated coverage on the reference law
    assert (interval.estimate, interval.low, interval.high) == pytest.approx(
        (-0.051271, -0.300682, 0.150314), abs=1e-6
    )
    assert interval.n == 4 and interval.sufficient
    # At a level not calibrated (80%) the interval is computed at that level and says so: t(3 df, 0.90) =
    # 1.637744, half-width 0.105716, low = 1 − e^(0.05 + 0.105716) = −0.168494.
    eighty = intervals.t_interval([0.1, -0.1, 0.2, 0.0], 0.80)
    assert eighty.low == pytest.approx(-0.168494, abs=1e-5) and "calibrated only at" in eighty.reason
    assert not eighty.sufficient and eighty.nominal_level == 0.80
    # 32 pairs at the nominal 95.00%, t(31 df, 0.975) = 2.039513 (scipy).
    ratios = np.tile([0.1, -0.1, 0.2, 0.0], 8)  # mean 0.05, s = √(0.05·8/31) = 0.113592
    interval = intervals.t_interval(ratios)
    half = 2.039513 * 0.113592 / math.sqrt(32)
    assert interval.sufficient and interval.nominal_level == 0.95
    assert (interval.low, interval.high) == pytest.approx(
        (1 - math.exp(0.05 + half), 1 - math.exp(0.05 - half)), abs=1e-6
    )


def test_t_interval_needs_two_pairs() -> None:
    assert not intervals.t_interval([0.1]).computable
    assert "at least 2 pairs" in intervals.t_interval([0.1]).reason


def test_sign_interval_by_hand() -> None:
    # Six pairs: the range, which misses the median only when all six fall on one side: 1 − 2/64.
    ratios = np.log([0.90, 0.95, 0.85, 1.00, 0.92, 0.97])  # reductions 10%, 5%, 15%, 0%, 8%, 3%
    interval = intervals.sign_interval(ratios)
    assert (interval.low, interval.high) == pytest.approx((0.0, 0.15))
    assert interval.estimate == pytest.approx((0.05 + 0.08) / 2)
    assert interval.attained_level == 1 - 2 / 64 and interval.sufficient
    # Five pairs: the range attains 1 − 2/32 = 93.75% < 95%: insufficient, and it says what it attains.
    short = intervals.sign_interval(ratios[:5])
    assert short.attained_level == 1 - 2 / 32 and not short.sufficient and "needs 6" in short.reason
    # Twelve pairs: P(B ≤ 2) = (1 + 12 + 66)/4096, so order statistics 3 and 10 attain 1 − 158/4096.
    twelve = np.log(1 - np.arange(1, 13) / 100)  # reductions 1% … 12%
    interval = intervals.sign_interval(twelve)
    assert interval.attained_level == pytest.approx(1 - 158 / 4096)
    assert (interval.low, interval.high) == pytest.approx((0.03, 0.10))
    assert intervals.sign_test_rank(8) == (1, 1 - 2 / 256)  # P(B ≤ 1) = 9/256 would leave 92.97%


def test_hodges_lehmann_by_hand() -> None:
    # 0, 1, 3: Walsh averages 0, 0.5, 1, 1.5, 2, 3; median 1.25. Three pairs reach at most 1 − 2/8 = 75%.
    interval = intervals.hodges_lehmann_interval([0.0, 1.0, 3.0], level=0.75)
    assert interval.estimate == pytest.approx(1 - math.exp(1.25))
    assert (interval.low, interval.high) == pytest.approx((1 - math.exp(3.0), 0.0))
    assert interval.attained_level == 0.75 and interval.sufficient
    assert not intervals.hodges_lehmann_interval([0.0, 1.0, 3.0]).sufficient
    # 0.01 … 0.08: the 36 Walsh averages sorted begin 0.01, 0.015, 0.02, 0.02; P(T+ ≤ 3) = 5/256 for 8
    # values (sums 0, 1, 2, 3 = 3, 3 = 1 + 2), so averages 4 and 33 attain 1 − 10/256 = 96.09%; by symmetry
    # average 33 is 0.09 − 0.02 = 0.07, and the estimate is 0.045.
    interval = intervals.hodges_lehmann_interval(np.arange(1, 9) / 100)
    assert interval.attained_level == pytest.approx(1 - 10 / 256)
    assert (interval.estimate, interval.low, interval.high) == pytest.approx(
        (1 - math.exp(0.045), 1 - math.exp(0.07), 1 - math.exp(0.02))
    )


def test_signed_rank_null_matches_scipy_exact_test() -> None:
    null = intervals.signed_rank_null(6)
    assert null.sum() == pytest.approx(1.0) and null[0] == 1 / 64 and null[3] == 2 / 64
    rng = np.random.default_rng(5)
    for n in (5, 8, 11):
        values = rng.standard_normal(n)
        positive_rank_sum = stats.rankdata(np.abs(values))[values > 0].sum()
        expected = stats.wilcoxon(values, alternative="greater", method="exact").pvalue
        assert intervals.signed_rank_null(n)[int(positive_rank_sum) :].sum() == pytest.approx(expected)


# ---------------------------------------------------------------------------------------- failures


def test_both_failed_pairs_are_dropped_and_counted() -> None:
    split = intervals.split_pairs([10, math.inf, 10, math.inf, 10], [9, math.inf, math.inf, 8, 10])
    assert split.both_failed == 1 and split.log_ratios.size == 4 and np.isinf(split.log_ratios).sum() == 2
    assert split.kept.tolist() == [True, False, True, True, True]
    assert split.log_ratios.tolist() == pytest.approx([math.log(0.9), math.inf, -math.inf, 0.0])


def test_an_all_failed_control_is_not_within() -> None:
    split = intervals.split_pairs([math.inf] * 6, [math.inf] * 6)
    assert split.log_ratios.size == 0 and split.both_failed == 6
    for method in (intervals.t_interval, intervals.sign_interval, intervals.hodges_lehmann_interval):
        assert intervals.control_verdict(method(split.log_ratios), 0.01) == "insufficient"


def test_one_failed_arm_leaves_only_the_order_statistic_interval() -> None:
    base = [10.0, 10.0, 10.0, 10.0, 10.0, 10.0]
    arm = [9.0, 9.5, math.inf, 8.8, 9.2, 9.1]  # the arm ran out of memory once
    ratios = intervals.split_pairs(base, arm).log_ratios
    t, hl, sign = (
        intervals.t_interval(ratios),
        intervals.hodges_lehmann_interval(ratios),
        intervals.sign_interval(ratios),
    )
    assert not t.computable and "infinite" in t.reason
    assert not hl.computable and "infinite" in hl.reason
    assert sign.computable and sign.sufficient and sign.low == -math.inf and sign.high == pytest.approx(0.12)
    assert intervals.claim_verdict(sign, 0.05) == "ambiguous"
    assert intervals.claim_verdict(sign, 0.20) == "fails"
    # A failed baseline ranks as +100% at the top end.
    ratios = intervals.split_pairs([math.inf, 10, 10, 10, 10, 10], [9.0, 9.5, 9.0, 8.8, 9.2, 9.1]).log_ratios
    assert intervals.sign_interval(ratios).high == 1.0


def test_nan_log_ratios_are_refused() -> None:
    with pytest.raises(ValueError, match="NaN"):
        intervals.t_interval([0.1, math.nan])


# ---------------------------------------------------------------------------------------- verdicts


def interval(low: float, high: float, sufficient: bool = True) -> intervals.Interval:
    return intervals.Interval("e", "m", (low + high) / 2, low, high, 0.95, 0.95, 60, sufficient)


def test_claim_verdict_exactly_at_the_bar() -> None:
    bar = 0.08
    assert intervals.claim_verdict(interval(bar, 0.2), bar) == "ambiguous"  # touching counts as straddling
    assert intervals.claim_verdict(interval(np.nextafter(bar, 1.0), 0.2), bar) == "clears"
    assert intervals.claim_verdict(interval(-0.1, bar), bar) == "ambiguous"
    assert intervals.claim_verdict(interval(-0.1, np.nextafter(bar, 0.0)), bar) == "fails"
    assert intervals.claim_verdict(interval(0.05, 0.1), bar) == "ambiguous"
    assert intervals.claim_verdict(interval(0.1, 0.2, sufficient=False), bar) == "insufficient"


def test_control_verdict_exactly_at_the_tolerance() -> None:
    tol = 0.01
    assert intervals.control_verdict(interval(-0.005, 0.005), tol) == "within"
    assert intervals.control_verdict(interval(-tol, 0.005), tol) == "ambiguous"
    assert intervals.control_verdict(interval(-0.005, tol), tol) == "ambiguous"
    assert (
        intervals.control_verdict(interval(np.nextafter(-tol, 0.0), np.nextafter(tol, 0.0)), tol) == "within"
    )
    assert intervals.control_verdict(interval(tol, 0.03), tol) == "ambiguous"
    assert intervals.control_verdict(interval(np.nextafter(tol, 1.0), 0.03), tol) == "outside"
    assert intervals.control_verdict(interval(-0.03, np.nextafter(-tol, -1.0)), tol) == "outside"
    assert intervals.control_verdict(interval(-0.005, 0.005, sufficient=False), tol) == "insufficient"


# ------------------------------------------------------------------------------------ stopping rule


# -------------------------------------------------------------------------------------- diagnostics


# -------------------------------------------------------------------------------------- instability


def test_unstable_arm_flagged_and_kept() -> None:
    loaded = [14.9, 20.3, 31.0, 140.4, math.inf]  # one arm on a loaded machine, and one failed trial
    steady = [54.5, 55.0, 54.8, 55.3]
    flags = instability.arm_flags({"candidate": loaded, "baseline": steady})
    assert [(f.subject, f.kind) for f in flags] == [("candidate", "spread"), ("candidate", "mad")]
    assert flags[0].value == pytest.approx(140.4 / 14.9)
    spread = instability.arm_spread("candidate", loaded)
    assert spread.trials == 5 and spread.failed == 1  # the failed trial is counted, not dropped
    # a bimodal arm within 1.5x: MAD/median 0.15 / 1.15 = 13%
    bimodal = instability.arm_flags({"a": [1.0, 1.0, 1.0, 1.3, 1.3, 1.3]})
    assert [f.kind for f in bimodal] == ["mad"]


def test_machine_load_flag() -> None:
    flags = instability.arm_flags({}, load_1min=3.1, cores=2)
    assert [f.kind for f in flags] == ["load"]
    assert instability.arm_flags({}, load_1min=1.9, cores=2) == ()


def test_a_failed_arm_on_each_side_leaves_the_median_undefined_without_a_numpy_warning() -> None:
    """A candidate failure (+∞) and a baseline failure (−∞) leave the two middle log ratios with no midpoint.

    The interval is still the order statistics, and numpy prints no RuntimeWarning.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        interval = intervals.sign_interval([math.inf, -math.inf])
        median, low, high, _ = intervals.median_log_bounds(
            np.array([[math.inf, -math.inf], [0.1, 0.2]]), 0.95, interpolate=False
        )
    assert (interval.low, interval.high) == (-math.inf, 1.0)
    assert math.isnan(float(median[0])) and (float(low[0]), float(high[0])) == (-math.inf, math.inf)
    assert float(median[1]) == pytest.approx(0.15)


def test_the_counts_the_calibrated_t_interval_does_not_keep_are_named_as_they_are() -> None:
    """Calibrated on the claim pairs' law it keeps its level at every count; the words still say so."""
    assert sim.t_unkept_counts_text(0.95) == "at no count"
    assert sim.t_unkept_counts_text(0.90) == "at no count"
