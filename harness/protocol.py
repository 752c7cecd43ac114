"""The paired protocol: arms, cases, the counterbalanced schedule, the plan of a run and the trial loop.

Words (GUIDE §3): an *arm* is one implementation (role ``baseline`` or ``candidate``); a *case* is one
setting under which the arms are compared (a scale, a guard, a variant); a *trial* is one measured unit of
work of one arm; *warm-ups* run first and are kept in the log but not in the statistics; a *round* runs every
arm of a case once (with two arms, a round is a *pair*), in an order that alternates forward and backward
(AB, BA, AB, …) or, with ``order='random'``, a seeded shuffle.

The protocol knows nothing about what a trial does: it calls a trial function with a ``TrialContext`` and
appends the row it returns (or the failure it raised) to the run's log the moment the trial ends.
"""

from __future__ import annotations

import datetime as _dt
import gc
import importlib
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness.tables import RunFolder
from harness.timing import TrialFailure

ORDERS = ("alternate", "random")


@dataclass(frozen=True)
class Arm:
    """One implementation under test. ``spec`` is what the arm resolver takes; ``params`` tune the arm."""

    label: str
    role: str
    spec: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    """One setting under which the arms are compared; the first arm is the reference (baseline)."""

    label: str
    params: dict[str, Any]
    arms: tuple[Arm, ...]

    def arm(self, label: str) -> Arm:
        return next(a for a in self.arms if a.label == label)


@dataclass(frozen=True)
class ScheduledTrial:
    """One slot of the schedule: which arm runs, in which phase, round and position."""

    index: int
    case: str
    phase: str
    round: int
    slot: int
    order: str
    arm: str
    role: str


def _letters(n: int) -> str:
    return "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:n]


def build_schedule(
    cases: list[Case], warmup: int, pairs: int, order: str = "alternate", seed: int = 0
) -> list[ScheduledTrial]:
    """The whole schedule, case after case: ``warmup`` trials cycling the arms, then ``pairs`` rounds.

    Rounds alternate forward and reverse arm order (AB, BA, …; with k arms A…K then K…A), so slow drift
    cannot favour one arm; ``order='random'`` shuffles each round with a seeded generator instead.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)} (got '{order}')")
    rng = random.Random(seed)
    schedule: list[ScheduledTrial] = []
    for case in cases:
        letters = _letters(len(case.arms))
        for w in range(warmup):
            k = w % len(case.arms)
            arm = case.arms[k]
            schedule.append(
                ScheduledTrial(
                    len(schedule),
                    case.label,
                    "warmup",
                    w // len(case.arms),
                    k,
                    letters[k],
                    arm.label,
                    arm.role,
                )
            )
        for r in range(pairs):
            positions = list(range(len(case.arms)))
            if order == "random":
                rng.shuffle(positions)
            elif r % 2 == 1:
                positions.reverse()
            round_order = "".join(letters[p] for p in positions)
            for slot, p in enumerate(positions):
                arm = case.arms[p]
                schedule.append(
                    ScheduledTrial(
                        len(schedule), case.label, "measured", r, slot, round_order, arm.label, arm.role
                    )
                )
    return schedule


@dataclass
class Plan:
    """Everything a run needs, fixed before the first trial and saved as ``plan.json``.

    ``factory`` names (``module:function``) the function that turns a plan into a trial function, so a
    run folder alone is enough to resume it. ``sections``, where set, names (``module:function``) the tier's
    report-section writer, called by the report with the run folder and its summaries, so a report too can
    be regenerated from the folder alone.
    """

    tier: str
    factory: str
    unit: str
    metric: str
    cases: list[Case]
    warmup: int
    pairs: int
    order: str = "alternate"
    seed: int = 0
    bar: float | None = None
    device: str = "cpu"
    budget: int | None = None
    control: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    in_process: bool = True
    isolation: str = "in-process, a fresh optimizer per trial"
    timed_region: str = ""
    sections: str = ""
    created: str = ""
    schedule: list[ScheduledTrial] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.created:
            self.created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        if not self.schedule:
            self.schedule = build_schedule(self.cases, self.warmup, self.pairs, self.order, self.seed)

    def case(self, label: str) -> Case:
        return next(c for c in self.cases if c.label == label)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        data = dict(data)
        data["cases"] = [
            Case(c["label"], c["params"], tuple(Arm(**a) for a in c["arms"])) for c in data["cases"]
        ]
        data["schedule"] = [ScheduledTrial(**t) for t in data["schedule"]]
        return cls(**data)


@dataclass(frozen=True)
class TrialContext:
    """What a trial function is told: the plan, its slot, its case and arm, a seed and the run folder.

    ``seed`` is shared by the arms of one round, so paired trials see the same synthetic data.
    """

    plan: Plan
    trial: ScheduledTrial
    case: Case
    arm: Arm
    run_dir: Path

    @property
    def seed(self) -> int:
        offset = 0 if self.trial.phase == "measured" else 100_000
        return self.plan.seed * 1_000_003 + offset + self.trial.round

    @property
    def device(self) -> str:
        return self.plan.device


TrialFunction = Callable[[TrialContext], dict[str, Any]]
"""Runs one trial and returns its figures: at least ``value`` (the primary figure, lower is better, in
``plan.unit``). Raising is allowed: an out-of-memory becomes a ``resource_failure`` row, anything else an
``error`` row."""


def load_factory(plan: Plan) -> TrialFunction:
    """Import ``plan.factory`` and build the trial function for this plan."""
    module_name, _, attr = plan.factory.partition(":")
    factory = getattr(importlib.import_module(module_name), attr)
    return factory(plan)


def _release_device_memory() -> None:
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def run_trial(plan: Plan, trial: ScheduledTrial, trial_fn: TrialFunction, run_dir: Path) -> dict[str, Any]:
    """Run one scheduled trial and return its log row, whatever happens inside it."""
    case = plan.case(trial.case)
    arm = case.arm(trial.arm)
    row: dict[str, Any] = {
        "index": trial.index,
        "case": trial.case,
        "phase": trial.phase,
        "round": trial.round,
        "slot": trial.slot,
        "order": trial.order,
        "arm": trial.arm,
        "role": trial.role,
        "spec": arm.spec,
        **{f"case_{k}": v for k, v in case.params.items()},
        **{f"arm_{k}": v for k, v in arm.params.items()},
        "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds"),
    }
    started = time.perf_counter()
    failure: TrialFailure | None = None
    figures: dict[str, Any] = {}
    try:
        figures = dict(trial_fn(TrialContext(plan, trial, case, arm, run_dir)))
        if "value" not in figures:
            raise ValueError("trial function returned no 'value'")
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - every failure is a recorded result
        failure = TrialFailure.from_exception(exc, plan.budget)
        del exc
    finally:
        _release_device_memory()
    row["trial_seconds"] = round(time.perf_counter() - started, 6)
    if failure is None:
        row.update(status="ok", message="", **figures)
    else:
        row.update(status=failure.status, message=failure.message, value=None)
        row.update({f"oom_{k}": v for k, v in failure.oom.items()})
    return row


def pending(plan: Plan, folder: RunFolder) -> Iterator[ScheduledTrial]:
    """Scheduled trials with no row in the log yet, in schedule order (what a resume runs)."""
    done = folder.completed_indices()
    return (t for t in plan.schedule if t.index not in done)


def run_schedule(
    plan: Plan,
    trial_fn: TrialFunction,
    folder: RunFolder,
    on_trial_start: Callable[[ScheduledTrial], None] | None = None,
    on_trial_end: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Run every pending trial, appending each row to the log (flushed) as soon as the trial ends."""
    for trial in pending(plan, folder):
        if on_trial_start:
            on_trial_start(trial)
        row = run_trial(plan, trial, trial_fn, folder.path)
        folder.append_row(row)
        if on_trial_end:
            on_trial_end(row)
