"""The protocol options every tier shares, checked once into one ``ProtocolOptions``.

``InputError`` carries the one line a bad value gets; the CLI prints it and exits with status 2 before
anything is written. Defaults live on ``ProtocolOptions`` (and ``DEFAULT_ARMS`` / ``AUTO_DEVICE`` for the two
options given as text); the CLI reads them from here.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from typing import Any

import torch

from harness.calibration import with_calibration
from harness.env import gpu_snapshot
from harness.errors import InputError
from harness.formatting import format_bytes
from harness.limits import MAX_PAIRS
from harness.placement import Placement, choose_placement
from harness.protocol import CONCURRENT_ORDERS, ORDERS, Arm, ProtocolOptions
from harness.timing import parse_bytes

DEFAULT_ARMS = "baseline,candidate"
NO_PLACEMENT = "none"
AUTO_DEVICE = "auto"

# The most each count may be, checked before anything starts: a larger value names a run that cannot be run.
# No count here means anything past 2**31 - 1 (two billion steps, images, rows or replays), and larger values
# overflow the sizes torch and numpy take, so they could only fail inside every trial.
MAX_COUNT = 2**31 - 1
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
_DEVICE_LIST = re.compile(r"^cuda:\d+(,\d+)+$", re.ASCII)


def resolve_device(device: str) -> tuple[str, str]:
    """(device, why): ``auto`` is CUDA where a CUDA device is present, else the CPU."""
    if device != AUTO_DEVICE:
        return check_device(device), f"--device {device}"
    if torch.cuda.is_available():
        return "cuda", "auto: a CUDA device is present"
    return "cpu", "auto: no CUDA device here"


def cuda_index(device: str) -> int:
    """The index a CUDA device name gives (``cuda`` is device 0)."""
    return int(device.split(":")[1]) if ":" in device else 0


def check_device(device: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N``, and CUDA only where a CUDA device is present."""
    if not DEVICE_FORM.match(device):
        raise InputError(f"--device '{device}' is not a device; use auto, cpu, cuda or cuda:N")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise InputError(
                f"--device {device}: no CUDA device is available here (torch {torch.__version__}); use --device cpu"
            )
        index = cuda_index(device)
        if index >= torch.cuda.device_count():
            raise InputError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here")
    return device


def check_devices_here(device: str, gpus: int) -> None:
    """A recorded plan's devices (``device`` and the ``gpus`` ranks from it) are on this machine: ``InputError``
    otherwise, for a resume, which cannot change them."""
    if not device.startswith("cuda"):
        return
    first = cuda_index(device)
    here = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if first + gpus > here:
        ranks = f" with {gpus} ranks" if gpus > 1 else ""
        raise InputError(
            f"the run is on {device}{ranks}, and this machine has {here} CUDA devices (torch "
            f"{torch.__version__}); resume it on a machine that has them"
        )


def split_device_list(device: str, gpus: int) -> tuple[str, int]:
    """``cuda:0,1`` → (``cuda:0``, 2): a list of consecutive CUDA devices names the first and the rank count
    (it must agree with ``--gpus`` where that is given too); any other device comes back as it is."""
    if not _DEVICE_LIST.match(device):
        return device, gpus
    indices = [int(i) for i in device.split(":")[1].split(",")]
    if indices != list(range(indices[0], indices[0] + len(indices))):
        raise InputError(
            f"--device {device}: the devices of a trial must be consecutive (e.g. cuda:0,1); pick others with "
            "CUDA_VISIBLE_DEVICES"
        )
    if gpus not in (1, len(indices)):
        raise InputError(
            f"--device {device} names {len(indices)} devices but --gpus is {gpus}; give one of them"
        )
    return f"cuda:{indices[0]}", len(indices)


def check_gpus(gpus: int, device: str, order: str = "alternate") -> int:
    """Ranks per trial: positive, on CUDA no more than the devices from ``device``'s index on; one rank per
    trial where the trials of a round run at once."""
    check_positive("--gpus", gpus, MAX_GPUS)
    if gpus == 1:
        return gpus
    if device.startswith("cuda"):
        first = cuda_index(device)
        available = torch.cuda.device_count() - first
        if gpus > available:
            raise InputError(
                f"--gpus {gpus} from {device}: only {max(available, 0)} CUDA device(s) from there on; use --gpus "
                f"{max(available, 1)} or fewer"
            )
    if order in CONCURRENT_ORDERS:
        raise InputError(
            f"--order {order} with --gpus {gpus}: concurrent trials of several ranks are not run"
        )
    return gpus


def check_positive(name: str, value: int, at_most: int | float = MAX_COUNT) -> int:
    """A whole number from 1 to ``at_most``."""
    if value < 1:
        raise InputError(f"{name} must be a positive whole number (got {value})")
    return check_at_most(name, value, at_most)


def check_non_negative(name: str, value: int | float, at_most: int | float = MAX_COUNT) -> int | float:
    """A number from 0 to ``at_most``."""
    if not (isinstance(value, int) or math.isfinite(value)) or value < 0:
        raise InputError(f"{name} must be zero or more (got {value})")
    return check_at_most(name, value, at_most)


def check_at_most(name: str, value: int | float, maximum: int | float) -> int | float:
    """``value`` unless it is more than ``maximum`` (the bound is argued where it is defined)."""
    if value > maximum:
        shown = f"{maximum:g}" if isinstance(maximum, float) else str(maximum)
        raise InputError(f"{name} {value} is more than {shown}, the most a run can take; use {shown} or less")
    return value


def check_choice(name: str, value: str, accepted: tuple[str, ...]) -> str:
    if value not in accepted:
        raise InputError(f"{name} '{value}' is not accepted; use one of: {', '.join(accepted)}")
    return value


def split_list(name: str, text: str) -> list[str]:
    """A comma-separated option value as a list, refusing empty items."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise InputError(f"{name} '{text}' must be a comma-separated list with no empty items")
    return items


ARM_LABEL = re.compile(r"\s*([A-Za-z0-9_][\w.-]*)\s*=(?!=)(.*)", re.DOTALL)


def split_top_level(text: str) -> list[str]:
    """``text`` split at the commas outside brackets and quotes: ``a=m:C(betas=(0.9, 0.99)),b`` is two items."""
    items, depth, quote, start = [], 0, "", 0
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    return [*items, text[start:]]


def split_arm(item: str) -> tuple[str, str]:
    """``label=spec`` → (label, spec); a bare spec is its own label. A label has no ``:`` or ``(``."""
    match = ARM_LABEL.fullmatch(item)
    label, spec = (match.group(1), match.group(2).strip()) if match else (item.strip(), item.strip())
    if not spec:
        raise InputError(f"--arms: arm '{label}' names no optimizer; write label=module:Class")
    return label, spec


def parse_arms(text: str, control: bool) -> tuple[Arm, ...]:
    """``baseline,candidate`` → arms; the first is the reference. An item may be ``label=spec`` and a spec may
    carry keywords (``fused=torch.optim:AdamW(fused=True)``); the tier reads the spec. ``control`` adds the
    first arm again as ``<first>-control`` (an A/A arm in the same schedule; alone, the run is an A/A control)."""
    items = [item.strip() for item in split_top_level(text)]
    if not text.strip() or any(not item for item in items):
        raise InputError(f"--arms '{text}' must be a comma-separated list with no empty items")
    pairs = [split_arm(item) for item in items]
    labels = [label for label, _ in pairs]
    specs = [spec for _, spec in pairs]
    if len(set(labels)) != len(labels) or len(set(specs)) != len(specs):
        raise InputError(f"--arms '{text}' names an arm twice; use --control for an A/A arm")
    if len(specs) < 2 and not control:
        raise InputError(
            f"--arms '{text}' names one arm; name two or more (baseline first), or add --control"
        )
    arms = tuple(
        Arm(label, "baseline" if i == 0 else "candidate", spec) for i, (label, spec) in enumerate(pairs)
    )
    if control:
        twin = f"{labels[0]}-control"
        if twin in labels:
            raise InputError(f"--arms '{text}' already names '{twin}', the label --control gives the A/A arm")
        arms += (Arm(twin, "candidate", specs[0]),)
    return arms


def parse_pairs(pairs: int | str) -> int | str:
    """``--pairs``: a positive whole number, or ``auto`` (the stopping rule chooses)."""
    if isinstance(pairs, str):
        text = pairs.strip().lower()
        if text == "auto":
            return "auto"
        try:
            pairs = int(text)
        except ValueError:
            raise InputError(
                f"--pairs '{pairs}' is not a number; use a positive whole number or auto"
            ) from None
    return check_positive("--pairs", pairs, MAX_PAIRS)


def parse_warmup(warmup: int | str, name: str = "--warmup") -> int | str:
    """``--warmup`` (or the API's ``name``): warm-up trials per case, a whole number from 0 to ``MAX_WARMUP``,
    or ``auto`` (warm-ups until one is no faster than its arm's previous, within a tolerance, capped;
    ``ProtocolOptions.warmup_tolerance``, ``max_warmup``)."""
    if isinstance(warmup, str):
        text = warmup.strip().lower()
        if text == "auto":
            return "auto"
        try:
            warmup = int(text)
        except ValueError:
            raise InputError(
                f"{name} '{warmup}' is not a number; use a whole number of 0 or more, or auto"
            ) from None
    if isinstance(warmup, bool) or not isinstance(warmup, int):
        raise InputError(f"{name} {warmup!r} is not a whole number; use a whole number of 0 or more, or auto")
    return int(check_non_negative(name, warmup, MAX_WARMUP))


def check_sequential(
    pairs: int | str, precision: float | None, max_pairs: int, time_budget: float | None, first_look: int
) -> None:
    """``--precision`` and ``--max-pairs`` belong to ``--pairs auto``, which needs a precision; the looks run
    from the first (every 2 pairs) to ``--max-pairs``. ``--time-budget``: positive seconds (``harness.estimate``)."""
    if time_budget is not None and not (math.isfinite(time_budget) and time_budget > 0):
        raise InputError(f"--time-budget must be a positive number of seconds (got {time_budget})")
    if pairs != "auto":
        given = [
            name
            for name, value, default in (
                ("--precision", precision, None),
                ("--max-pairs", max_pairs, ProtocolOptions.default("max_pairs")),
            )
            if value != default
        ]
        if given:
            verb = "only applies" if len(given) == 1 else "only apply"
            raise InputError(f"{', '.join(given)} {verb} with --pairs auto (got --pairs {pairs})")
        return
    if precision is None:
        raise InputError("--pairs auto needs --precision P: the target half-width of the interval, in points")
    if not math.isfinite(precision) or precision <= 0:
        raise InputError(f"--precision must be a positive half-width in percentage points (got {precision})")
    check_at_most("--max-pairs", max_pairs, MAX_PAIRS)
    if max_pairs < first_look:
        raise InputError(
            f"--max-pairs {max_pairs} is below the first look at {first_look} pairs; use {first_look} or more"
        )


def check_tolerance(tolerance: float | None, control: bool) -> float | None:
    """The A/A arm's ±tolerance in percent: positive, below 100, and only with ``--control``."""
    if tolerance is None:
        return None
    if not control:
        raise InputError("--tolerance judges the A/A arm; add --control (or drop --tolerance)")
    if not math.isfinite(tolerance) or not 0 < tolerance < 100:
        raise InputError(f"--tolerance {tolerance} is not a positive percentage below 100; use e.g. 1")
    return tolerance


def parse_budget(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise InputError(f"--budget {exc}") from None


def card_bytes(device: str) -> int | None:
    """Total memory of a CUDA card, from nvidia-smi where it answers (so a parent that must never touch the GPU
    creates no CUDA context), else from torch; None off CUDA."""
    if not device.startswith("cuda"):
        return None
    index = int(device.split(":")[1]) if ":" in device else torch.cuda.current_device()
    for gpu in gpu_snapshot():
        if (
            gpu["index"] == index
            and gpu["memory_total_mib"] is not None
            and "CUDA_VISIBLE_DEVICES" not in os.environ
        ):
            return int(gpu["memory_total_mib"] * 2**20)
    return int(torch.cuda.get_device_properties(index).total_memory)


def check_budget_fits(budget: int | None, device: str) -> int | None:
    """A budget needs a CUDA device and must fit the card, or it would not mean what it says."""
    if budget is None:
        return None
    if not device.startswith("cuda"):
        raise InputError(
            "--budget needs a CUDA device (it caps device memory); use --device cuda or drop --budget"
        )
    total = card_bytes(device)
    if total is not None and budget > total:
        raise InputError(
            f"--budget {format_bytes(budget)} exceeds the card's {format_bytes(total)}; use at most the card's memory"
        )
    return budget


def check_bar(bar: float | None, control: bool = False) -> float | None:
    """A claim's bar in percent; with ``control``, the A/A tolerance ±bar, so it must be positive."""
    if bar is not None and (not math.isfinite(bar) or not -100 < bar < 100):
        raise InputError(f"--bar {bar} is not a percentage; use a number between -100 and 100, e.g. 8")
    if control and bar is not None and bar <= 0:
        raise InputError(
            f"--bar {bar} with --control is the A/A tolerance ±bar; use a positive percentage, e.g. 1"
        )
    return bar


def check_cpus(cpus: str, order: str = "alternate") -> str:
    """``none``, ``auto`` or a core list this process may use (one line for anything else); a concurrent order
    needs a placement to share."""
    text = str(cpus).strip()
    if text.lower() == NO_PLACEMENT or (text.lower() == "auto" and not hasattr(os, "sched_setaffinity")):
        if order in CONCURRENT_ORDERS:
            raise InputError(
                f"--order {order} runs the arms at once on shares of the cores: give --cpus auto or a core list"
            )
        return NO_PLACEMENT
    try:
        choose_placement(text)  # the cores each concurrent arm needs are checked with the plan's arms
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return text.lower() if text.lower() == "auto" else text  # the plan records the word every reader takes


def resolve_placement(cpus: str) -> Placement | None:
    """The placement ``--cpus`` asks for on this machine: None for ``none``, and for ``auto`` where the OS
    offers no CPU affinity (not Linux), so the default runs everywhere."""
    text = cpus.strip().lower()
    if text == NO_PLACEMENT or (text == "auto" and not hasattr(os, "sched_setaffinity")):
        return None
    return choose_placement(cpus)


def protocol_options(
    arms: str | None = DEFAULT_ARMS,
    warmup: int | str = ProtocolOptions.default("warmup"),
    pairs: int = ProtocolOptions.default("pairs"),
    order: str = ProtocolOptions.default("order"),
    seed: int = ProtocolOptions.default("seed"),
    bar: float | None = ProtocolOptions.default("bar"),
    device: str = AUTO_DEVICE,
    budget: str | None = None,
    control: bool = ProtocolOptions.default("control"),
    cooldown: float = ProtocolOptions.default("cooldown"),
    cpus: str = ProtocolOptions.default("cpus"),
    tolerance: float | None = ProtocolOptions.default("tolerance"),
    precision: float | None = ProtocolOptions.default("precision"),
    max_pairs: int = ProtocolOptions.default("max_pairs"),
    time_budget: float | None = ProtocolOptions.default("time_budget"),
    gpus: int = ProtocolOptions.default("gpus"),
    calibrate: str | None = None,
    announce: Any = None,
    default_arms: Callable[[str], tuple[str, str]] | None = None,
) -> ProtocolOptions:
    """Check every shared option and return them parsed (``InputError`` on the first bad one).

    ``device='auto'`` resolves here (CUDA when present, else the CPU); ``announce`` is told which and why.
    ``arms=None`` (not given) takes ``default_arms(device)`` → (arms, why), announced, else ``DEFAULT_ARMS``.
    ``--device cuda:0,1`` is ``--device cuda:0 --gpus 2``.
    """
    parsed_pairs = parse_pairs(pairs)
    parsed_warmup = parse_warmup(warmup)
    first_look = ProtocolOptions.default("first_look")
    check_sequential(parsed_pairs, precision, max_pairs, time_budget, first_look)
    budget_bytes = parse_budget(budget)
    device, gpus = split_device_list(device, gpus)
    device, why = resolve_device(device)
    if announce is not None:
        ranks = f"; {gpus} ranks per trial" if gpus > 1 else ""
        announce(f"device: {device} ({why}{ranks})")
    if arms is None:
        arms, arms_why = default_arms(device) if default_arms is not None else (DEFAULT_ARMS, "the default")
        if announce is not None:
            announce(f"arms: {arms} ({arms_why})")
    parsed_arms = parse_arms(arms, control)
    if calibrate is not None and gpus > 1:
        raise InputError("--calibrate times one process per trial; drop it or --gpus")
    check_budget_fits(budget_bytes, device)
    return ProtocolOptions(
        arms=with_calibration(parsed_arms, calibrate, parsed_warmup),
        warmup=parsed_warmup,
        pairs=parsed_pairs,
        order=check_choice("--order", order, ORDERS),
        seed=check_non_negative("--seed", seed, MAX_SEED),
        bar=check_bar(bar, control and len(parsed_arms) == 2),
        device=device,
        budget=budget_bytes,
        control=control,
        cooldown=float(check_non_negative("--cooldown", cooldown, MAX_COOLDOWN)),
        cpus=check_cpus(cpus, order),
        tolerance=check_tolerance(tolerance, control),
        precision=precision,
        max_pairs=int(max_pairs),
        time_budget=time_budget,
        first_look=first_look,
        gpus=check_gpus(gpus, device, order),
    )
