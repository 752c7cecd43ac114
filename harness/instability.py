"""Warnings that travel with the data: an arm's spread, machine load, CPU steal; no trial is dropped."""

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

MAX_OVER_MIN_LIMIT = 1.5
MAD_OVER_MEDIAN_LIMIT = 0.10


@dataclass(frozen=True)
class ArmSpread:
    """An arm's spread over its finished trials: max/min and MAD/median."""

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
    mad_over_median = float(np.median(np.abs(finished - median))) / median
    ratio = float(finished.max() / finished.min())
    return ArmSpread(arm, x.size, int(x.size - finished.size), median, ratio, mad_over_median)


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
    """Flags for spread per arm and for a 1-minute load above the cores."""
    flags: list[Flag] = []
    for arm, values in values_by_arm.items():
        spread = arm_spread(arm, values)
        ratio, mad = spread.max_over_min, spread.mad_over_median
        checks = (("spread", ratio, max_over_min, f"max/min {ratio:.2f} > {max_over_min:g}"),)
        checks += (("mad", mad, mad_over_median, f"MAD/median {mad:.1%} > {mad_over_median:.0%}"),)
        flags += [Flag(arm, kind, v, top, f"{arm}: {text}") for kind, v, top, text in checks if v > top]
    if load_1min is not None and cores is not None and load_1min > cores:
        flags.append(
            Flag("machine", "load", load_1min, float(cores), f"1-minute load {load_1min:.2f} > {cores} cores")
        )
    return tuple(flags)


def run_flags(trials: pd.DataFrame, env: dict[str, Any] | None = None) -> list[Flag]:
    """Flags for a run's figures: per arm spread, machine load and CPU steal."""
    flags: list[Flag] = []
    rows = measured(trials)
    cases = list(dict.fromkeys(rows["case"])) if not rows.empty else []
    for case in cases:
        prefix = "" if len(cases) == 1 else f"{case} · "
        groups = rows[rows["case"] == case].groupby("arm", sort=False)["effective"]
        flags += arm_flags({f"{prefix}{arm}": group.to_numpy(dtype=float) for arm, group in groups})
    env = env or {}
    if env.get("load1_start") is not None and env.get("cpu_logical"):
        flags += arm_flags({}, load_1min=float(env["load1_start"]), cores=int(env["cpu_logical"]))
    if not rows.empty and "load1_start" in rows and "cpu_logical" in rows:
        load, cores = (pd.to_numeric(rows[c], errors="coerce") for c in ("load1_start", "cpu_logical"))
        loaded = load > cores
        if loaded.any():
            worst, top = float(load[loaded].max()), int(cores[loaded].iloc[0])
            text = f"{int(loaded.sum())} of {len(rows)} measured trials started with the 1-minute load above the "
            flags.append(
                Flag("trials", "load", worst, float(top), f"{text}{top} cores (at most {worst:.2f})")
            )
    if not rows.empty and "cpu_steal_share" in rows and "cpu_busy_share" in rows:
        wanted = [telemetry.steal_of_wanted(row) for row in rows.to_dict("records")]  # None where unrecorded
        stolen = [w for w in wanted if w is not None and w > telemetry.STEAL_FLAG_SHARE]
        if stolen:
            share = telemetry.STEAL_FLAG_SHARE
            text = f"{len(stolen)} of {len(rows)} measured trials had CPU steal above {share:.0%} of the CPU time"
            flags.append(
                Flag("trials", "steal", max(stolen), share, f"{text} they wanted (at most {max(stolen):.1%})")
            )
    return flags
