"""The calibration arm (``--calibrate SIZE``): the baseline with a known host delay (docs/methods.md)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import InputError
from harness.injected import ROLE
from harness.schedule import Arm
from harness.tables import RunFolder

LABEL = "calibration"
PARAM = "delay"  # the arm's parameter: the size as given, normalised ("5%" or "2.5s")
OF = "of"  # the arm's parameter: the label of the arm it runs (the first)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(%|s)?\s*$")
MAX_SHARE = 50.0  # percent of a trial
MAX_SECONDS = 24 * 3600.0


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
