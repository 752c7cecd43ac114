"""One trial: what its function is told, and the log row made of what it returned or raised."""

from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.folder_format import FIGURE_LIMIT
from harness.placement import Placement
from harness.plan import Plan
from harness.schedule import Arm, Case, ScheduledTrial


@dataclass(frozen=True)
class TrialContext:
    """What a trial function is told: the plan, its slot, its case and arm, a seed and the run folder."""

    plan: Plan
    trial: ScheduledTrial
    case: Case
    arm: Arm
    run_dir: Path
    placement: Placement | None = None  # where a worker runs (None: as the OS schedules)
    cancel: threading.Event | None = None  # set when a duet filler must stop (worker tiers end their process)

    @property
    def seed(self) -> int:
        """Derived from the run's seed; kept below 2**63 (every generator takes it), unchanged below 9·10^12."""
        offset = 0 if self.trial.phase == "measured" else 100_000
        return (self.plan.protocol.seed * 1_000_003 + offset + self.trial.round) % 2**63

    @property
    def device(self) -> str:
        return self.plan.protocol.device


TrialFunction = Callable[[TrialContext], dict[str, Any]]
"""Runs one trial and returns its figures: at least ``value`` (the primary figure, lower is better, in
``plan.unit``). Raising is allowed: an out-of-memory becomes a ``resource_failure`` row, anything else an
``error`` row."""


def row_head(plan: Plan, trial: ScheduledTrial) -> dict[str, Any]:
    """The columns every log row starts with: the trial's slot, arm and case, and the case's and arm's params."""
    case = plan.case(trial.case)
    arm = case.arm(trial.arm)
    return {
        **asdict(trial),
        "spec": arm.spec,
        **{f"case_{k}": v for k, v in case.params.items()},
        **{f"arm_{k}": v for k, v in arm.params.items()},
    }


class UnusableValue(ArithmeticError):
    """A trial whose primary figure is not a finite number: it failed, whatever else it returned."""


# The fields of a log row the protocol writes itself; a trial's figures may not set them.
PROTOCOL_FIELDS = ("started", "trial_seconds", "status", "message", "concurrent_with", "warmup_reason")


def check_value(value: Any, by_ratio: bool = False) -> None:
    """``UnusableValue`` unless ``value`` is a finite figure within ±``FIGURE_LIMIT`` (positive by ratio)."""
    shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:37]}..."
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UnusableValue(f"value is not a number: {shown}")
    if not isinstance(value, numbers.Integral) and not math.isfinite(value):  # an int is finite, however long
        raise UnusableValue(f"non-finite value: {float(value)!r}")
    if abs(value) > FIGURE_LIMIT:
        raise UnusableValue(f"value {shown} is beyond ±{FIGURE_LIMIT:g}: no measurement")
    if by_ratio and value <= 0:
        raise UnusableValue(f"non-positive value: {shown} (the arms are compared by ratio)")
    if by_ratio and value < 1 / FIGURE_LIMIT:
        raise UnusableValue(
            f"value {shown} is not a positive figure from {1 / FIGURE_LIMIT:g} on (the arms are compared by ratio)"
        )


def check_figure_names(figures: dict[str, Any], row: dict[str, Any]) -> None:
    """``UnusableValue`` where a trial's figures set a field the row or the protocol writes."""
    taken = sorted(set(figures) & {*row, *PROTOCOL_FIELDS})
    if taken:
        raise UnusableValue(f"the trial returned {', '.join(taken)}, which the protocol writes itself")
