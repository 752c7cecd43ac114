"""The screen's summary table: one row per scale × arm (× guard), the spine's figures and the screen's own."""

from __future__ import annotations

import math

import pandas as pd

from experiments.screen.plan import NO_GUARD
from harness.plan import Plan
from harness.stats import finished, max_of, median_of
from harness.tables import Summaries

SUMMARY_CSV = "screen_summary.csv"
SUMMARY_COLUMNS = """scale arm spec role guard trials failed ms_median ms_min ms_max host_ms_median floor_ms_median
floor_note over_floor extra_peak_bytes_median extra_peak_bytes_max state_bytes_median ops_per_step_median
window_replays_median plan_bytes_median peak_allocated_median reduction_vs_baseline_median
reduction_vs_baseline_min reduction_vs_baseline_max ci_low ci_high collective_ms_median
collective_share_median""".split()
# Trial-log columns whose median over an arm's finished trials is a column of its own (``<name>_median``).
MEDIANS = """host_ms floor_ms extra_peak_bytes state_bytes ops_per_step window_replays plan_bytes peak_allocated
collective_ms collective_share""".split()
# The claim's columns, under the summary's names.
CLAIM_COLUMNS = {
    **{f"reduction_vs_baseline_{k}": k for k in ("median", "min", "max")},
    **{k: k for k in ("ci_low", "ci_high")},
}


def summary_table(plan: Plan, summaries: Summaries) -> pd.DataFrame:
    """One row per scale × arm (× guard): the spine's median and range, plus the screen's own figures."""
    ok = finished(summaries.trials)
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
            claim = claims.loc[key] if claims is not None and key in claims.index else None
            row = {f"{name}_median": median_of(mine, name) for name in MEDIANS}
            floor = row["floor_ms_median"]
            rows.append(
                {
                    **row,
                    "scale": case.label,
                    "arm": arm.label,
                    "spec": arm.spec,
                    "role": arm.role,
                    "guard": arm.params.get("guard", NO_GUARD),
                    "trials": int(spine["trials"]),
                    "failed": int(spine["failed"]),
                    **{f"ms_{k}": float(spine[k]) for k in ("median", "min", "max")},
                    "floor_note": "; ".join(notes),
                    "over_floor": float(spine["median"]) / floor
                    if floor and math.isfinite(floor)
                    else math.nan,
                    "extra_peak_bytes_max": max_of(mine, "extra_peak_bytes"),
                    **{
                        name: float(claim[k]) if claim is not None else math.nan
                        for name, k in CLAIM_COLUMNS.items()
                    },
                }
            )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
