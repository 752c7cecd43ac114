"""The paired protocol: arms, cases, the counterbalanced schedule, the plan of a run and the trial loop.

Words: an *arm* is one implementation (role ``baseline`` or ``candidate``); a *case* is one
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
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from harness import telemetry
from harness.placement import Placement, split_placement
from harness.tables import RunFolder
from harness.timing import TrialFailure

ORDERS = ("alternate", "random", "duet")
CONCURRENT_ORDERS = ("duet",)  # the trials of a round run at once, each in its own worker on its own cores


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
    cannot favour one arm; ``order='random'`` shuffles each round with a seeded generator instead; ``duet``
    keeps the alternating order, which then assigns each arm to the other half of the cores each round.
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


@dataclass(frozen=True)
class ProtocolOptions:
    """What every tier's schedule is built from: checked once (``harness.options.protocol_options``) and passed
    whole. The defaults here are the only ones; the CLI reads them."""

    arms: tuple[Arm, ...]
    warmup: int = 2
    pairs: int = 6
    order: str = "alternate"
    seed: int = 0
    bar: float | None = None
    device: str = "cpu"
    budget: int | None = None
    control: bool = False
    cooldown: float = 0.0
    cpus: str = "auto"  # CPU placement: auto, a core list, or none (as the OS schedules); harness.placement
    gpus: int = 1  # ranks per trial: a data-parallel trial over this many devices (CPU ranks on the CPU)

    @property
    def rank_devices(self) -> tuple[str, ...]:
        """Each rank's device: consecutive CUDA devices from ``device``'s index, or the CPU for every rank."""
        if not self.device.startswith("cuda"):
            return (self.device,) * self.gpus
        first = int(self.device.split(":")[1]) if ":" in self.device else 0
        if self.gpus == 1:
            return (self.device,)
        return tuple(f"cuda:{first + rank}" for rank in range(self.gpus))

    @property
    def backend(self) -> str:
        """The process group's backend for these devices: ``nccl`` on CUDA, ``gloo`` on the CPU."""
        return "nccl" if self.device.startswith("cuda") else "gloo"

    @classmethod
    def default(cls, name: str) -> Any:
        """The default of one option."""
        return next(f.default for f in fields(cls) if f.name == name)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProtocolOptions:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["arms"] = tuple(Arm(**a) for a in data["arms"])
        return cls(**values)


PLAN_FORMAT = 2


@dataclass
class Plan:
    """Everything a run needs, fixed before the first trial and saved as ``plan.json``.

    ``tier`` names the tier by its registered name (never importable code); ``protocol`` holds the shared
    options whole; ``settings`` is the tier's own, as the tier resolved them.
    """

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
    format: int = PLAN_FORMAT

    def __post_init__(self) -> None:
        if not self.created:
            self.created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        if not self.schedule:
            p = self.protocol
            self.schedule = build_schedule(self.cases, p.warmup, p.pairs, p.order, p.seed)

    def case(self, label: str) -> Case:
        return next(c for c in self.cases if c.label == label)

    def arm_labels(self) -> list[str]:
        """Arm labels in plan order (first appearance over the cases): the one order every table and plot uses."""
        labels: list[str] = []
        for case in self.cases:
            labels += [arm.label for arm in case.arms if arm.label not in labels]
        return labels

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
        )


def _upgrade_first_format(data: dict[str, Any], cases: list[Case]) -> dict[str, Any]:
    """A plan of the first format (shared options flat beside the tier's, and importable code named in
    ``factory`` / ``sections``, which is never imported) in today's shape."""
    protocol = {
        k: data[k]
        for k in ("warmup", "pairs", "order", "seed", "bar", "device", "budget", "control")
        if k in data
    }
    protocol["arms"] = [asdict(a) for a in (cases[0].arms if cases else ())]
    return {**data, "protocol": protocol, "settings": data.get("options") or {}}


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
    placement: Placement | None = None  # where a worker runs (None: as the OS schedules)

    @property
    def seed(self) -> int:
        offset = 0 if self.trial.phase == "measured" else 100_000
        return self.plan.protocol.seed * 1_000_003 + offset + self.trial.round

    @property
    def device(self) -> str:
        return self.plan.protocol.device


TrialFunction = Callable[[TrialContext], dict[str, Any]]
"""Runs one trial and returns its figures: at least ``value`` (the primary figure, lower is better, in
``plan.unit``). Raising is allowed: an out-of-memory becomes a ``resource_failure`` row, anything else an
``error`` row."""


def _release_device_memory() -> None:
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def row_head(plan: Plan, trial: ScheduledTrial) -> dict[str, Any]:
    """The columns every log row starts with: the trial's slot, arm and case, and the case's and arm's params."""
    case = plan.case(trial.case)
    arm = case.arm(trial.arm)
    return {
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
    }


def run_trial(
    plan: Plan,
    trial: ScheduledTrial,
    trial_fn: TrialFunction,
    run_dir: Path,
    placement: Placement | None = None,
) -> dict[str, Any]:
    """Run one scheduled trial and return its log row, whatever happens inside it.

    Telemetry (machine CPU shares, load, clocks, GPU clocks and throttle reasons, the trial process's CPU time
    and switches) is read just before and just after the trial, outside whatever the trial times.
    """
    case = plan.case(trial.case)
    arm = case.arm(trial.arm)
    row = row_head(plan, trial)
    row["started"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")
    process = "self" if plan.in_process else None  # a worker's usage comes back with its result
    cores = placement.worker_cores if placement is not None else None
    before = telemetry.snapshot(process, cores)
    started = time.perf_counter()
    failure: TrialFailure | None = None
    figures: dict[str, Any] = {}
    try:
        figures = dict(trial_fn(TrialContext(plan, trial, case, arm, run_dir, placement)))
        if "value" not in figures:
            raise ValueError("trial function returned no 'value'")
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - every failure is a recorded result
        failure = TrialFailure.from_exception(exc, plan.protocol.budget)
        del exc
    finally:
        _release_device_memory()
    row["trial_seconds"] = round(time.perf_counter() - started, 6)
    usage = figures.pop(telemetry.USAGE_KEY, None)
    row.update(
        telemetry.trial_fields(before, telemetry.snapshot(process, cores), telemetry.usage_from(usage))
    )
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


class PlannedStop(KeyboardInterrupt):
    """A clean stop between trials (``--stop-after``): it passes through like Ctrl-C, the log keeps every
    finished trial, and a resume continues with the next one."""


def estimated_seconds(trial: ScheduledTrial, rows: list[dict[str, Any]]) -> float:
    """How long ``trial`` will take, by the log: the longest finished trial of its arm, else of any arm."""
    same_arm = [
        r["trial_seconds"] for r in rows if r.get("arm") == trial.arm and r.get("trial_seconds") is not None
    ]
    every = [r["trial_seconds"] for r in rows if r.get("trial_seconds") is not None]
    return float(max(same_arm or every or [0.0]))


def run_schedule(
    plan: Plan,
    trial_fn: TrialFunction,
    folder: RunFolder,
    on_trial_start: Callable[[ScheduledTrial], None] | None = None,
    on_trial_end: Callable[[dict[str, Any]], None] | None = None,
    deadline: float | None = None,
    placement: Placement | None = None,
) -> None:
    """Run every pending trial, appending each row to the log (fsynced) as soon as the trial ends.

    Before each trial the protocol pauses ``plan.protocol.cooldown`` seconds (GPU clocks settle between
    trials); with a ``deadline`` (``time.monotonic()`` seconds) it raises ``PlannedStop`` instead of starting
    a trial that the log says would not end in time. With a concurrent order (``duet``) the measured trials of
    a round start together, each on its own share of the worker cores (``duet_placements``).
    """
    cooldown = plan.protocol.cooldown
    queue = list(pending(plan, folder))
    while queue:
        batch = _next_batch(plan, queue)
        if deadline is not None:
            needed = cooldown + max(estimated_seconds(t, folder.rows()) for t in batch)
            if time.monotonic() + needed > deadline:
                first = batch[0]
                raise PlannedStop(
                    f"stopping before trial {first.index + 1} of {len(plan.schedule)} ({first.arm}, about "
                    f"{needed:.0f} s by the log; {max(deadline - time.monotonic(), 0):.0f} s left of --stop-after)"
                )
        if cooldown:
            time.sleep(cooldown)
        if len(batch) == 1:
            trial = batch[0]
            if on_trial_start:
                on_trial_start(trial)
            row = run_trial(plan, trial, trial_fn, folder.path, placement)
            folder.append_row(row)
            if on_trial_end:
                on_trial_end(row)
        else:
            _run_together(plan, batch, trial_fn, folder, on_trial_start, on_trial_end, placement)
        queue = queue[len(batch) :]


def _next_batch(plan: Plan, queue: list[ScheduledTrial]) -> list[ScheduledTrial]:
    """The next trial, or under a concurrent order every pending measured trial of its round."""
    first = queue[0]
    if plan.protocol.order not in CONCURRENT_ORDERS or first.phase != "measured":
        return [first]
    batch = [first]
    for trial in queue[1:]:
        if (trial.case, trial.phase, trial.round) != (first.case, first.phase, first.round):
            break
        batch.append(trial)
    return batch


def duet_placements(placement: Placement | None, trials: list[ScheduledTrial]) -> list[Placement | None]:
    """One share of the worker cores per slot of a duet round: slot k runs on the k-th share, and since the
    arms' order alternates from round to round (AB, BA, …), each arm takes each share in turn."""
    if placement is None:
        return [None] * len(trials)
    shares = split_placement(placement, len(trials))
    return [shares[t.slot] for t in trials]


def _run_together(
    plan: Plan,
    batch: list[ScheduledTrial],
    trial_fn: TrialFunction,
    folder: RunFolder,
    on_trial_start: Callable[[ScheduledTrial], None] | None,
    on_trial_end: Callable[[dict[str, Any]], None] | None,
    placement: Placement | None,
) -> None:
    """The trials of one duet round at once, each row appended as its trial ends (worker tiers only)."""
    if plan.in_process:
        raise ValueError("a concurrent order needs a tier whose trials run in worker processes")
    lock = threading.Lock()
    rows: list[dict[str, Any]] = []

    def one(trial: ScheduledTrial, where: Placement | None) -> None:
        row = run_trial(plan, trial, trial_fn, folder.path, where)
        row["concurrent_with"] = [t.index for t in batch if t.index != trial.index]
        with lock:
            folder.append_row(row)
            rows.append(row)

    for trial in batch:
        if on_trial_start:
            on_trial_start(trial)
    threads = [
        threading.Thread(target=one, args=(trial, where), daemon=True)
        for trial, where in zip(batch, duet_placements(placement, batch), strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for row in sorted(rows, key=lambda r: r["index"]):
        if on_trial_end:
            on_trial_end(row)
