"""The counterbalanced schedule: arms, cases, the order each round runs them in, and duet rounds.

The rules of the default order and of duet rounds are stated once in ``docs/methods.md``.
"""

from __future__ import annotations

import random
import string
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.errors import InputError
from harness.safe_fs import remove_tree

ORDERS = ("alternate", "abba", "random", "duet")
CONCURRENT_ORDERS = ("duet",)  # the trials of a round run at once, each in its own worker on its own cores
# plan.json lists every scheduled trial (about 150 bytes each), built in memory before the first.
MAX_TRIALS = 1_000_000
CORES_PER_ARM = 4  # two arms: 8 worker cores
ESTIMANDS = {
    "duet": "the reduction with both arms running at once, each on its own share of the cores",
    "alternate": "the reduction with each arm alone on the machine, in alternating order",
    "abba": "the reduction with each arm alone on the machine, in ABBA order",
    "random": "the reduction with each arm alone on the machine, in seeded random order",
}
PARTNER_REASON = "duet partner"
FILLER_INDEX = 1_000_000_000  # a filler's index: its trial's plus this, apart from every logged index


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
    first = [0, *((j + 1) // 2 if j % 2 else arms - j // 2 for j in range(1, arms))]  # 0, 1, n-1, 2, n-2 …
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


@dataclass(frozen=True)
class Choice:
    """The order chosen, and one line saying why."""

    order: str
    text: str


def default_order(plan: Any, worker_cores: int | None) -> Choice:
    """The order for a run given no ``--order``: duet where worker cores allow, else the default."""
    at_once = max((len(case.arms) for case in plan.cases), default=2)
    needed = CORES_PER_ARM * at_once
    if plan.in_process:
        why = f"the {plan.tier} tier's trials run in this process"
    elif plan.protocol.gpus > 1:
        why = "each trial spans several devices"
    elif worker_cores is None:
        why = "no CPU placement to share"
    elif worker_cores < needed:
        why = (
            f"{worker_cores} worker core{'s' * (worker_cores != 1)}; a duet of {at_once} arms wants {needed}"
        )
    else:
        return Choice("duet", f"order: duet ({worker_cores} worker cores); estimates {ESTIMANDS['duet']}")
    return Choice("alternate", f"order: alternate ({why}); estimates {ESTIMANDS['alternate']}")


def estimand(order: str) -> str:
    """What a run in ``order`` estimates, in words (the report names it)."""
    return ESTIMANDS.get(order, ESTIMANDS["alternate"])


def duet_partners(plan: Any, unit: list[Any], rows: list[dict[str, Any]]) -> list[Any]:
    """Warm-ups of the arms of ``unit``'s round that the log already holds."""
    if not unit or unit[0].phase != "measured":
        return []
    first, pending = unit[0], {t.index for t in unit}
    same = (first.case, first.round, "measured")
    logged = [t for t in plan.schedule if (t.case, t.round, t.phase) == same and t.index not in pending]
    start = max({int(r["index"]) for r in rows} | {t.index for t in plan.schedule}, default=-1) + 1
    return [replace(t, index=start + n, phase="warmup") for n, t in enumerate(logged)]


def fill_until_partners_end(
    ctx_for: Any, trial: Any, trial_fn: Any, run_dir: Path, partners: Sequence[threading.Event]
) -> int:
    """Run discarded copies of ``trial`` until every event in ``partners`` is set; return how many started."""
    done = threading.Event()

    def watch() -> None:
        for ended in partners:
            ended.wait()
        done.set()

    threading.Thread(target=watch, daemon=True).start()
    filler = replace(trial, index=FILLER_INDEX + trial.index, phase="filler")
    started = 0
    try:
        while not done.is_set():
            started += 1
            try:
                trial_fn(ctx_for(filler, done))
            except Exception:  # noqa: BLE001 - stopped by its partner's end, or failed: discarded either way
                pass
    finally:  # the filler's log and trial folder, as the worker tiers name them
        trials = Path(run_dir) / "trials"
        for log in trials.glob(f"{filler.index}.*log"):
            log.unlink(missing_ok=True)
        remove_tree(trials / f"{filler.index:03d}")
    return started
