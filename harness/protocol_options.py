"""The options every tier shares, each declared once (``harness.schema``), and the one check of them."""

from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, fields
from typing import Any

from harness.calibration import parse_size
from harness.errors import InputError
from harness.limits import MAX_PAIRS
from harness.placement import is_placement_form
from harness.schedule import CONCURRENT_ORDERS, ORDERS, Arm
from harness.schema import OptionError, check_fields, finite, flag_of, named, option, require
from harness.timing import parse_bytes

DEFAULT_ARMS = "baseline,candidate"
# The options of the first plan format (flat beside the tier's), in the order ``protocol_options`` takes them.
FIRST_FORMAT_OPTIONS = ("arms", "warmup", "pairs", "order", "seed", "bar", "device", "budget", "control")
AUTO_DEVICE = "auto"
# Warm-ups are discarded: a device and its caches warm within a few trials.
MAX_WARMUP = 1_000
# The largest seed every generator here takes (a signed 64-bit integer); each trial's seed is derived from it.
MAX_SEED = 2**63 - 1
# GPU clocks settle within seconds; an hour's pause before every trial is a typo, not a cool-down.
MAX_COOLDOWN = 3600.0
# Ranks per trial: one node's devices (or CPU ranks) each start a process; more than 1024 is no machine here.
MAX_GPUS = 1024
# A device a plan can name (a list is split before); device numbers are ASCII digits.
DEVICE_FORM = re.compile(r"^(cpu|cuda(:\d+)?)$", re.ASCII)


_bar = require(
    finite(lambda bar: -100 < bar < 100),
    "--bar {} is not a percentage; use a number between -100 and 100, e.g. 8",
)


def cuda_index(device: str) -> int:
    """The index a CUDA device name gives (``cuda`` is device 0)."""
    return int(device.split(":")[1]) if ":" in device else 0


def check_device_form(device: str) -> None:
    if not DEVICE_FORM.match(device):
        raise InputError(f"--device '{device}' is not a device; use auto, cpu, cuda or cuda:N")


_cpus = require(is_placement_form, "--cpus '{}' is not auto, none or a core list such as 2-7")
_tolerance = require(
    finite(lambda t: 0 < t < 100), "--tolerance {} is not a positive percentage below 100; use e.g. 1"
)
_precision = require(
    finite(lambda p: p > 0), "--precision must be a positive half-width in percentage points (got {})"
)
_time_budget = require(finite(lambda s: s > 0), "--time-budget must be a positive number of seconds (got {})")


ARMS_HELP = (
    "Comma-separated arms, baseline first: baseline, candidate, candidate-cpu (the candidate with CPU tensors "
    "through its batched path), upstream, or package.module:Class, each as label=spec with keywords if you "
    "like ('fused=torch.optim:AdamW(fused=True)'). Each gets param groups with lr, momentum, weight_decay, "
    "nesterov, use_muon; its constructor the keywords it names of: muon, sgd (screen, probe, parity), and "
    "lr, momentum, weight_decay, nesterov, use_muon too (pair); then its own. "
    f"Default: {DEFAULT_ARMS} on CUDA, baseline,candidate-cpu on the CPU."
)


@dataclass(frozen=True)
class ProtocolOptions:
    """What every tier's schedule is built from: checked once (``check_protocol``) and passed whole."""

    arms: tuple[Arm, ...] = option(MISSING, ARMS_HELP, cli_type=str | None, cli_default=None)
    warmup: int | str = option(
        2,
        "Discarded warm-up trials per case, cycling through the arms (logged, not in the statistics). auto: "
        "until one is at most 0.5% faster than its arm's previous, at most 6 (else the report says so); "
        "again after a resume or an idle gap.",
        cli_type=str,
        cli_default="2",
        low=0,
        high=MAX_WARMUP,
        words=("auto",),
    )
    pairs: int | str = option(
        6,
        "Measured pairs (rounds: each arm once) per case, counterbalanced (an even count balances AB/BA). auto: "
        "until the interval's half-width is at most --precision, or --time-budget is spent (looks every 2 "
        "pairs from 6 to --max-pairs, alpha spent over them).",
        cli_type=str,
        cli_default="6",
        low=1,
        high=MAX_PAIRS,
        words=("auto",),
    )
    order: str = option(
        "alternate",
        "Arm order within pairs: alternate (AB, BA, …; a balanced Latin square for more arms), abba (AB, BA, "
        "BA, AB, …), random (seeded) or duet (the arms at once, each on a share of the cores). Not given: duet "
        "for worker trials with 4 worker cores per arm, else alternate.",
        choices=ORDERS,
    )
    seed: int = option(0, "Seed for data and random order.", low=0, high=MAX_SEED)
    bar: float | None = option(
        None,
        "The bar, in percent, the paired reduction must clear (e.g. 8); with --control, the tolerance ±bar "
        "the A/A difference must stay within (e.g. 1).",
        check=_bar,
    )
    device: str = option(
        "cpu",
        "auto (CUDA when present, else the CPU), cpu, cuda, cuda:N, or consecutive devices cuda:0,1 "
        "(= --gpus 2).",
        cli_default=AUTO_DEVICE,
        check=check_device_form,
    )
    budget: int | None = option(
        None,
        "Device-memory cap emulated on a larger card, e.g. 24GiB or 800MiB.",
        cli_type=str | None,
        low=1,
        high=2**63 - 1,
        parse=parse_bytes,
    )
    control: bool = option(
        False,
        "A/A control: add the first arm again (<first>-control) to the same schedule; alone, the run is an A/A.",
        flag="--control",
    )
    cooldown: float = option(
        0.0,
        "Seconds to pause before each trial (GPU clocks settle between trials).",
        low=0,
        high=MAX_COOLDOWN,
    )
    calibrate: str | None = option(
        None,
        "Add a calibration arm: the baseline with a known host-side delay, e.g. 5% (of a baseline warm-up) or "
        "2.5s; its recovered/known ratio shows whether the design biases.",
        parse=parse_size,
    )
    cpus: str = option(
        "auto",
        "CPU placement of the trials: auto (a fixed core set for the worker, apart from the parent), a core "
        "list such as 2-7, or none (as the OS schedules); threads fixed to match.",
        check=_cpus,
    )
    tolerance: float | None = option(
        None,
        "With --control beside other arms: the ±tolerance, in percent, the A/A arm must stay within (e.g. 1).",
        check=_tolerance,
    )
    precision: float | None = option(
        None,
        "With --pairs auto: the target half-width of the interval, in percentage points of reduction.",
        check=_precision,
    )
    max_pairs: int = option(
        20, "With --pairs auto: the last look (most pairs per case).", low=1, high=MAX_PAIRS
    )
    time_budget: float | None = option(
        None,
        "Seconds the run may take (default: 3600 on the CPU, none on a GPU); a longer plan is refused before "
        "its first trial, exit 2. With --pairs auto: stop at the next pair boundary once the log would pass it.",
        check=_time_budget,
    )
    first_look: int = option(
        6, low=1, high=MAX_PAIRS
    )  # --pairs auto: the first look (then one every 2 pairs)
    # --warmup auto: a warm-up settles its sequence when it is at most this much faster (percent) than its
    # arm's previous one: a transient makes fits faster as it fades. tests/harness/test_warmup.py simulates the rates.
    warmup_tolerance: float = option(
        0.5, check=require(finite(lambda t: t > 0), "warmup_tolerance must be positive (got {})")
    )
    # --warmup auto: the most warm-ups of one sequence; two arms then get four checks (the figures above).
    max_warmup: int = option(6, low=2, high=MAX_WARMUP)
    gpus: int = option(
        1,
        "Ranks per trial: each trial is data-parallel over N devices from --device on (N CPU ranks on gloo "
        "when the device is the CPU).",
        low=1,
        high=MAX_GPUS,
    )

    @property
    def auto_warmup(self) -> bool:
        """Warm-ups run until two consecutive ones of an arm agree (``--warmup auto``), not a fixed count."""
        return self.warmup == "auto"

    @property
    def scheduled_warmup(self) -> int:
        """The warm-ups the schedule holds per case (none with ``--warmup auto``: decided as they run)."""
        return 0 if self.auto_warmup else int(self.warmup)

    @property
    def auto(self) -> bool:
        """Pairs chosen by the stopping rule (``--pairs auto``)."""
        return self.pairs == "auto"

    @property
    def initial_pairs(self) -> int:
        """The rounds the first schedule holds: all of them, or with ``--pairs auto`` those of the first look."""
        return self.first_look if self.auto else int(self.pairs)

    @property
    def rank_devices(self) -> tuple[str, ...]:
        """Each rank's device: consecutive CUDA devices from ``device``'s index, or the CPU for every rank."""
        if not self.device.startswith("cuda"):
            return (self.device,) * self.gpus
        if self.gpus == 1:
            return (self.device,)
        return tuple(f"cuda:{cuda_index(self.device) + rank}" for rank in range(self.gpus))

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


def _disagreement(p: ProtocolOptions) -> tuple[str | None, str] | None:
    """The first pair of options that disagree: (the field to blame, if one is, and the line), or None."""
    if p.pairs != "auto":
        extra = [flag_of(n) for n in ("precision", "max_pairs") if getattr(p, n) != p.default(n)]
        if extra:
            verb = "only applies" if len(extra) == 1 else "only apply"
            return None, f"{', '.join(extra)} {verb} with --pairs auto (got --pairs {p.pairs})"
    elif p.precision is None:
        return None, "--pairs auto needs --precision P: the target half-width of the interval, in points"
    elif p.max_pairs < p.first_look:
        return (
            None,
            f"--max-pairs {p.max_pairs} is below the first look at {p.first_look} pairs; use {p.first_look} or more",
        )
    if p.tolerance is not None and not p.control:
        return "tolerance", "--tolerance judges the A/A arm; add --control (or drop --tolerance)"
    if p.control and len(p.arms) == 2 and p.bar is not None and p.bar <= 0:
        return (
            "bar",
            f"--bar {p.bar} with --control is the A/A tolerance ±bar; use a positive percentage, e.g. 1",
        )
    if p.gpus > 1 and p.order in CONCURRENT_ORDERS:
        return (
            "gpus",
            f"--order {p.order} with --gpus {p.gpus}: concurrent trials of several ranks are not run",
        )
    return None


def check_protocol(p: ProtocolOptions, prefix: str = "--") -> ProtocolOptions:
    """``p`` unless a value is out of its bounds or the values disagree (``InputError``, one line; an
    ``OptionError`` names the field). ``prefix`` names the options (``--`` on the CLI, none in the API)."""
    check_fields(p, prefix)
    problem = _disagreement(p)
    if problem is None:
        return p
    field, line = problem
    raise InputError(named(line, prefix)) if field is None else OptionError(field, named(line, prefix))
