"""Statistics of a run against hand-computed examples.

Medians, ranges, reductions and log ratios; failures, both-failed pairs left out and counted. The claim's
intervals and verdict at the stated level and at the bar's boundary. Also A/A arms against a tolerance,
diagnostics, flags and planning.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from harness import instability, sequential, stats
from harness.protocol_options import ProtocolOptions
from harness.schedule import Arm


def trials(rows: list[tuple], orders: list[str] | None = None) -> pd.DataFrame:
    """Rows of (round, arm, role, status, value, phase); slots follow the round's order (AB: the baseline
    first), indices the row order."""
    out = []
    for i, (r, a, role, s, v, p) in enumerate(rows):
        order = (orders or ["AB"] * 100)[r]
        first = "baseline" if order == "AB" else a
        slot = 0 if (role == "baseline") == (order == "AB") else 1
        out.append(
            {
                "index": i,
                "case": "c",
                "round": r,
                "slot": slot,
                "arm": a,
                "role": role,
                "status": s,
                "value": v,
                "phase": p,
                "order": order,
                "first": first,
            }
        )
    return pd.DataFrame(out)


def paired(values: list[tuple[float, float]], arm: str = "candidate", orders: list[str] | None = None):
    rows = []
    for r, (b, c) in enumerate(values):
        rows += [
            (r, "baseline", "baseline", "ok", b, "measured"),
            (r, arm, "candidate", "ok", c, "measured"),
        ]
    return trials(rows, orders)


def claim_of(frame: pd.DataFrame, **settings) -> pd.Series:
    pairs = stats.pair_table(frame)
    return stats.claim_table(pairs, stats.ClaimSettings(**settings), trials=frame).iloc[0]


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


def test_paired_reductions_log_ratios_and_order_by_hand() -> None:
    frame = paired([(10.0, 8.0), (20.0, 15.0), (10.0, 11.0)], orders=["AB", "BA", "AB"])
    pairs = stats.pair_table(frame)
    assert pairs["reduction"].tolist() == pytest.approx([0.2, 0.25, -0.1])
    assert pairs["log_ratio"].tolist() == pytest.approx([math.log(0.8), math.log(0.75), math.log(1.1)])
    assert pairs["arm_second"].tolist() == [True, False, True]  # AB: the candidate ran second
    claim = claim_of(frame, bar_percent=8)
    assert claim["estimate"] == pytest.approx(0.2)  # the primary: the median reduction
    # beside it, the geometric mean: 1 − (0.8 · 0.75 · 1.1)^(1/3) = 1 − 0.66^(1/3) = 0.129565
    assert claim["gm_estimate"] == pytest.approx(1 - 0.66 ** (1 / 3))
    assert (claim["median"], claim["min"], claim["max"]) == pytest.approx((0.2, -0.1, 0.25))
    assert claim["pairs"] == 3 and claim["both_failed"] == 0
    assert (claim["arm_second"], claim["arm_first"]) == (2, 1)
    # three pairs: every interval falls short of 95%, so the verdict says so rather than guess
    assert not claim["ci_sufficient"] and claim["verdict"] == "insufficient"
    assert claim["sign_attained"] == 0.75 and claim["sign_verdict"] == "insufficient"
    assert claim["hl_verdict"] == "insufficient" and claim["verdict_basis"] == "primary"


def test_the_geometric_mean_t_beside_keeps_the_old_calibrated_reading() -> None:
    """The geometric-mean t, kept beside the median as `gm_*`, by hand.

    Six pairs of log ratios 0.1, −0.1, 0.2, 0.0, 0.05, 0.15: mean 0.0666667, s = 0.1080123. At 6 pairs the
    stated 95% is computed at the calibration table's nominal 95.63%. There t(5 df, 0.97815) = 2.682292
    (scipy), and the half-width is 0.1182780. The reduction interval is [1 − e^0.1849446, 1 − e^−0.0516113] =
    [−20.315%, 5.030%]. The estimate is 1 − e^0.0666667 = −6.894%. A change of the stated level, or an
    uncalibrated interval, moves these bounds.
    """
    ratios = [0.1, -0.1, 0.2, 0.0, 0.05, 0.15]
    frame = paired([(10.0, 10.0 * math.exp(x)) for x in ratios])
    claim = claim_of(frame, bar_percent=-50)
    assert "nominal level 95.63%" in claim["gm_method"]
    assert (claim["gm_estimate"], claim["gm_low"], claim["gm_high"]) == pytest.approx(
        (-0.0689391, -0.2031518, 0.0503021), abs=1e-6
    )
    assert claim["gm_attained"] == pytest.approx(0.942577)  # its coverage on the reference skewed law
    assert claim["gm_sufficient"] and claim["gm_verdict"] == "clears"
    # the primary, the median's interval at 95% (interpolated), speaks from 5 pairs: above −50%, it clears
    assert claim["ci_sufficient"] and claim["ci_attained"] == 0.95 and claim["verdict"] == "clears"
    # the checks: six pairs' range attains 1 − 2/64 = 96.875% for the median, and so does HL's widest
    assert claim["sign_attained"] == claim["hl_attained"] == 1 - 2 / 64
    assert (claim["sign_low"], claim["sign_high"]) == pytest.approx((1 - math.exp(0.2), 1 - math.exp(-0.1)))
    assert claim["sign_verdict"] == claim["hl_verdict"] == "clears"
    assert stats.disagreeing_checks(claim) == []


def test_a_sufficient_claim_clears_and_a_clear_loss_fails() -> None:
    rng = np.random.default_rng(4)
    values = [(100.0, 100.0 * math.exp(-0.2 + 0.02 * z)) for z in rng.standard_normal(32)]
    claim = claim_of(paired(values), bar_percent=8)
    assert claim["ci_sufficient"] and claim["pairs"] == 32 and "nominal level 95.00%" in claim["gm_method"]
    assert claim["verdict"] == "clears" and claim["hl_verdict"] == claim["sign_verdict"] == "clears"
    assert claim_of(paired(values), bar_percent=30)["verdict"] == "fails"


def _percent_for(value: float) -> float | None:
    """A percent whose fraction (percent / 100, as the claims read it) is exactly ``value``, if one exists
    (about one double in five has none)."""
    centre = value * 100
    for steps in range(16):
        for direction in (math.inf, -math.inf):
            percent = centre
            for _ in range(steps):
                percent = np.nextafter(percent, direction)
            if percent / 100 == value:
                return float(percent)
    return None


def _exactly_at(make_frame, end: str, **settings) -> tuple[pd.DataFrame, float]:
    """A frame, and a limit in percent equal to the frame's claim interval end `end` exactly.

    The data are scaled by a hair until such a percent exists.
    """
    for k in range(50):
        frame = make_frame(1 + 1e-9 * k)
        value = float(claim_of(frame, **settings)[end])
        percent = _percent_for(abs(value))
        if percent is not None:
            return frame, percent
    raise AssertionError("no exactly representable limit found")


def _claim_values(scale: float, spread: float, shift: float, seed: int, arm: str = "candidate"):
    rng = np.random.default_rng(seed)
    return paired(
        [(100.0, 100.0 * scale * math.exp(shift + spread * z)) for z in rng.standard_normal(32)], arm=arm
    )


def test_a_claim_exactly_at_the_bar_is_ambiguous_through_the_claims_table() -> None:
    """The interval's low end equal to the bar counts as touching it: ambiguous, not clears; one float step
    lower, it clears. A mutation of the strict comparison (> to >=) fails here; so for the high end."""

    def make(scale: float) -> pd.DataFrame:
        return _claim_values(scale, 0.02, -0.2, 5)

    frame, bar = _exactly_at(make, "ci_low", bar_percent=8)
    assert claim_of(frame, bar_percent=bar)["ci_low"] == bar / 100
    assert claim_of(frame, bar_percent=bar)["verdict"] == "ambiguous"
    assert claim_of(frame, bar_percent=np.nextafter(bar, -1.0))["verdict"] == "clears"
    frame, bar = _exactly_at(make, "ci_high", bar_percent=8)
    assert claim_of(frame, bar_percent=bar)["verdict"] == "ambiguous"
    assert claim_of(frame, bar_percent=np.nextafter(bar, 100.0))["verdict"] == "fails"


def test_an_aa_arm_at_its_tolerance_is_ambiguous_and_inside_it_within() -> None:
    settings = {"bar_percent": None, "control": True}

    def make(scale: float) -> pd.DataFrame:
        return _claim_values(scale, 0.002, 0.004, 6, arm="baseline-control")  # the arm 0.4% slower

    frame, tolerance = _exactly_at(make, "ci_low", tolerance_percent=5, **settings)
    claim = claim_of(frame, tolerance_percent=tolerance, **settings)
    assert claim["kind"] == "control" and claim["ci_low"] == -tolerance / 100 and claim["ci_high"] < 0
    assert claim["verdict"] == "ambiguous"  # the interval touches −tolerance
    assert (
        claim_of(frame, tolerance_percent=np.nextafter(tolerance, 100.0), **settings)["verdict"] == "within"
    )
    assert claim_of(frame, tolerance_percent=5, **settings)["verdict"] == "within"
    assert claim_of(frame, tolerance_percent=0.05, **settings)["verdict"] == "outside"


def test_failed_trials_count_as_infinitely_slow_and_both_failed_pairs_are_left_out() -> None:
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
    pairs = stats.pair_table(frame)
    assert pairs["reduction"].iloc[0] == -math.inf and pairs["reduction"].iloc[1] == 1.0
    assert math.isnan(pairs["reduction"].iloc[2]) and pairs["both_failed"].tolist() == [False, False, True]
    claim = claim_of(frame, bar_percent=8)
    assert claim["pairs"] == 2 and claim["both_failed"] == 1 and claim["one_failed"] == 2
    assert claim["min"] == -math.inf and claim["max"] == 1.0  # the both-failed pair is not a 0
    assert claim["verdict_basis"] == "primary"  # failures never switch the estimand
    assert claim["verdict"] == "insufficient"  # two pairs' range attains only 50%
    assert (claim["failed_trials"], claim["arm_trials"]) == (2, 3)


def test_a_control_whose_every_trial_failed_is_insufficient_not_within() -> None:
    rows = []
    for r in range(6):
        rows += [
            (r, "baseline", "baseline", "resource_failure", None, "measured"),
            (r, "baseline-control", "candidate", "resource_failure", None, "measured"),
        ]
    claim = claim_of(trials(rows), bar_percent=None, control=True, tolerance_percent=1)
    assert claim["pairs"] == 0 and claim["both_failed"] == 6
    assert claim["verdict"] == "insufficient" and "both arms failed" in claim["ci_reason"]


def test_an_odd_count_states_its_order_imbalance_and_the_order_effect_apart_from_drift() -> None:
    """Five pairs AB, BA, AB, BA, AB: the candidate ran second in 3 and first in 2.

    Every trial run second is 10% slower (e^0.1), and the machine drifts 1% per trial. The difference of the
    orders' mean log ratios reads 0.2 + 2 * 0.01, the order effect plus twice the drift. Fitted together on
    the trials in run order, the order effect is e^0.2 - 1 = 22.14% and the drift 1.005% per trial, each
    exactly.
    """
    values = []
    for r in range(5):
        first, second = math.exp(0.01 * 2 * r), math.exp(0.1 + 0.01 * (2 * r + 1))
        baseline_first = r % 2 == 0  # AB
        values.append((10 * (first if baseline_first else second), 9 * (second if baseline_first else first)))
    frame = paired(values, orders=["AB", "BA"] * 3)
    clock = pd.Timestamp("2026-12-01T10:00:00Z")  # the trials ran in slot order within each round
    frame["started"] = [
        (clock + pd.Timedelta(seconds=2 * r + s)).isoformat()
        for r, s in zip(frame["round"], frame["slot"], strict=True)
    ]
    claim = claim_of(frame, bar_percent=8)
    assert (claim["arm_second"], claim["arm_first"]) == (3, 2)
    assert claim["order_effect"] == pytest.approx(100 * math.expm1(0.2))
    assert claim["drift"] == pytest.approx(100 * math.expm1(0.01))
    assert claim["order_low"] == pytest.approx(claim["order_effect"])  # no noise


def test_claim_settings_from_protocol() -> None:
    arms = (Arm("a", "baseline", "a"), Arm("a-control", "candidate", "a"))
    pure = stats.ClaimSettings.from_protocol(ProtocolOptions(arms, bar=1.0, control=True))
    assert pure.bar_percent is None and pure.tolerance_percent == 1.0 and pure.is_control("a-control", "a")
    three = arms[:1] + (Arm("b", "candidate", "b"),) + arms[1:]
    both = stats.ClaimSettings.from_protocol(ProtocolOptions(three, bar=8.0, control=True, tolerance=1.0))
    assert both.bar_percent == 8.0 and both.tolerance_percent == 1.0
    assert both.is_control("a-control", "a") and not both.is_control("b", "a")
    auto = stats.ClaimSettings.from_protocol(
        ProtocolOptions(arms[:1] + three[1:2], pairs="auto", precision=2.0)
    )
    assert auto.sequential and auto.max_pairs == 20 and auto.first_look == 6


def test_an_auto_run_reads_the_stopping_rules_interval() -> None:
    rng = np.random.default_rng(7)
    values = [(100.0, 100.0 * math.exp(-0.2 + 0.02 * z)) for z in rng.standard_normal(10)]  # MIN_STOP
    claim = claim_of(paired(values), bar_percent=8, precision=50.0, max_pairs=20)
    x = stats.pair_table(paired(values))["log_ratio"].to_numpy()
    decision = sequential.should_stop(x, 50.0, budget_spent=True)
    assert claim["ci_low"] == pytest.approx(decision.interval.low)
    assert claim["ci_nominal"] == pytest.approx(decision.per_look_level)
    assert "look 2 of [6, 10, 14, 20]" in claim["ci_method"] and claim["stopping"].startswith("precision")
    assert claim["ci_sufficient"]


def test_a_run_that_ends_at_its_last_look_or_between_looks_says_so_not_that_a_budget_was_spent() -> None:
    """A run that ran to its last look with no time budget says so, not 'time budget spent'.

    So does a run whose log stops between looks: a slice still to be resumed.
    """
    rng = np.random.default_rng(3)
    values = [(100.0, 100.0 * math.exp(-0.1 + 0.3 * z)) for z in rng.standard_normal(14)]
    last = claim_of(paired(values), bar_percent=5, precision=0.01, max_pairs=14)
    assert last["stopping"] == "last look (max pairs)"
    between = claim_of(paired(values[:9]), bar_percent=5, precision=0.01, max_pairs=14)
    assert between["stopping"] == "the log ends here (9 pairs): no more pairs to look at"


def test_the_runs_steal_flag_reads_each_trials_steal_as_the_trial_flag_does() -> None:
    """The run's steal flag and each trial's read steal one way: as a share of the time the trial wanted.

    Steal of 0.9% of all CPU time while the CPUs were 8.4% busy is 9.7% of the wanted time. That is above the
    trial flag's 3%.
    """
    frame = paired([(55.0, 50.0), (55.1, 50.2)])
    frame["cpu_busy_share"], frame["cpu_steal_share"] = 0.084, 0.009
    flags = instability.run_flags(frame, {"load1_start": 0.5, "cpu_logical": 16})
    assert [(f.subject, f.kind) for f in flags] == [("trials", "steal")]
    assert (
        flags[0].reason
        == "4 of 4 measured trials had CPU steal above 3% of the CPU time they wanted (at most 9.7%)"
    )
    frame["cpu_steal_share"] = 0.001  # 1.2% of the wanted time: no flag from either rule
    assert instability.run_flags(frame, {"load1_start": 0.5, "cpu_logical": 16}) == []


def test_drift_is_per_measured_trial_whatever_warm_ups_a_resume_put_between() -> None:
    """Drift is fitted per measured trial, whatever warm-ups a resume logged between them.

    Figures rise 1% per measured trial; a resume's warm-up sits between trials 8 and 9, at an index outside
    the schedule. The drift reads 1% per trial.
    """
    frame = paired([(10.0 * math.exp(0.01 * 2 * r), 9.0 * math.exp(0.01 * (2 * r + 1))) for r in range(8)])
    frame.loc[frame["index"] >= 8, "index"] += 1
    warmup = {**frame.iloc[8].to_dict(), "index": 8, "phase": "warmup", "round": -1}
    frame = pd.concat([frame, pd.DataFrame([warmup])], ignore_index=True)
    claim = claim_of(frame, bar_percent=8)
    assert claim["drift"] == pytest.approx(100 * math.expm1(0.01))


def test_drift_takes_a_level_per_resumed_slice() -> None:
    """Drift is a slope within slices: a resume's warm-up (`warmup_reason` resume) starts a slice with its own
    level.

    The committed baseline-d claim's last slice ran on a machine whose fits took half the time. Fitted across
    slices, that step alone read as a drift of -1.82% per trial.
    """
    frame = paired([(10.0 * (0.5 if r >= 4 else 1.0), 9.0 * (0.5 if r >= 4 else 1.0)) for r in range(8)])
    frame.loc[frame["index"] >= 8, "index"] += 1
    warmup = {**frame.iloc[8].to_dict(), "index": 8, "phase": "warmup", "round": -1}
    warmup["warmup_reason"] = "resume"
    frame = pd.concat([frame.iloc[:8], pd.DataFrame([warmup]), frame.iloc[8:]], ignore_index=True)
    claim = claim_of(frame, bar_percent=8)
    assert claim["drift"] == pytest.approx(0.0, abs=1e-9)
    # An idle gap's warm-up (the same machine, moments later) starts no slice: the step stays a trend there.
    frame.loc[frame["phase"] == "warmup", "warmup_reason"] = "idle gap of 42 s"
    assert claim_of(frame, bar_percent=8)["drift"] < -5


def test_instability_flags_from_the_trials_and_the_start_load() -> None:
    loaded = [14.9, 20.3, 31.0, 140.4, 30.0]
    frame = paired([(55.0, c) for c in loaded])
    flags = instability.run_flags(frame, {"load1_start": 5.2, "cpu_logical": 2})
    assert [(f.subject, f.kind) for f in flags] == [
        ("candidate", "spread"),
        ("candidate", "mad"),
        ("machine", "load"),
    ]
    assert (
        instability.run_flags(paired([(55.0, 50.0), (55.1, 50.2)]), {"load1_start": 0.5, "cpu_logical": 2})
        == []
    )


# --- a claims table over a second figure ---------------------------------------------------------------------


def test_a_secondary_figure_gets_the_same_claims_as_if_it_were_the_value() -> None:
    """`secondary_claims` over `steady_s` equals the claims table of the same trials with `steady_s` as their
    value.

    The same functions, bar and settings serve both; nothing of the primary figure leaks in.
    """
    whole = [(100.0, 80.0), (102.0, 83.0), (99.0, 79.0), (101.0, 84.0), (98.0, 80.0), (103.0, 82.0)]
    steady = [(50.0, 45.0), (51.0, 46.5), (49.5, 44.0), (50.5, 46.0), (49.0, 44.8), (51.5, 46.2)]
    frame = paired(whole, orders=["AB", "BA"] * 3)
    frame["steady_s"] = [v for pair in steady for v in pair]
    protocol = ProtocolOptions(
        (Arm("baseline", "baseline", "baseline"), Arm("candidate", "candidate", "c")), bar=8.0
    )
    secondary = stats.secondary_claims(frame, protocol, "steady_s").iloc[0]
    swapped = frame.assign(value=frame["steady_s"])
    expected = stats.claim_table(
        stats.pair_table(swapped), stats.ClaimSettings.from_protocol(protocol), 6, swapped
    ).iloc[0]
    for column in (
        "estimate",
        "ci_low",
        "ci_high",
        "sign_low",
        "sign_high",
        "hl_estimate",
        "drift",
        "order_effect",
    ):
        assert secondary[column] == pytest.approx(expected[column], nan_ok=True), column
    assert secondary["verdict"] == expected["verdict"] and secondary["bar"] == pytest.approx(0.08)
    x = np.log([c / b for b, c in steady])
    assert secondary["estimate"] == pytest.approx(1 - math.exp(np.median(x)))
    primary = stats.claim_table(stats.pair_table(frame), stats.ClaimSettings.from_protocol(protocol)).iloc[0]
    assert primary["estimate"] != pytest.approx(secondary["estimate"])


def test_a_secondary_figure_leaves_out_pairs_that_lack_it_and_keeps_failures_as_failures() -> None:
    frame = paired([(100.0, 80.0), (101.0, 81.0), (99.0, 82.0)])
    frame["steady_s"] = [50.0, 40.0, None, 41.0, 49.0, 42.0]  # round 1's baseline lacks the figure
    frame.loc[5, "status"] = "error"  # round 2's candidate failed: +∞, as in the claim
    protocol = ProtocolOptions((Arm("baseline", "baseline", "baseline"), Arm("candidate", "candidate", "c")))
    pairs = stats.pair_table(frame, "steady_s")
    assert list(pairs["round"]) == [0, 2] and math.isinf(pairs["log_ratio"].iloc[1])
    claim = stats.secondary_claims(frame, protocol, "steady_s").iloc[0]
    assert claim["pairs"] == 2 and claim["one_failed"] == 1


def test_no_secondary_claims_where_no_trial_carries_the_figure() -> None:
    frame = paired([(100.0, 80.0), (101.0, 81.0)])
    protocol = ProtocolOptions((Arm("baseline", "baseline", "baseline"), Arm("candidate", "candidate", "c")))
    assert stats.secondary_claims(frame, protocol, "steady_s").empty
    frame["steady_s"] = None
    assert stats.secondary_claims(frame, protocol, "steady_s").empty


def test_five_pairs_of_a_two_fold_speed_up_clear_the_bar() -> None:
    """The calibrated t read insufficient at every count from 3 to 24, so a 2x speed-up never cleared."""
    values = [(10.0, 5.0 * f) for f in (1.0, 1.01, 0.99, 1.02, 0.98)]
    claim = claim_of(paired(values, orders=["AB", "BA"] * 3), bar_percent=5)
    assert claim["verdict"] == "clears" and claim["ci_attained"] == 0.9375 and claim["pairs"] == 5
    assert claim_of(paired(values[:4]), bar_percent=5)["verdict"] == "insufficient"


def test_without_a_bar_the_verdict_says_faster_slower_or_no_difference_in_words() -> None:
    faster = [(10.0, 8.0 + 0.01 * r) for r in range(6)]
    assert claim_of(paired(faster), bar_percent=None)["verdict"] == "faster"
    slower = [(10.0, 12.0 + 0.01 * r) for r in range(6)]
    assert claim_of(paired(slower), bar_percent=None)["verdict"] == "slower"
    mixed = [(10.0, c) for c in (9.0, 11.0, 9.5, 10.5, 9.8, 10.2)]
    assert claim_of(paired(mixed), bar_percent=None)["verdict"] == "no difference detected"


def test_a_claim_given_a_tolerance_and_no_bar_asks_whether_it_is_equivalent() -> None:
    near = [(10.0, 10.0 * (1 + 0.001 * z)) for z in (-2, -1, 0, 1, 2, 0.5)]
    claim = claim_of(paired(near), bar_percent=None, tolerance_percent=1)
    assert claim["verdict"] == "within" and claim["kind"] == "claim" and claim["bar"] == 0.01


def test_one_failed_arm_keeps_the_median_estimand_and_states_the_failure_rate() -> None:
    """Two failed fits of 14 could still clear by the sign test while the report named the t interval."""
    values = [(10.0, 8.0 + 0.01 * r) for r in range(14)]
    frame = paired(values)
    frame.loc[frame.index[[3, 9]], "status"] = "error"  # rounds 1 and 4: the candidate failed
    claim = claim_of(frame, bar_percent=10)
    # 12 finished pairs and two at +∞: the 7th and 8th of 14 are 8.08 and 8.09 (of 10)
    assert claim["verdict_basis"] == "primary" and claim["estimate"] == pytest.approx(
        1 - math.sqrt(0.808 * 0.809)
    )
    assert (claim["failed_trials"], claim["arm_trials"]) == (2, 14)
    assert claim["failure_rate"] == pytest.approx(2 / 14)
    assert (claim["failure_low"], claim["failure_high"]) == pytest.approx((0.01779, 0.42814), abs=1e-4)


def test_drift_slices_follow_run_order_when_a_resume_falls_inside_a_grown_schedule() -> None:
    """Drift slices follow run order, not index order.

    A --pairs auto run grew to 10 pairs (indices 0-19), was cut after index 15 and resumed. The resume's
    warm-up took index 20, and indices 16-19 ran after it. A machine 10% slower after the resume is a new
    slice's level, not a drift.
    """
    values = [(10.0 * (1.1 if r >= 8 else 1.0), 9.0 * (1.1 if r >= 8 else 1.0)) for r in range(10)]
    frame = paired(values, orders=["AB", "BA"] * 5)
    clock = pd.Timestamp("2026-12-01T10:00:00Z")
    frame["started"] = [(clock + pd.Timedelta(seconds=10 * i)).isoformat() for i in range(len(frame))]
    late = frame["index"] >= 16
    frame.loc[late, "started"] = [
        (clock + pd.Timedelta(hours=1, seconds=10 * i)).isoformat() for i in range(4)
    ]
    warmup = {**frame.iloc[0].to_dict(), "index": 20, "phase": "warmup", "round": -1}
    warmup.update(warmup_reason="resume", started=(clock + pd.Timedelta(minutes=59)).isoformat())
    frame = pd.concat([frame, pd.DataFrame([warmup])], ignore_index=True)
    claim = claim_of(frame, bar_percent=8)
    assert abs(claim["drift"]) < 1e-9, claim["drift"]  # one level per slice, no trend within either
