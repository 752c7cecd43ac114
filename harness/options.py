"""The shared options as typed, parsed and checked into one ``ProtocolOptions``; bad input is ``InputError``."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import torch

from harness.calibration import with_calibration
from harness.env import gpu_snapshot
from harness.errors import InputError
from harness.formatting import format_bytes
from harness.placement import Placement, choose_placement
from harness.protocol_options import (
    AUTO_DEVICE,
    DEFAULT_ARMS,
    FIRST_FORMAT_OPTIONS,
    ProtocolOptions,
    check_device_form,
    check_protocol,
    cuda_index,
)
from harness.schedule import CONCURRENT_ORDERS, Arm
from harness.schema import parse_typed

NO_PLACEMENT = "none"
_DEVICE_LIST = re.compile(r"^cuda:\d+(,\d+)+$", re.ASCII)


def resolve_device(device: str) -> tuple[str, str]:
    """(device, why): ``auto`` is CUDA where a CUDA device is present, else the CPU."""
    if device != AUTO_DEVICE:
        return check_device(device), f"--device {device}"
    if torch.cuda.is_available():
        return "cuda", "auto: a CUDA device is present"
    return "cpu", "auto: no CUDA device here"


def check_device(device: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N``, and CUDA only where a CUDA device is present."""
    check_device_form(device)
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
    """``cuda:0,1`` → (``cuda:0``, 2): the first of consecutive CUDA devices, and the rank count.

    The count must agree with ``--gpus`` where that is given; any other device comes back as it is."""
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


def check_gpus(gpus: int, device: str) -> int:
    """Ranks per trial: on CUDA, no more than the devices from ``device``'s index on."""
    if gpus > 1 and device.startswith("cuda"):
        available = torch.cuda.device_count() - cuda_index(device)
        if gpus > available:
            raise InputError(
                f"--gpus {gpus} from {device}: only {max(available, 0)} CUDA device(s) from there on; use --gpus "
                f"{max(available, 1)} or fewer"
            )
    return gpus


def split_list(name: str, text: str) -> list[str]:
    """A comma-separated option value as a list (commas inside brackets or quotes kept), refusing empty items."""
    items = [item.strip() for item in split_top_level(text)]
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
    """``baseline,candidate`` → arms; the first is the reference."""
    pairs = [split_arm(item) for item in split_list("--arms", text)]
    labels = [label for label, _ in pairs]
    specs = [spec for _, spec in pairs]
    if len(set(labels)) != len(labels) or len(set(specs)) != len(specs):
        raise InputError(f"--arms '{text}' names an arm twice; use --control for an A/A arm")
    if len(specs) < 2 and not control:
        raise InputError(f"--arms '{text}' names one arm; name two or more, or add --control")
    arms = tuple(
        Arm(label, "baseline" if i == 0 else "candidate", spec) for i, (label, spec) in enumerate(pairs)
    )
    if control:
        twin = f"{labels[0]}-control"
        if twin in labels:
            raise InputError(f"--arms '{text}' already names '{twin}', the label --control gives the A/A arm")
        arms += (Arm(twin, "candidate", specs[0]),)
    return arms


def card_bytes(device: str) -> int | None:
    """Total memory of a CUDA card, None off CUDA.

    From nvidia-smi where it answers (no CUDA context in a parent that must not touch the GPU), else torch."""
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


def check_cpus(cpus: str, order: str = "alternate") -> str:
    """``none``, ``auto`` or a core list this process may use (one line for anything else); a concurrent order
    needs a placement to share."""
    text = str(cpus).strip()
    if _unplaced(text):
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


def _unplaced(cpus: str) -> bool:
    """``none``, or ``auto`` where the OS offers no CPU affinity (not Linux)."""
    text = cpus.strip().lower()
    return text == NO_PLACEMENT or (text == "auto" and not hasattr(os, "sched_setaffinity"))


def resolve_placement(cpus: str) -> Placement | None:
    """The placement ``--cpus`` asks for on this machine: None for ``none``, and for ``auto`` where the OS
    offers no CPU affinity (not Linux), so the default runs everywhere."""
    if _unplaced(cpus):
        return None
    return choose_placement(cpus)


def protocol_options(
    *positional: Any,
    announce: Any = None,
    default_arms: Callable[[str], tuple[str, str]] | None = None,
    **given: Any,
) -> ProtocolOptions:
    """The shared options as typed (arms and budget as text), parsed and checked (``InputError``).

    A field not given takes its default."""
    values = {f.name: f.default for f in fields(ProtocolOptions) if f.name != "arms"}
    values |= {
        "arms": DEFAULT_ARMS,
        "device": AUTO_DEVICE,
        **dict(zip(FIRST_FORMAT_OPTIONS, positional, strict=False)),
        **given,
    }
    values = parse_typed(ProtocolOptions, values)  # bounds: check_protocol
    arms, device, budget_bytes = values.pop("arms"), values.pop("device"), values.pop("budget")
    device, gpus = split_device_list(device, values["gpus"])
    if values["calibrate"] is not None and gpus > 1:
        raise InputError("--calibrate times one process per trial; drop it or --gpus")
    device, why = resolve_device(device)
    if announce is not None:
        ranks = f"; {gpus} ranks per trial" if gpus > 1 else ""
        announce(f"device: {device} ({why}{ranks})")
    if arms is None:
        arms, arms_why = default_arms(device) if default_arms is not None else (DEFAULT_ARMS, "the default")
        if announce is not None:
            announce(f"arms: {arms} ({arms_why})")
    control = bool(values["control"])
    values["cpus"] = check_cpus(values["cpus"], values["order"])
    parsed_arms = with_calibration(parse_arms(arms, control), values["calibrate"], values["warmup"])
    options = ProtocolOptions(
        arms=parsed_arms, device=device, budget=budget_bytes, **{**values, "gpus": gpus}
    )
    check_protocol(options)
    check_budget_fits(budget_bytes, device)
    check_gpus(gpus, device)
    return options
