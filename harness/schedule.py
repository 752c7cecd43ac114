"""The counterbalanced schedule: arms, cases, and the order each round runs them in."""

from __future__ import annotations

import random
import string
from dataclasses import dataclass, field
from typing import Any

from harness.errors import InputError

ORDERS = ("alternate", "abba", "random", "duet")
CONCURRENT_ORDERS = ("duet",)  # the trials of a round run at once, each in its own worker on its own cores
# plan.json lists every scheduled trial (about 150 bytes each), built in memory before the first.
MAX_TRIALS = 1_000_000


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


def letters(n: int) -> str:
    return string.ascii_uppercase[:n]


def balanced_block(arms: int, order: str = "alternate") -> list[list[int]]:
    """One block of round orders (arm positions) balanced over the arms."""
    if arms < 1:
        raise ValueError("a round needs at least one arm")
    first, low, high = [0], 1, arms - 1
    while len(first) < arms:
        first.append(low)
        low += 1
        if len(first) < arms:
            first.append(high)
            high -= 1
    rows = [[(p + i) % arms for p in first] for i in range(arms)]
    if arms % 2 == 1 and arms > 1:
        rows += [row[::-1] for row in rows]
    if order == "abba":
        rows += [row[::-1] for row in rows]
    return rows


def build_schedule(
    cases: list[Case], warmup: int, pairs: int, order: str = "alternate", seed: int = 0
) -> list[ScheduledTrial]:
    """The whole schedule, case after case: ``warmup`` trials cycling the arms, then ``pairs`` rounds."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)} (got '{order}')")
    total = sum(warmup + pairs * len(case.arms) for case in cases)
    if total > MAX_TRIALS:
        raise InputError(
            f"{total} scheduled trials ({len(cases)} case(s), their arms, --warmup {warmup} and --pairs {pairs}) "
            f"are more than {MAX_TRIALS}, the most a run can take; use fewer pairs, arms or cases"
        )
    rng = random.Random(seed)
    schedule: list[ScheduledTrial] = []
    for case in cases:
        n, names, start = len(case.arms), letters(len(case.arms)), len(schedule)
        schedule += [
            ScheduledTrial(start + w, case.label, "warmup", w // n, w % n, names[w % n], arm.label, arm.role)
            for w, arm in ((w, case.arms[w % n]) for w in range(warmup))
        ]
        block = balanced_block(len(case.arms), "abba" if order == "abba" else "alternate")
        for r in range(pairs):
            positions = list(range(len(case.arms)))
            if order == "random":
                rng.shuffle(positions)
            else:
                positions = block[r % len(block)]
            arms, start = [case.arms[p] for p in positions], len(schedule)
            round_order = "".join(names[p] for p in positions)
            schedule += [
                ScheduledTrial(
                    start + slot, case.label, "measured", r, slot, round_order, arm.label, arm.role
                )
                for slot, arm in enumerate(arms)
            ]
    return schedule
