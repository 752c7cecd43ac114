"""The calibration arm (``--calibrate SIZE``): the baseline with a known host delay, and its reading.

The reading is how much of the known delay a design recovers (docs/methods.md).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from harness import intervals
from harness.errors import InputError
from harness.injected import FIGURE, ROLE
from harness.intervals import CONFIDENCE
from harness.schedule import Arm
from harness.stats import measured
from harness.tables import RunFolder

LABEL = "calibration"
PARAM = "delay"  # the arm's parameter: the size as given, normalised ("5%" or "2.5s")
OF = "of"  # the arm's parameter: the label of the arm it runs (the first)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(%|s)?\s*$")
MAX_SHARE = 50.0  # percent of a trial
MAX_SECONDS = 24 * 3600.0
MARGIN = 0.1  # an interval inside 0.9-1.1 is recovered even where it misses 1 (the target band)


def parse_size(text: str) -> str:
    """``--calibrate``'s size, normalised to ``5%`` or ``2.5s``; ``InputError`` otherwise."""
    found = _SIZE.match(str(text))
    accepted = "give seconds (2.5 or 2.5s) or a share of a baseline trial (5%)"
    if not found:
        raise InputError(f"--calibrate '{text}' is not a size; {accepted}")
    number, unit = float(found.group(1)), found.group(2) or "s"
    top = MAX_SHARE if unit == "%" else MAX_SECONDS
    if not 0 < number <= top:
        raise InputError(f"--calibrate '{text}' must be above 0 and at most {top:g}{unit}; {accepted}")
    return f"{number:g}{unit}"


def calibration_arm(first: Arm, size: str) -> Arm:
    """The first arm again, with the delay (``size`` as ``parse_size`` gives it) as its parameter."""
    return Arm(LABEL, ROLE, first.spec, {**first.params, PARAM: size, OF: first.label})


def runs_as(arm: Arm) -> Arm:
    """The arm whose code a trial runs: the first arm for the calibration arm, else ``arm`` itself."""
    return replace(arm, label=arm.params[OF]) if is_calibration(arm) else arm


def with_calibration(arms: tuple[Arm, ...], size: str | None, warmup: int | str) -> tuple[Arm, ...]:
    """``arms`` with the calibration arm added where ``size`` is given (``InputError`` where it cannot run)."""
    if size is None:
        return arms
    normal = parse_size(size)
    if LABEL in {a.label for a in arms}:
        raise InputError(f"--arms already names '{LABEL}', the label --calibrate gives its arm; rename it")
    if normal.endswith("%") and warmup == 0:
        raise InputError(
            f"--calibrate {normal} is sized from a baseline warm-up; give --warmup 1 or more, or seconds"
        )
    return (*arms, calibration_arm(arms[0], normal))


def is_calibration(arm: Arm) -> bool:
    return arm.role == ROLE


def delay_seconds(arm: Arm, run_dir: Path, case: str) -> float | None:
    """The delay a trial of ``arm`` sleeps (None: not the calibration arm)."""
    size = arm.params.get(PARAM) if is_calibration(arm) else None
    if size is None:
        return None
    if size.endswith("s"):
        return float(size[:-1])
    rows = RunFolder.open(run_dir).rows()
    baseline = (case, "baseline", "ok")
    figures = [float(r["value"]) for r in rows if (r.get("case"), r.get("role"), r.get("status")) == baseline]
    if not figures:
        raise RuntimeError(f"--calibrate {size}: no finished baseline trial yet to size the delay from")
    return float(np.median(figures)) * float(size[:-1]) / 100.0


def check_plan(plan: Any) -> None:
    """``InputError`` where the plan's calibration arm cannot be timed."""
    arms = [*plan.protocol.arms, *(a for c in plan.cases for a in c.arms)]
    if not any(is_calibration(a) for a in arms):
        return
    everywhere = all(any(is_calibration(a) for a in c.arms) for c in plan.cases)
    if plan.in_process or plan.unit != "s" or not everywhere:
        raise InputError(
            f"--calibrate sleeps inside a worker trial's timed seconds; {plan.tier} trials are not that: "
            "drop --calibrate"
        )


@dataclass(frozen=True)
class Recovered:
    """Recovered/known: the estimate, its interval, the level it attains, the pairs, and a verdict."""

    estimate: float
    low: float
    high: float
    attained: float
    pairs: int
    verdict: str


def recovered(
    baseline: ArrayLike, delayed: ArrayLike, known_seconds: ArrayLike, level: float = CONFIDENCE
) -> Recovered:
    """The recovered/known ratio of a known delay from paired trial times, with a verdict."""
    b, c = np.asarray(baseline, dtype=float).ravel(), np.asarray(delayed, dtype=float).ravel()
    if b.shape != c.shape:
        raise ValueError(f"need one time per pair from each arm (got {b.size} and {c.size})")
    known = np.broadcast_to(np.asarray(known_seconds, dtype=float), b.shape)
    if np.any(known <= 0) or np.any(np.isinf(known)):
        raise ValueError(f"a known delay is a positive number of seconds (got {known_seconds})")
    keep = np.isfinite(b) & np.isfinite(c) & np.isfinite(known)
    ratio = (c[keep] - b[keep]) / known[keep]
    if ratio.size == 0:
        return Recovered(math.nan, math.nan, math.nan, 0.0, 0, "insufficient")
    median, low, high, attained = intervals.median_log_bounds(ratio, level)
    if not intervals.keeps_level(attained, level):
        verdict = "insufficient"
    else:
        inside = 1.0 - MARGIN <= low and high <= 1.0 + MARGIN
        verdict = "recovered" if low <= 1.0 <= high or inside else "biased"
    return Recovered(float(median), float(low), float(high), attained, int(ratio.size), verdict)


@dataclass(frozen=True)
class Reading:
    """One case's calibration: the known delay (median of the measured sleeps) and what the design recovered."""

    case: str
    known_s: float
    result: Recovered

    @property
    def text(self) -> str:
        """One line: the answer first, in words."""
        r = self.result
        if not math.isfinite(r.estimate):
            return f"calibration: {r.verdict}: no pairs with a finished delay ({self.case})"
        return (
            f"calibration: {r.verdict}: {r.estimate:.2f} of a known {self.known_s:.3g} s delay recovered "
            f"[{r.low:.2f}, {r.high:.2f}] at {r.attained:.1%}, {r.pairs} pairs"
        )


def readings(trials: pd.DataFrame, level: float = CONFIDENCE) -> list[Reading]:
    """The calibration arm's reading per case, from the measured trials of a run's log."""
    if trials.empty or "role" not in trials or not (trials["role"] == ROLE).any():
        return []
    out = []
    for case, group in measured(trials).groupby("case", sort=False):
        base = group[group["role"] == "baseline"].set_index("round")
        delayed = group[group["role"] == ROLE].set_index("round")
        rounds = base.index.intersection(delayed.index)
        if delayed.empty:
            continue
        b, c = (frame.loc[rounds, "effective"].to_numpy(dtype=float) for frame in (base, delayed))
        known = pd.to_numeric(delayed.loc[rounds].get(FIGURE), errors="coerce").to_numpy(dtype=float)
        typical = float(np.nanmedian(known)) if np.isfinite(known).any() else math.nan
        out.append(Reading(str(case), typical, recovered(b, c, known, level)))
    return out
