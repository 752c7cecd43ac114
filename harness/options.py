"""The protocol options every tier shares, checked once into one ``ProtocolOptions``.

``InputError`` carries the one line a bad value gets; the CLI prints it and exits with status 2 before
anything is written. Defaults live on ``ProtocolOptions`` (and ``DEFAULT_ARMS`` / ``AUTO_DEVICE`` for the two
options given as text); the CLI reads them from here.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

import torch

from harness.env import gpu_snapshot
from harness.formatting import format_bytes
from harness.placement import Placement, choose_placement, split_placement
from harness.protocol import CONCURRENT_ORDERS, ORDERS, Arm, ProtocolOptions
from harness.timing import parse_bytes

DEFAULT_ARMS = "baseline,candidate"
NO_PLACEMENT = "none"
AUTO_DEVICE = "auto"


class InputError(ValueError):
    """A bad user input: the message names what is wrong and what is accepted."""


_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")
_DEVICE_LIST = re.compile(r"^cuda:\d+(,\d+)+$")


def resolve_device(device: str) -> tuple[str, str]:
    """(device, why): ``auto`` is CUDA where a CUDA device is present, else the CPU."""
    if device != AUTO_DEVICE:
        return check_device(device), f"--device {device}"
    if torch.cuda.is_available():
        return "cuda", "auto: a CUDA device is present"
    return "cpu", "auto: no CUDA device here"


def check_device(device: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N``, and CUDA only where a CUDA device is present."""
    if not _DEVICE.match(device):
        raise InputError(f"--device '{device}' is not a device; use auto, cpu, cuda or cuda:N")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise InputError(
                f"--device {device}: no CUDA device is available here (torch {torch.__version__}); use --device cpu"
            )
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise InputError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here")
    return device


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
    check_positive("--gpus", gpus)
    if gpus == 1:
        return gpus
    if device.startswith("cuda"):
        first = int(device.split(":")[1]) if ":" in device else 0
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


def check_positive(name: str, value: int) -> int:
    if value < 1:
        raise InputError(f"{name} must be a positive whole number (got {value})")
    return value


def check_non_negative(name: str, value: int | float) -> int | float:
    if not (isinstance(value, int) or math.isfinite(value)) or value < 0:
        raise InputError(f"{name} must be zero or more (got {value})")
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


def parse_arms(text: str, control: bool) -> tuple[Arm, ...]:
    """``baseline,candidate`` → arms; the first is the reference. ``control`` runs the first against itself."""
    specs = split_list("--arms", text)
    if control:
        return (Arm(specs[0], "baseline", specs[0]), Arm(f"{specs[0]}-control", "candidate", specs[0]))
    if len(specs) < 2:
        raise InputError(
            f"--arms '{text}' names one arm; name two or more (baseline first), or add --control"
        )
    if len(set(specs)) != len(specs):
        raise InputError(f"--arms '{text}' names an arm twice; use --control for an A/A run")
    return tuple(Arm(spec, "baseline" if i == 0 else "candidate", spec) for i, spec in enumerate(specs))


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
        placement = choose_placement(text)
        if order in CONCURRENT_ORDERS:
            split_placement(placement, 2)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return text


def resolve_placement(cpus: str) -> Placement | None:
    """The placement ``--cpus`` asks for on this machine: None for ``none``, and for ``auto`` where the OS
    offers no CPU affinity (not Linux), so the default runs everywhere."""
    text = cpus.strip().lower()
    if text == NO_PLACEMENT or (text == "auto" and not hasattr(os, "sched_setaffinity")):
        return None
    return choose_placement(cpus)


def protocol_options(
    arms: str = DEFAULT_ARMS,
    warmup: int = ProtocolOptions.default("warmup"),
    pairs: int = ProtocolOptions.default("pairs"),
    order: str = ProtocolOptions.default("order"),
    seed: int = ProtocolOptions.default("seed"),
    bar: float | None = ProtocolOptions.default("bar"),
    device: str = AUTO_DEVICE,
    budget: str | None = None,
    control: bool = ProtocolOptions.default("control"),
    cooldown: float = ProtocolOptions.default("cooldown"),
    cpus: str = ProtocolOptions.default("cpus"),
    gpus: int = ProtocolOptions.default("gpus"),
    announce: Any = None,
) -> ProtocolOptions:
    """Check every shared option and return them parsed (``InputError`` on the first bad one).

    ``device='auto'`` resolves here (CUDA when present, else the CPU); ``announce`` is told which and why.
    ``--device cuda:0,1`` is ``--device cuda:0 --gpus 2``.
    """
    budget_bytes = parse_budget(budget)
    device, gpus = split_device_list(device, gpus)
    device, why = resolve_device(device)
    if announce is not None:
        ranks = f"; {gpus} ranks per trial" if gpus > 1 else ""
        announce(f"device: {device} ({why}{ranks})")
    check_budget_fits(budget_bytes, device)
    return ProtocolOptions(
        arms=parse_arms(arms, control),
        warmup=check_non_negative("--warmup", warmup),
        pairs=check_positive("--pairs", pairs),
        order=check_choice("--order", order, ORDERS),
        seed=check_non_negative("--seed", seed),
        bar=check_bar(bar, control),
        device=device,
        budget=budget_bytes,
        control=control,
        cooldown=float(check_non_negative("--cooldown", cooldown)),
        cpus=check_cpus(cpus, order),
        gpus=check_gpus(gpus, device, order),
    )
