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
import math
import numbers
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from harness import telemetry
from harness.duet import PARTNER_REASON, duet_partners, fill_until_partners_end
from harness.errors import InputError, is_disk_full
from harness.placement import Placement, split_placement
from harness.tables import RunFolder, RunFolderWriteError, encode_row
from harness.timing import TrialFailure

ORDERS = ("alternate", "abba", "random", "duet")
CONCURRENT_ORDERS = ("duet",)  # the trials of a round run at once, each in its own worker on its own cores
# plan.json lists every scheduled trial (about 150 bytes each: 150 MB at a million), built in memory before
# the first trial; no benchmark here needs more.
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


def _letters(n: int) -> str:
    return "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:n]


def balanced_block(arms: int, order: str = "alternate") -> list[list[int]]:
    """One block of round orders (arm positions) balanced over the arms.

    ``alternate``: a Williams square — row i is (0, 1, k−1, 2, k−2, …) + i mod k — so every arm runs in
    every slot once per block; for an odd k the rows are followed by their mirror images, so each arm also
    follows every other equally often. Two arms give AB, BA. ``abba`` follows that block by its mirror image
    (two arms: AB, BA, BA, AB, i.e. trials ABBA BAAB): over each block an order effect is then orthogonal
    to a linear drift.
    """
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


def _round_trials(case: Case, rnd: int, positions: list[int], start: int) -> list[ScheduledTrial]:
    letters = _letters(len(case.arms))
    round_order = "".join(letters[p] for p in positions)
    return [
        ScheduledTrial(
            start + slot,
            case.label,
            "measured",
            rnd,
            slot,
            round_order,
            case.arms[p].label,
            case.arms[p].role,
        )
        for slot, p in enumerate(positions)
    ]


def build_schedule(
    cases: list[Case], warmup: int, pairs: int, order: str = "alternate", seed: int = 0
) -> list[ScheduledTrial]:
    """The whole schedule, case after case: ``warmup`` trials cycling the arms, then ``pairs`` rounds.

    Rounds follow ``balanced_block`` (``alternate``: AB, BA, …; with k arms a Williams square per block of
    k rounds, 2k for an odd k; ``abba``: each block then its mirror), so slow drift cannot favour one arm
    and every arm runs in every slot equally often per block; ``order='random'`` shuffles each round with a
    seeded generator instead; ``duet`` keeps the alternating order, which then assigns each arm to the other
    half of the cores each round.
    """
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
        block = balanced_block(len(case.arms), "abba" if order == "abba" else "alternate")
        for r in range(pairs):
            positions = list(range(len(case.arms)))
            if order == "random":
                rng.shuffle(positions)
            else:
                positions = block[r % len(block)]
            schedule += _round_trials(case, r, positions, len(schedule))
    return schedule


def grow_schedule(plan: Plan, case_label: str, rounds: int, next_index: int) -> list[ScheduledTrial]:
    """Add measured rounds of one case up to ``rounds`` (the stopping rule's next look), placed after the
    case's last scheduled slot; the new trials take indices from ``next_index`` on (above every index the
    schedule and the log hold, so an extra warm-up's index is never reused). Returns the trials added."""
    case = plan.case(case_label)
    mine = [t for t in plan.schedule if t.case == case_label and t.phase == "measured"]
    have = 1 + max((t.round for t in mine), default=-1)
    if rounds <= have:
        return []
    p = plan.protocol
    template = build_schedule([case], 0, rounds, p.order, p.seed)
    added: list[ScheduledTrial] = []
    for t in template:
        if t.round >= have:
            added.append(replace(t, index=next_index + len(added)))
    last = max(i for i, t in enumerate(plan.schedule) if t.case == case_label)
    plan.schedule[last + 1 : last + 1] = added
    return added


def drop_rounds(plan: Plan, case_label: str, done: set[int]) -> int:
    """Remove a case's measured trials the log does not hold from rounds none of whose trials ran (the
    stopping rule ended the case there); returns how many were removed."""
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


@dataclass(frozen=True)
class ProtocolOptions:
    """What every tier's schedule is built from: checked once (``harness.options.protocol_options``) and passed
    whole. The defaults here are the only ones; the CLI reads them."""

    arms: tuple[Arm, ...]
    warmup: int | str = 2  # a whole number, or "auto": warm-ups until settled (warmup_tolerance, max_warmup)
    pairs: int | str = 6  # a whole number, or "auto": run until the precision, the budget or max_pairs
    order: str = "alternate"
    seed: int = 0
    bar: float | None = None
    device: str = "cpu"
    budget: int | None = None
    control: bool = False
    cooldown: float = 0.0
    cpus: str = "auto"  # CPU placement: auto, a core list, or none (as the OS schedules); harness.placement
    tolerance: float | None = None  # the A/A control's ±tolerance (percent) beside other arms
    precision: float | None = None  # --pairs auto: the target half-width of the interval, in points
    max_pairs: int = 20  # --pairs auto: the last look
    time_budget: float | None = None  # --pairs auto: seconds of trials the log may hold
    first_look: int = 6  # --pairs auto: the first look (then one every 2 pairs)
    # --warmup auto: a warm-up settles its sequence when it is at most this much faster (percent) than its
    # arm's previous one: a transient makes fits faster as it fades. tests/test_warmup.py simulates the rates.
    warmup_tolerance: float = 0.5
    # --warmup auto: the most warm-ups of one sequence; two arms then get four checks (the figures above).
    max_warmup: int = 6

    @property
    def auto_warmup(self) -> bool:
        """Warm-ups run until two consecutive ones of an arm agree (``--warmup auto``), not a fixed count."""
        return self.warmup == "auto"

    @property
    def scheduled_warmup(self) -> int:
        """The warm-ups the schedule holds per case: the fixed count, or none with ``--warmup auto`` (its
        warm-ups are decided as they run, outside the schedule)."""
        return 0 if self.auto_warmup else int(self.warmup)

    @property
    def auto(self) -> bool:
        """Pairs chosen by the stopping rule (``--pairs auto``)."""
        return self.pairs == "auto"

    @property
    def initial_pairs(self) -> int:
        """The rounds the first schedule holds: all of them, or with ``--pairs auto`` those of the first look."""
        return self.first_look if self.auto else int(self.pairs)

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


# 3: pairs are kept whole by --stop-after and resumes, with a warm-up after a resume or an idle gap, and the
# schedule may grow (--pairs auto); a plan of format 2 or less ran without those. 4: --warmup auto may run
# warm-up sequences outside the schedule (a plan of format 3 has fixed warm-ups only, and reads the same).
# 5: in a duet round the arm that ends first runs fillers until its partner ends (``harness.duet``); before,
# the partner finished alone.
PLAN_FORMAT = 5
WHOLE_PAIRS_FORMAT = 3
DUET_FILLER_FORMAT = 5


@dataclass
class Plan:
    """Everything a run needs, fixed before the first trial and saved as ``plan.json``.

    ``tier`` names the tier by its registered name (never importable code); ``protocol`` holds the shared
    options whole; ``settings`` is the tier's own, as the tier resolved them. ``arm_code`` is what each arm
    label runs on the plan's device, as the tier found it (``spec``, ``runs`` in words, and
    ``same_path_as_baseline``: why it runs the baseline's code, or None); empty where no tier said.
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
        """Whether the statistics compare a case's arms by the ratio of their figures (its schedule runs its
        baseline-role arm, the reference of every pair), so each figure must be positive; a parity case runs
        no reference trial and its figures are differences, 0 included."""
        return any(t.case == case and t.role == "baseline" for t in self.schedule)

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
            looks=list(data.get("looks") or []),
            format=int(data.get("format", 1)),
            arm_code={k: dict(v) for k, v in (data.get("arm_code") or {}).items()},
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


class UnusableValue(ArithmeticError):
    """A trial whose primary figure is not a finite number: it failed, whatever else it returned."""


# A figure beyond these is no measurement (the ratio of two stays far inside floating point's range); the log's
# reader refuses what a trial could not have logged.
FIGURE_LIMIT = 1e30
# The fields of a log row the protocol writes itself; a trial's figures may not set them.
PROTOCOL_FIELDS = ("started", "trial_seconds", "status", "message", "concurrent_with", "warmup_reason")


def check_value(value: Any, by_ratio: bool = False) -> None:
    """A trial's ``value`` must be a finite real number within ±``FIGURE_LIMIT`` (a NaN or infinity is a failed
    trial, not a figure), and from 1/``FIGURE_LIMIT`` on where the arms are compared by ratio (a time of 0
    would be an infinitely faster arm)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UnusableValue(f"value is not a number: {value!r}")
    if not math.isfinite(value):
        raise UnusableValue(f"non-finite value: {float(value)!r}")
    if abs(value) > FIGURE_LIMIT:
        raise UnusableValue(f"value {value!r} is beyond ±{FIGURE_LIMIT:g}: no measurement")
    if by_ratio and value <= 0:
        raise UnusableValue(f"non-positive value: {value!r} (the arms are compared by ratio)")
    if by_ratio and value < 1 / FIGURE_LIMIT:
        raise UnusableValue(
            f"value {value!r} is not a positive figure from {1 / FIGURE_LIMIT:g} on (the arms are compared by "
            "ratio)"
        )


def check_figure_names(figures: dict[str, Any], row: dict[str, Any]) -> None:
    """A trial's figures may not set what the row says of the trial (its index, case, arm, …) nor what the
    protocol writes (its status, its time): a trial returning ``index`` made the log say another trial ran."""
    taken = sorted(set(figures) & {*row, *PROTOCOL_FIELDS})
    if taken:
        raise UnusableValue(f"the trial returned {', '.join(taken)}, which the protocol writes itself")


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
        check_figure_names(figures, row)
        check_value(figures["value"], plan.compared_by_ratio(case.label))
        try:
            encode_row(figures)
        except (
            TypeError,
            ValueError,
        ) as exc:  # the row could not be logged: the trial's failure, not the run's
            raise UnusableValue(f"the trial returned a figure the log cannot hold ({exc})") from None
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM: the run stops; an arm's sys.exit is its trial's error below
        raise
    except UnusableValue as exc:
        failure = TrialFailure("error", str(exc), {})
    except BaseException as exc:  # noqa: BLE001 - every failure is a recorded result
        if is_disk_full(exc):  # not the arm's failure: the run stops and a resume runs this trial again
            where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
            raise RunFolderWriteError(
                f"trial {trial.index + 1} could not write: {getattr(exc, 'strerror', None) or exc}{where}"
            ) from None
        failure = TrialFailure.from_exception(exc, plan.protocol.budget)
        del exc
    finally:
        _release_device_memory()
    row["trial_seconds"] = round(time.perf_counter() - started, 6)
    usage = figures.pop(telemetry.USAGE_KEY, None)
    row.update(
        telemetry.trial_fields(before, telemetry.snapshot(process, cores), telemetry.usage_from(usage))
    )
    if failure is None and set(figures) & set(row):  # a figure never shadows what the harness measured
        taken = ", ".join(sorted(set(figures) & set(row)))
        failure = TrialFailure("error", f"the trial returned {taken}, which the harness measures itself", {})
    if failure is None:
        row.update(status="ok", message="", **figures)
    else:
        row.update(status=failure.status, message=failure.message, value=None)
        row.update({f"oom_{k}": v for k, v in failure.oom.items()})
    return row


def pending(plan: Plan, folder: RunFolder) -> Iterator[ScheduledTrial]:
    """Scheduled trials with no row in the log yet, in schedule order (what a resume runs). Extra warm-ups
    carry indices outside the schedule, so they never count here."""
    done = folder.completed_indices()
    return (t for t in plan.schedule if t.index not in done)


def scheduled_done(plan: Plan, rows: list[dict[str, Any]]) -> int:
    """How many of the schedule's trials the log holds (extra warm-ups are not in the schedule)."""
    indices = {t.index for t in plan.schedule}
    return len({int(r["index"]) for r in rows} & indices)


class PlannedStop(KeyboardInterrupt):
    """A clean stop between trials (``--stop-after``): it passes through like Ctrl-C, the log keeps every
    finished trial, and a resume continues with the next one."""


# An idle gap after which the next measured trial is preceded by one untimed warm-up. Measured on the
# committed H200 logs (each trial's start stamp and duration against the next one's start): between the
# trials of one command the gap was at most 0.01 s (every fit, probe and screen run), while the slices of a
# run cut by --stop-after and resumed left gaps of 18.7-25.5 s, and the fit after such a gap was the A/A's
# worst pair (65.3 s against 54.5 s). 10 s lies a thousand times above the first and below half the
# shortest of the second; the deliberate --cooldown pause is not counted. A resume always gets the warm-up,
# whatever its gap.
IDLE_GAP_SECONDS = 10.0


def estimated_seconds(trial: ScheduledTrial, rows: list[dict[str, Any]]) -> float:
    """How long ``trial`` will take, by the log: the longest finished trial of its arm, else of any arm."""
    same_arm = [
        r["trial_seconds"] for r in rows if r.get("arm") == trial.arm and r.get("trial_seconds") is not None
    ]
    every = [r["trial_seconds"] for r in rows if r.get("trial_seconds") is not None]
    return float(max(same_arm or every or [0.0]))


def next_unit(plan: Plan, folder: RunFolder) -> list[ScheduledTrial]:
    """The next trials that must run together: a scheduled warm-up alone, or the pending trials of the
    first measured round with a pending trial (all its arms: a pair is never split). Empty when done."""
    todo = list(pending(plan, folder))
    if not todo:
        return []
    first = todo[0]
    if first.phase != "measured":
        return [first]
    return [t for t in todo if t.phase == "measured" and t.case == first.case and t.round == first.round]


def _log_end(rows: list[dict[str, Any]]) -> float | None:
    """Wall-clock seconds (epoch) when the log's last trial ended, from its start stamp and duration."""
    ends = []
    for r in rows:
        try:
            start = _dt.datetime.fromisoformat(str(r["started"])).timestamp()
            ends.append(start + float(r["trial_seconds"]))
        except (KeyError, TypeError, ValueError):
            continue
    return max(ends) if ends else None


def warmup_agreement(previous: float | None, current: float | None) -> float | None:
    """How two warm-ups of one arm compare: ln(current / previous), negative when the later was faster; None
    where either failed."""
    if previous is None or current is None or not (previous > 0 and current > 0):
        return None
    if not (math.isfinite(previous) and math.isfinite(current)):
        return None
    return math.log(current / previous)


def settles(change: float | None, tolerance: float) -> bool:
    """The settling rule: a warm-up no more than ``tolerance`` percent faster than its arm's previous one."""
    return change is not None and change >= -tolerance / 100


def agreements(values: list[float | None], arms: list[str]) -> list[float | None]:
    """Each warm-up's agreement with the previous warm-up of its arm in the same sequence (None for an arm's
    first, or where either failed)."""
    last: dict[str, float | None] = {}
    out: list[float | None] = []
    for value, arm in zip(values, arms, strict=True):
        out.append(warmup_agreement(last[arm], value) if arm in last else None)
        last[arm] = value
    return out


def settled_at(values: list[float | None], arms: list[str], tolerance: float) -> int | None:
    """The warm-up (counted from 1) at which a sequence settled (``settles`` against the previous warm-up of
    its arm); None if none did."""
    for count, agreement in enumerate(agreements(values, arms), start=1):
        if settles(agreement, tolerance):
            return count
    return None


@dataclass(frozen=True)
class WarmupSequence:
    """One ``--warmup auto`` sequence as its rows tell it: why it ran (``start``, ``resume``, an idle gap),
    how many warm-ups it took, whether two of one arm agreed (``settled``) or it reached the cap."""

    number: int
    case: str
    reason: str
    rows: tuple[dict[str, Any], ...]
    tolerance: float
    cap: int

    @property
    def warmups(self) -> int:
        return len(self.rows)

    @property
    def settled(self) -> bool:
        values = [r.get("value") if r.get("status") == "ok" else None for r in self.rows]
        return settled_at(values, [str(r["arm"]) for r in self.rows], self.tolerance) is not None

    @property
    def capped(self) -> bool:
        """It reached the cap without settling (the run went on unsettled)."""
        return not self.settled and self.warmups >= self.cap

    @property
    def done(self) -> bool:
        return self.settled or self.warmups >= self.cap


def warmup_sequences(rows: list[dict[str, Any]], protocol: ProtocolOptions) -> list[WarmupSequence]:
    """The run's ``--warmup auto`` sequences from its log (rows with a ``warmup_sequence``), in order."""
    grouped: dict[int, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: int(r["index"])):
        number = row.get("warmup_sequence")  # a float where a table of every row held it (NaN elsewhere)
        if row.get("phase") == "warmup" and isinstance(number, numbers.Real) and math.isfinite(number):
            grouped.setdefault(int(number), []).append(row)
    return [
        WarmupSequence(
            number,
            str(mine[0]["case"]),
            str(mine[0].get("warmup_reason", "")),
            tuple(mine),
            float(protocol.warmup_tolerance),
            int(protocol.max_warmup),
        )
        for number, mine in sorted(grouped.items())
    ]


def next_auto_warmup(
    plan: Plan, rows: list[dict[str, Any]], unit: list[ScheduledTrial], reason: str
) -> tuple[ScheduledTrial, dict[str, Any]] | None:
    """The next ``--warmup auto`` warm-up before measured ``unit``, and the fields its row carries; None when
    the unit may run. An unfinished sequence (a run stopped inside it) is continued; else a case's first
    measured unit gets a ``start`` sequence (cycling the arms from the first), and ``reason`` (a resume, an
    idle gap) a new one cycling from the unit's first arm."""
    sequences = warmup_sequences(rows, plan.protocol)
    open_ = [s for s in sequences if not s.done]
    case = plan.case(unit[0].case)
    labels = [a.label for a in case.arms]
    if open_:
        sequence = open_[-1]
        number, why, done_rows = sequence.number, sequence.reason, list(sequence.rows)
        case = plan.case(sequence.case)
        labels = [a.label for a in case.arms]
        first = labels.index(str(done_rows[0]["arm"]))
    else:
        started = any(s.case == case.label and s.reason == "start" for s in sequences)
        why = reason if started else "start"
        if not why:
            return None
        number = 1 + max((s.number for s in sequences), default=-1)
        done_rows = []
        first = 0 if why == "start" else labels.index(unit[0].arm)
    step = len(done_rows)
    position = (first + step) % len(labels)
    arm = case.arms[position]
    used = {int(r["index"]) for r in rows} | {t.index for t in plan.schedule}
    trial = ScheduledTrial(
        max(used) + 1,
        case.label,
        "warmup",
        step // len(labels),
        position,
        _letters(len(labels))[position],
        arm.label,
        arm.role,
    )
    fields = {"warmup_reason": why, "warmup_sequence": number, "warmup_step": step + 1}
    return trial, fields


def warmup_row_fields(
    plan: Plan, rows: list[dict[str, Any]], row: dict[str, Any], number: int
) -> dict[str, Any]:
    """A finished ``--warmup auto`` row's agreement with its arm's previous warm-up in its sequence and whether
    it settled the sequence."""
    previous = [
        r
        for r in rows
        if r.get("phase") == "warmup" and r.get("warmup_sequence") == number and r.get("arm") == row["arm"]
    ]
    value = row.get("value") if row.get("status") == "ok" else None
    agreement = None
    if previous:
        last = max(previous, key=lambda r: int(r["index"]))
        agreement = warmup_agreement(last.get("value") if last.get("status") == "ok" else None, value)
    settled = settles(agreement, plan.protocol.warmup_tolerance)
    return {"warmup_agreement": agreement, "warmup_settled": settled}


def extra_warmup(plan: Plan, trial: ScheduledTrial, index: int) -> ScheduledTrial:
    """An untimed warm-up of ``trial``'s arm, outside the saved schedule (``index`` above every index)."""
    return replace(trial, index=index, phase="warmup")


def run_schedule(
    plan: Plan,
    trial_fn: TrialFunction,
    folder: RunFolder,
    on_trial_start: Callable[[ScheduledTrial], None] | None = None,
    on_trial_end: Callable[[dict[str, Any]], None] | None = None,
    deadline: float | None = None,
    placement: Placement | None = None,
    before_unit: Callable[[list[ScheduledTrial]], bool] | None = None,
    warm_after_gaps: bool = True,
) -> None:
    """Run every pending trial, appending each row to the log (fsynced) as soon as the trial ends.

    Trials run in units: a scheduled warm-up alone, or a measured round (a pair) whole. Before each trial the
    protocol pauses ``plan.protocol.cooldown`` seconds (GPU clocks settle between trials). With a
    ``deadline`` (``time.monotonic()`` seconds) it raises ``PlannedStop`` before a unit the log says would
    not end in time, never inside one; a round the log already holds part of (a crash) is finished whatever
    the deadline. Before the first measured trial after a resume, and after an idle gap of more than
    ``IDLE_GAP_SECONDS`` (the cool-down not counted), one untimed warm-up of the next arm runs, logged with
    ``phase=warmup``, ``warmup_reason`` and an index outside the schedule (unless ``warm_after_gaps`` is
    off: a tier whose trials are not timings). ``before_unit`` is asked before each unit (the runner's
    stopping rule grows or ends the schedule there; it returns True when it changed the schedule, and the
    next unit is found again). With a concurrent order (``duet``) the measured trials of a round start
    together, each on its own share of the worker cores (``duet_placements``).
    """
    cooldown = plan.protocol.cooldown
    together = plan.protocol.order in CONCURRENT_ORDERS
    rows = folder.rows()
    resumed = bool(rows)
    wall_end = _log_end(rows)
    last_end: float | None = None if wall_end is None else time.monotonic() - max(time.time() - wall_end, 0.0)
    while True:
        unit = next_unit(plan, folder)
        if before_unit is not None and before_unit(unit):
            continue
        if not unit:
            return
        rows = folder.rows()
        started_round = unit[0].phase == "measured" and any(
            r.get("case") == unit[0].case and r.get("round") == unit[0].round and r.get("phase") == "measured"
            for r in rows
        )
        partners = duet_partners(plan, unit, rows) if together and started_round else []
        concurrent = together and unit[0].phase == "measured" and len(unit) + len(partners) > 1
        reason = ""
        if unit[0].phase == "measured" and warm_after_gaps:
            gap = None if last_end is None else time.monotonic() - last_end
            if resumed:
                reason = "resume"
            elif gap is not None and gap > IDLE_GAP_SECONDS:
                reason = f"idle gap of {gap:.0f} s"
        estimates = [estimated_seconds(t, rows) for t in unit]
        needed = cooldown + max(estimates) if concurrent else sum(cooldown + e for e in estimates)
        if plan.protocol.auto_warmup and unit[0].phase == "measured":
            warm = next_auto_warmup(plan, rows, unit, reason)
            if warm is not None:
                trial, fields = warm
                # Before a sequence's first warm-ups, time for the fewest that can settle it (each arm once,
                # then the first again); before a later one, for itself: either way with the unit after it.
                arms = len(plan.case(trial.case).arms)
                fewest = max(1, arms + 1 - (fields["warmup_step"] - 1))
                needed += fewest * (cooldown + estimated_seconds(trial, rows))
                if (
                    deadline is not None
                    and not started_round
                    and needed > 0
                    and time.monotonic() + needed > deadline
                ):
                    raise PlannedStop(_warmup_stop_text(plan, trial, fields, needed, deadline))

                def annotate(row: dict[str, Any], number: int = fields["warmup_sequence"]) -> None:
                    row.update(warmup_row_fields(plan, folder.rows(), row, number))

                last_end = _run_one(
                    plan,
                    trial,
                    trial_fn,
                    folder,
                    cooldown,
                    on_trial_start,
                    on_trial_end,
                    placement,
                    fields["warmup_reason"],
                    {k: v for k, v in fields.items() if k != "warmup_reason"},
                    annotate,
                )
                resumed = False
                continue
            reason = ""  # with --warmup auto a sequence, not one warm-up, follows a resume or a gap
        if reason:
            needed += cooldown + estimated_seconds(unit[0], rows)
        # A unit with nothing to estimate from (no finished trial yet) runs: only the log can say it would not fit.
        if deadline is not None and not started_round and needed > 0 and time.monotonic() + needed > deadline:
            raise PlannedStop(_stop_text(plan, unit, needed, deadline))
        if reason:
            used = {int(r["index"]) for r in rows} | {t.index for t in plan.schedule}
            warm = extra_warmup(plan, unit[0], max(used) + 1)
            _run_one(plan, warm, trial_fn, folder, cooldown, on_trial_start, on_trial_end, placement, reason)
        if concurrent:
            if cooldown:
                time.sleep(cooldown)
            if partners:  # a half-done round runs again whole (harness.duet), numbered after any warm-up
                partners = duet_partners(plan, unit, folder.rows())
            batch = [*unit, *partners]
            _run_together(plan, batch, trial_fn, folder, on_trial_start, on_trial_end, placement)
            last_end = time.monotonic()
        else:
            for trial in unit:
                last_end = _run_one(
                    plan, trial, trial_fn, folder, cooldown, on_trial_start, on_trial_end, placement
                )
        resumed = False  # any trial run since the resume has warmed the machine


def _stop_text(plan: Plan, unit: list[ScheduledTrial], needed: float, deadline: float) -> str:
    """What ``--stop-after`` stopped before: a warm-up, a pair or a round, by its trials in the schedule."""
    first, last = unit[0], unit[-1]
    position = [t.index for t in plan.schedule]
    trials = f"trial {position.index(first.index) + 1}" + (
        f"–{position.index(last.index) + 1}" if len(unit) > 1 else ""
    )
    what = (
        f"warm-up {trials} of {len(plan.schedule)}"
        if first.phase != "measured"
        else f"{'pair' if len(unit) == 2 else 'round'} {first.round + 1} ({trials} of {len(plan.schedule)})"
    )
    return (
        f"stopping before {what} ({', '.join(t.arm for t in unit)}, about {needed:.0f} s by the log; "
        f"{max(deadline - time.monotonic(), 0):.0f} s left of --stop-after)"
    )


def _warmup_stop_text(
    plan: Plan, trial: ScheduledTrial, fields: dict[str, Any], needed: float, deadline: float
) -> str:
    """What ``--stop-after`` stopped before inside (or at the start of) a ``--warmup auto`` sequence."""
    return (
        f"stopping before warm-up {fields['warmup_step']} of the {fields['warmup_reason']} sequence "
        f"({trial.arm}; with the warm-ups and the trials after it about {needed:.0f} s by the log; "
        f"{max(deadline - time.monotonic(), 0):.0f} s left of --stop-after)"
    )


def _run_one(
    plan: Plan,
    trial: ScheduledTrial,
    trial_fn: TrialFunction,
    folder: RunFolder,
    cooldown: float,
    on_trial_start: Callable[[ScheduledTrial], None] | None,
    on_trial_end: Callable[[dict[str, Any]], None] | None,
    placement: Placement | None = None,
    warmup_reason: str = "",
    fields: dict[str, Any] | None = None,
    annotate: Callable[[dict[str, Any]], None] | None = None,
) -> float:
    """Run one trial after the cool-down, log its row (with ``fields``, then ``annotate``'s, for a warm-up
    outside the schedule), and return when it ended (``time.monotonic()``)."""
    if cooldown:
        time.sleep(cooldown)
    if on_trial_start:
        on_trial_start(trial)
    row = run_trial(plan, trial, trial_fn, folder.path, placement)
    ended = time.monotonic()
    if warmup_reason:
        row["warmup_reason"] = warmup_reason
    row.update(fields or {})
    if annotate is not None:
        annotate(row)
    folder.append_row(row)
    if on_trial_end:
        on_trial_end(row)
    return ended


def duet_placements(placement: Placement | None, trials: list[ScheduledTrial]) -> list[Placement | None]:
    """One share of the worker cores per slot of a duet round: slot k runs on the k-th share, and since the
    arms' order alternates from round to round (AB, BA, …), each arm takes each share in turn."""
    if placement is None:
        return [None] * len(trials)
    shares = split_placement(placement, len(trials))
    return [shares[t.slot] for t in trials]


def concurrent_problem(plan: Plan, placement: Placement | None) -> str | None:
    """Why the plan's concurrent order cannot run here (None where it can, or the order runs one trial at a
    time): a round's arms run at once, each in its own worker process on its own share of the worker cores."""
    order = plan.protocol.order
    if order not in CONCURRENT_ORDERS:
        return None
    if plan.in_process:
        return (
            f"--order {order} runs a round's arms at once, each in its own worker process, and the {plan.tier} "
            "tier's trials run in this process; use --order alternate"
        )
    at_once = max(len(case.arms) for case in plan.cases)
    if placement is not None and len(placement.worker_cores) < at_once:
        return (
            f"--order {order} runs {at_once} arms at once, one per share of the worker cores, so it needs "
            f"{at_once} worker cores, and --cpus {plan.protocol.cpus} leaves {len(placement.worker_cores)}; "
            "give more cores, or use --order alternate"
        )
    return None


def _run_together(
    plan: Plan,
    batch: list[ScheduledTrial],
    trial_fn: TrialFunction,
    folder: RunFolder,
    on_trial_start: Callable[[ScheduledTrial], None] | None,
    on_trial_end: Callable[[dict[str, Any]], None] | None,
    placement: Placement | None,
) -> None:
    """The trials of one duet round at once, each row appended as its trial ends (worker tiers only); a half
    whose trial has ended runs fillers until its partners end (``harness.duet``)."""
    if plan.in_process:
        raise ValueError("a concurrent order needs a tier whose trials run in worker processes")
    lock = threading.Lock()
    rows: list[dict[str, Any]] = []
    failures: list[BaseException] = []
    ended = {trial.index: threading.Event() for trial in batch}

    def one(trial: ScheduledTrial, where: Placement | None) -> None:
        try:
            row = run_trial(plan, trial, trial_fn, folder.path, where)
            row["concurrent_with"] = [t.index for t in batch if t.index != trial.index]
            if trial.phase == "warmup":  # a partner of a half-done round's missing trial
                row["warmup_reason"] = PARTNER_REASON
            with lock:
                folder.append_row(row)
                rows.append(row)
        except BaseException as exc:  # noqa: BLE001 - raised again below: a failed write stops the run
            failures.append(exc)
        finally:
            ended[trial.index].set()
        if not failures:
            case = plan.case(trial.case)
            fill_until_partners_end(
                lambda filler, stop: TrialContext(
                    plan, filler, case, case.arm(trial.arm), folder.path, where, cancel=stop
                ),
                trial,
                trial_fn,
                folder.path,
                [event for index, event in ended.items() if index != trial.index],
            )

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
    if failures:
        raise failures[0]
