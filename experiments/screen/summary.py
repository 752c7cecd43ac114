"""The screen's summary table: one row per scale × arm (× guard), the spine's figures and the screen's own."""

from __future__ import annotations

import math

import pandas as pd

from experiments.screen.plan import NO_GUARD
from harness.plan import Plan
from harness.stats import finished, max_of, median_of
from harness.tables import Summaries

SUMMARY_CSV = "screen_summary.csv"

SUMMARY_COLUMNS = [
    "scale",
    "arm",
    "spec",
    "role",
    "guard",
    "trials",
    "failed",
    "ms_median",
    "ms_min",
    "ms_max",
    "host_ms_median",
    "floor_ms_median",
    "floor_note",
    "over_floor",
    "extra_peak_bytes_median",
    "extra_peak_bytes_max",
    "state_bytes_median",
    "ops_per_step_median",
    "window_replays_median",
    "plan_bytes_median",
    "peak_allocated_median",
    "reduction_vs_baseline_median",
    "reduction_vs_baseline_min",
    "reduction_vs_baseline_max",
    "ci_low",
    "ci_high",
    "collective_ms_median",
    "collective_share_median",
]


def summary_table(plan: Plan, summaries: Summaries) -> pd.DataFrame:
    """One row per scale × arm (× guard): the spine's median and range, plus the screen's own figures."""
    trials = summaries.trials
    ok = finished(trials)
    arms = summaries.arms.set_index(["case", "arm"]) if not summaries.arms.empty else None
    claims = summaries.claims.set_index(["case", "arm"]) if not summaries.claims.empty else None
    rows = []
    for case in plan.cases:
        for arm in case.arms:
            key = (case.label, arm.label)
            if arms is None or key not in arms.index:
                continue
            spine = arms.loc[key]
            mine = ok[(ok["case"] == case.label) & (ok["arm"] == arm.label)] if not ok.empty else ok
            notes = sorted({str(n) for n in mine.get("floor_note", pd.Series(dtype=str)).dropna() if str(n)})
            floor = median_of(mine, "floor_ms")
            claim = claims.loc[key] if claims is not None and key in claims.index else None
            rows.append(
                {
                    "scale": case.label,
                    "arm": arm.label,
                    "spec": arm.spec,
                    "role": arm.role,
                    "guard": arm.params.get("guard", NO_GUARD),
                    "trials": int(spine["trials"]),
                    "failed": int(spine["failed"]),
                    "ms_median": float(spine["median"]),
                    "ms_min": float(spine["min"]),
                    "ms_max": float(spine["max"]),
                    "host_ms_median": median_of(mine, "host_ms"),
                    "floor_ms_median": floor,
                    "floor_note": "; ".join(notes),
                    "over_floor": float(spine["median"]) / floor
                    if floor and math.isfinite(floor)
                    else math.nan,
                    "extra_peak_bytes_median": median_of(mine, "extra_peak_bytes"),
                    "extra_peak_bytes_max": max_of(mine, "extra_peak_bytes"),
                    "state_bytes_median": median_of(mine, "state_bytes"),
                    "ops_per_step_median": median_of(mine, "ops_per_step"),
                    "window_replays_median": median_of(mine, "window_replays"),
                    "plan_bytes_median": median_of(mine, "plan_bytes"),
                    "peak_allocated_median": median_of(mine, "peak_allocated"),
                    "reduction_vs_baseline_median": float(claim["median"]) if claim is not None else math.nan,
                    "reduction_vs_baseline_min": float(claim["min"]) if claim is not None else math.nan,
                    "reduction_vs_baseline_max": float(claim["max"]) if claim is not None else math.nan,
                    "ci_low": float(claim["ci_low"]) if claim is not None else math.nan,
                    "ci_high": float(claim["ci_high"]) if claim is not None else math.nan,
                    "collective_ms_median": median_of(mine, "collective_ms"),
                    "collective_share_median": median_of(mine, "collective_share"),
                }
            )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
