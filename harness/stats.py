"""Statistics of a run: per-arm medians and ranges, paired reductions, bootstrap interval and verdict.

Conventions, stated once:

* Only ``phase == 'measured'`` trials count; warm-ups stay in the log and out of every figure here.
* A failed trial (``status`` not ``ok``) counts against its arm as an infinitely slow trial, the way
  time-to-result benchmarks count a miss: it is never dropped. A reduction with a failed candidate is −∞;
  with a failed baseline and a finished candidate, +100%; when both failed, 0 (no evidence either way).
* Reduction of a round = (baseline − candidate) / baseline, one per candidate arm per round.
* Interval: percentile bootstrap of the median reduction (resampling rounds with replacement), seeded,
  10 000 resamples, 95% by default; order statistics are taken directly so infinities stay ordered.
* Verdict against a bar b: ``clears`` when the whole interval is above b, ``fails`` when it is wholly
  below, ``ambiguous`` when it straddles b.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

BOOTSTRAP_RESAMPLES = 10_000
CONFIDENCE = 0.95
CI_METHOD = f"percentile bootstrap of the median, {BOOTSTRAP_RESAMPLES} resamples"


def measured(trials: pd.DataFrame) -> pd.DataFrame:
    """Measured rows, with ``effective`` = the value, or +∞ for a failed trial."""
    if trials.empty:
        return trials.assign(effective=pd.Series(dtype=float))
    rows = trials[trials["phase"] == "measured"].copy()
    ok = rows["status"] == "ok"
    rows["effective"] = np.where(ok, pd.to_numeric(rows["value"], errors="coerce"), np.inf)
    return rows


def finished(trials: pd.DataFrame) -> pd.DataFrame:
    """Measured rows whose trial finished: where figures other than the primary one (peaks, host time,
    stage times) exist. A failure still counts against its arm in the primary figure (``measured``)."""
    if trials.empty:
        return trials
    return trials[(trials["phase"] == "measured") & (trials["status"] == "ok")]


def numeric_column(rows: pd.DataFrame, column: str) -> pd.Series:
    """A per-trial figure as numbers, missing values dropped; empty where the trials do not carry it."""
    if column not in rows:
        return pd.Series(dtype=float)
    return pd.to_numeric(rows[column], errors="coerce").dropna()


def median_of(rows: pd.DataFrame, column: str) -> float:
    """The median of a per-trial figure over ``rows``; NaN where none of them carries it."""
    values = numeric_column(rows, column)
    return float(values.median()) if len(values) else math.nan


def max_of(rows: pd.DataFrame, column: str) -> float:
    """The largest value of a per-trial figure over ``rows``; NaN where none of them carries it."""
    values = numeric_column(rows, column)
    return float(values.max()) if len(values) else math.nan


def reduction(baseline: float, candidate: float) -> float:
    """(baseline − candidate) / baseline, with the failure conventions of this module."""
    if math.isinf(baseline) and math.isinf(candidate):
        return 0.0
    if math.isinf(baseline):
        return 1.0
    if math.isinf(candidate):
        return -math.inf
    return (baseline - candidate) / baseline


def arm_table(trials: pd.DataFrame) -> pd.DataFrame:
    """Per case and arm: measured trials, failures, median and (min–max) of the primary figure."""
    rows = measured(trials)
    columns = ["case", "arm", "role", "trials", "failed", "median", "min", "max"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    out = []
    for (case, arm), group in rows.groupby(["case", "arm"], sort=False):
        values = group["effective"].to_numpy(dtype=float)
        out.append(
            {
                "case": case,
                "arm": arm,
                "role": group["role"].iloc[0],
                "trials": len(values),
                "failed": int((group["status"] != "ok").sum()),
                "median": float(np.median(values)),
                "min": float(values.min()),
                "max": float(values.max()),
            }
        )
    return pd.DataFrame(out, columns=columns)


def pair_table(trials: pd.DataFrame) -> pd.DataFrame:
    """One row per round and candidate arm: the baseline's and candidate's figures and the reduction.

    The reference of a case is its baseline-role arm (the first arm); every other arm is compared with it
    round by round. Rounds missing either side (an interrupted run) are left out and counted by the claim.
    """
    rows = measured(trials)
    columns = ["case", "round", "order", "baseline_arm", "arm", "baseline", "candidate", "reduction"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    out = []
    for case, group in rows.groupby("case", sort=False):
        reference = group[group["role"] == "baseline"]["arm"]
        if reference.empty:
            continue
        reference_arm = reference.iloc[0]
        for rnd, in_round in group.groupby("round", sort=True):
            base = in_round[in_round["arm"] == reference_arm]
            if base.empty:
                continue
            b = float(base["effective"].iloc[0])
            for _, other in in_round[in_round["arm"] != reference_arm].iterrows():
                c = float(other["effective"])
                out.append(
                    {
                        "case": case,
                        "round": int(rnd),
                        "order": other["order"],
                        "baseline_arm": reference_arm,
                        "arm": other["arm"],
                        "baseline": b,
                        "candidate": c,
                        "reduction": reduction(b, c),
                    }
                )
    return pd.DataFrame(out, columns=columns)


def bootstrap_median_interval(
    values: np.ndarray, seed: int = 0, level: float = CONFIDENCE, resamples: int = BOOTSTRAP_RESAMPLES
) -> tuple[float, float]:
    """Percentile bootstrap interval of the median of ``values`` (infinities allowed, NaN not)."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, values.size, size=(resamples, values.size))
    samples = np.sort(values[draws], axis=1)
    n = values.size
    lower_mid, upper_mid = samples[:, (n - 1) // 2], samples[:, n // 2]
    with np.errstate(invalid="ignore"):
        medians = np.where(lower_mid == upper_mid, lower_mid, (lower_mid + upper_mid) / 2)
    medians = np.sort(medians)
    tail = int(math.floor((1 - level) / 2 * resamples))  # draws left out at each end
    return float(medians[tail]), float(medians[resamples - 1 - tail])


def range_coverage(pairs: int) -> float:
    """Distribution-free probability that the range [min, max] of ``pairs`` independent reductions covers their
    true median: 1 − 2·0.5^n (each pair falls either side of the median with probability one half). A
    bootstrap interval of the median never leaves that range, so below the nominal level (n < 6 for 95%) the
    stated level is not attained: 75% at 3 pairs, 93.75% at 5."""
    return 0.0 if pairs < 1 else 1.0 - 2.0 * 0.5**pairs


def pairs_for_level(level: float = CONFIDENCE) -> int:
    """The fewest pairs whose range can cover the true median with probability ``level`` (6 for 95%)."""
    return max(1, math.ceil(math.log2(2.0 / (1.0 - level)) - 1e-12))


def verdict(low: float, high: float, bar: float | None, control: bool = False) -> str:
    """The verdict of an interval [low, high] (fractions). A claim against a bar: ``clears`` / ``fails`` /
    ``ambiguous``. An A/A control against a tolerance of ±bar: ``within`` (the interval lies inside it),
    ``outside`` (wholly beyond it on one side) or ``ambiguous``."""
    if bar is None:
        return "no bar"
    if math.isnan(low) or math.isnan(high):
        return "no pairs"
    if control:
        if -bar <= low and high <= bar:
            return "within"
        if low > bar or high < -bar:
            return "outside"
        return "ambiguous"
    if low > bar:
        return "clears"
    if high < bar:
        return "fails"
    return "ambiguous"


@dataclass(frozen=True)
class ClaimSettings:
    bar_percent: float | None  # with ``control``, the A/A tolerance ±bar
    seed: int = 0
    level: float = CONFIDENCE
    control: bool = False


def claim_table(
    pairs: pd.DataFrame, settings: ClaimSettings, planned_pairs: int | None = None
) -> pd.DataFrame:
    """Per case and candidate arm: pairs, median and (min–max) reduction, interval and verdict."""
    columns = [
        "case",
        "arm",
        "baseline_arm",
        "pairs",
        "planned_pairs",
        "median",
        "min",
        "max",
        "ci_low",
        "ci_high",
        "ci_level",
        "ci_method",
        "range_coverage",
        "bar",
        "verdict",
    ]
    if pairs.empty:
        return pd.DataFrame(columns=columns)
    bar = None if settings.bar_percent is None else settings.bar_percent / 100
    out = []
    for (case, arm), group in pairs.groupby(["case", "arm"], sort=False):
        values = group["reduction"].to_numpy(dtype=float)
        low, high = bootstrap_median_interval(values, settings.seed, settings.level)
        out.append(
            {
                "case": case,
                "arm": arm,
                "baseline_arm": group["baseline_arm"].iloc[0],
                "pairs": len(values),
                "planned_pairs": planned_pairs,
                "median": float(np.median(values)),
                "min": float(values.min()),
                "max": float(values.max()),
                "ci_low": low,
                "ci_high": high,
                "ci_level": settings.level,
                "ci_method": CI_METHOD,
                "range_coverage": range_coverage(len(values)),
                "bar": bar,
                "verdict": verdict(low, high, bar, settings.control),
            }
        )
    return pd.DataFrame(out, columns=columns)
