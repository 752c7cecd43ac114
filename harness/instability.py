"""Warnings that travel with the data: an arm's spread, a loaded machine, CPU steal. Flags only warn: every
trial stays in the data."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from harness import telemetry
from harness.stats import measured

# Thresholds, argued from the house's measured noise: complete fits on one H200 gave a per-pair spread of
# the log ratio of 5.4% to 9%, i.e. 3.8% to 6.4% per trial. Forty trials of a lognormal law at 6.4% have an
# expected max/min of about exp(4.3 × 0.064) = 1.32 and a MAD/median of about 0.674 × 6.4% = 4.3%, so
# 1.5 and 10% lie beyond the house's ordinary noise and catch the outliers of a loaded machine (one arm's
# 14.9 to 140.4 s). CPU steal has one threshold, per trial, in ``harness.telemetry`` (STEAL_FLAG_SHARE).
MAX_OVER_MIN_LIMIT = 1.5
MAD_OVER_MEDIAN_LIMIT = 0.10


@dataclass(frozen=True)
class ArmSpread:
    """An arm's spread over its finished trials: max/min and MAD/median (raw median absolute deviation over
    the median); ``failed`` counts the trials without a figure (kept in the log and in every statistic)."""

    arm: str
    trials: int
    failed: int
    median: float
    max_over_min: float
    mad_over_median: float


def arm_spread(arm: str, values: ArrayLike) -> ArmSpread:
    """The spread of one arm's figures (non-finite: failed trials, counted, not measured)."""
    x = np.asarray(values, dtype=float).ravel()
    finished = x[np.isfinite(x)]
    if finished.size == 0:
        return ArmSpread(arm, x.size, x.size, math.nan, math.nan, math.nan)
    median = float(np.median(finished))
    mad = float(np.median(np.abs(finished - median)))
    return ArmSpread(
        arm, x.size, int(x.size - finished.size), median, float(finished.max() / finished.min()), mad / median
    )


@dataclass(frozen=True)
class Flag:
    """A warning that travels with the data: what, the figure, the threshold and a sentence."""

    subject: str
    kind: str
    value: float
    threshold: float
    reason: str


def arm_flags(
    values_by_arm: Mapping[str, ArrayLike],
    *,
    load_1min: float | None = None,
    cores: int | None = None,
    max_over_min: float = MAX_OVER_MIN_LIMIT,
    mad_over_median: float = MAD_OVER_MEDIAN_LIMIT,
) -> tuple[Flag, ...]:
    """Flags for unreliable figures: per arm, a max/min or MAD/median above its threshold; for the machine,
    a 1-minute load average above its cores (CPU steal is read per trial: ``harness.telemetry``). Flags only
    warn: every trial stays in the data."""
    flags: list[Flag] = []
    for arm, values in values_by_arm.items():
        spread = arm_spread(arm, values)
        if spread.max_over_min > max_over_min:
            flags.append(
                Flag(
                    arm,
                    "spread",
                    spread.max_over_min,
                    max_over_min,
                    f"{arm}: max/min {spread.max_over_min:.2f} > {max_over_min:g}",
                )
            )
        if spread.mad_over_median > mad_over_median:
            flags.append(
                Flag(
                    arm,
                    "mad",
                    spread.mad_over_median,
                    mad_over_median,
                    f"{arm}: MAD/median {spread.mad_over_median:.1%} > {mad_over_median:.0%}",
                )
            )
    if load_1min is not None and cores is not None and load_1min > cores:
        flags.append(
            Flag("machine", "load", load_1min, float(cores), f"1-minute load {load_1min:.2f} > {cores} cores")
        )
    return tuple(flags)


def run_flags(trials: pd.DataFrame, env: dict[str, Any] | None = None) -> list[Flag]:
    """Flags for figures made unreliable by their spread or their machine: per case and arm, the measured
    trials' max/min and MAD/median (failed trials counted, not measured); the 1-minute load at the run's
    start against its cores (``env``: ``load1_start``, ``cpu_logical``), and at each trial's start where the
    trial rows carry it; the trials whose CPU steal passed the per-trial flag's share of the CPU time they
    wanted (``telemetry.STEAL_FLAG_SHARE``: one rule for the trial and the run). Every trial stays in the data."""
    flags: list[Flag] = []
    rows = measured(trials)
    cases = list(dict.fromkeys(rows["case"])) if not rows.empty else []
    for case in cases:
        mine = rows[rows["case"] == case]
        values = {
            (f"{arm}" if len(cases) == 1 else f"{case} · {arm}"): group["effective"].to_numpy(dtype=float)
            for arm, group in mine.groupby("arm", sort=False)
        }
        flags += arm_flags(values)
    env = env or {}
    if env.get("load1_start") is not None and env.get("cpu_logical"):
        flags += arm_flags({}, load_1min=float(env["load1_start"]), cores=int(env["cpu_logical"]))
    if not rows.empty and "load1_start" in rows and "cpu_logical" in rows:
        loaded = rows[
            pd.to_numeric(rows["load1_start"], errors="coerce")
            > pd.to_numeric(rows["cpu_logical"], errors="coerce")
        ]
        if len(loaded):
            worst = float(pd.to_numeric(loaded["load1_start"]).max())
            cores = int(pd.to_numeric(loaded["cpu_logical"]).iloc[0])
            flags.append(
                Flag(
                    "trials",
                    "load",
                    worst,
                    float(cores),
                    f"{len(loaded)} of {len(rows)} measured trials started with the 1-minute load above the "
                    f"{cores} cores (at most {worst:.2f})",
                )
            )
    if not rows.empty and "cpu_steal_share" in rows and "cpu_busy_share" in rows:
        wanted = [telemetry.steal_of_wanted(row) for row in rows.to_dict("records")]  # None where unrecorded
        stolen = [w for w in wanted if w is not None and w > telemetry.STEAL_FLAG_SHARE]
        if stolen:
            flags.append(
                Flag(
                    "trials",
                    "steal",
                    max(stolen),
                    telemetry.STEAL_FLAG_SHARE,
                    f"{len(stolen)} of {len(rows)} measured trials had CPU steal above "
                    f"{telemetry.STEAL_FLAG_SHARE:.0%} of the CPU time they wanted (at most {max(stolen):.1%})",
                )
            )
    return flags
