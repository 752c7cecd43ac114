"""A run's plan, fixed before the first trial and saved as ``plan.json``; how the schedule grows and ends."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from harness.protocol_options import FIRST_FORMAT_OPTIONS, ProtocolOptions
from harness.schedule import Arm, Case, ScheduledTrial, build_schedule
from harness.tables import RunFolder

# 3: whole pairs, resume warm-ups, a growing schedule; 4: --warmup auto; 5: duet fillers (``harness.schedule``).
PLAN_FORMAT = 5
WHOLE_PAIRS_FORMAT = 3
DUET_FILLER_FORMAT = 5


@dataclass
class Plan:
    """Everything a run needs, fixed before the first trial and saved as ``plan.json``."""

    tier: str
    protocol: ProtocolOptions
    cases: list[Case]
    unit: str
    metric: str
    settings: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    in_process: bool = True
    isolation: str = "in-process, a fresh optimizer per trial"
    timed_region: str = ""
    created: str = ""
    schedule: list[ScheduledTrial] = field(default_factory=list)
    looks: list[dict[str, Any]] = field(default_factory=list)  # --pairs auto: each look's decision
    arm_code: dict[str, dict[str, Any]] = field(default_factory=dict)
    format: int = PLAN_FORMAT

    def __post_init__(self) -> None:
        if not self.created:
            self.created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        if not self.schedule:
            p = self.protocol
            self.schedule = build_schedule(self.cases, p.scheduled_warmup, p.initial_pairs, p.order, p.seed)

    def case(self, label: str) -> Case:
        return next(c for c in self.cases if c.label == label)

    def compared_by_ratio(self, case: str) -> bool:
        """Whether a case's arms are compared by ratio (its schedule runs a baseline)."""
        return any(t.case == case and t.role == "baseline" for t in self.schedule)

    def arm_labels(self) -> list[str]:
        """Arm labels in plan order (first appearance over the cases): the one order every table and plot uses."""
        return list(dict.fromkeys(arm.label for case in self.cases for arm in case.arms))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        data = dict(data)
        cases = [Case(c["label"], c["params"], tuple(Arm(**a) for a in c["arms"])) for c in data["cases"]]
        if data.get("format", 1) == 1:
            data = _upgrade_first_format(data, cases)
        return cls(
            tier=data["tier"],
            protocol=ProtocolOptions.from_json(data["protocol"]),
            cases=cases,
            unit=data["unit"],
            metric=data["metric"],
            settings=dict(data.get("settings") or {}),
            command=data.get("command", ""),
            in_process=bool(data.get("in_process", True)),
            isolation=data.get("isolation", ""),
            timed_region=data.get("timed_region", ""),
            created=data.get("created", ""),
            schedule=[ScheduledTrial(**t) for t in data["schedule"]],
            looks=list(data.get("looks") or []),
            format=int(data.get("format", 1)),
            arm_code={k: dict(v) for k, v in (data.get("arm_code") or {}).items()},
        )


def _upgrade_first_format(data: dict[str, Any], cases: list[Case]) -> dict[str, Any]:
    """A plan of the first format (shared options flat beside the tier's) in today's shape."""
    protocol = {k: data[k] for k in FIRST_FORMAT_OPTIONS[1:] if k in data}
    protocol["arms"] = [asdict(a) for a in (cases[0].arms if cases else ())]
    return {**data, "protocol": protocol, "settings": data.get("options") or {}}


def grow_schedule(plan: Plan, case_label: str, rounds: int, next_index: int) -> list[ScheduledTrial]:
    """Add measured rounds of one case up to ``rounds``, after its last slot; returns the trials added."""
    case = plan.case(case_label)
    mine = [t for t in plan.schedule if t.case == case_label and t.phase == "measured"]
    have = 1 + max((t.round for t in mine), default=-1)
    if rounds <= have:
        return []
    p = plan.protocol
    later = (t for t in build_schedule([case], 0, rounds, p.order, p.seed) if t.round >= have)
    added = [replace(t, index=next_index + n) for n, t in enumerate(later)]
    last = max(i for i, t in enumerate(plan.schedule) if t.case == case_label)
    plan.schedule[last + 1 : last + 1] = added
    return added


def drop_rounds(plan: Plan, case_label: str, done: set[int]) -> int:
    """Remove a case's rounds of which no trial ran; returns how many trials were removed."""
    started = {t.round for t in plan.schedule if t.case == case_label and t.index in done}
    keep = [
        t
        for t in plan.schedule
        if not (
            t.case == case_label and t.phase == "measured" and t.index not in done and t.round not in started
        )
    ]
    removed = len(plan.schedule) - len(keep)
    plan.schedule[:] = keep
    return removed


def pending(plan: Plan, folder: RunFolder) -> Iterator[ScheduledTrial]:
    """Scheduled trials with no row in the log yet, in schedule order (what a resume runs)."""
    done = folder.completed_indices()
    return (t for t in plan.schedule if t.index not in done)


def scheduled_done(plan: Plan, rows: list[dict[str, Any]]) -> int:
    """How many of the schedule's trials the log holds (extra warm-ups are not in the schedule)."""
    indices = {t.index for t in plan.schedule}
    return len({int(r["index"]) for r in rows} & indices)


def estimated_seconds(trial: ScheduledTrial, rows: list[dict[str, Any]]) -> float:
    """How long ``trial`` will take, by the log: the longest finished trial of its arm, else of any arm."""
    same_arm = [
        r["trial_seconds"] for r in rows if r.get("arm") == trial.arm and r.get("trial_seconds") is not None
    ]
    every = [r["trial_seconds"] for r in rows if r.get("trial_seconds") is not None]
    return float(max(same_arm or every or [0.0]))


def next_unit(plan: Plan, folder: RunFolder) -> list[ScheduledTrial]:
    """The next trials to run together: a warm-up alone, or a round's pending trials."""
    todo = list(pending(plan, folder))
    if not todo:
        return []
    first = todo[0]
    if first.phase != "measured":
        return [first]
    return [t for t in todo if t.phase == "measured" and t.case == first.case and t.round == first.round]
