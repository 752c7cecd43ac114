"""Synchronized brackets, peak memory, device-memory budgets and out-of-memory capture."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import torch

from harness.formatting import format_bytes

_UNITS: dict[str, int] = {"B": 1} | {
    unit: base**power
    for power, p in enumerate("KMGT", 1)
    for unit, base in ((f"{p}B", 1000), (f"{p}IB", 1024))
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$", re.ASCII)  # ASCII digits only
BYTES_ACCEPTED = "a positive number with a unit B, KB, MB, GB, TB, KiB, MiB, GiB or TiB, e.g. 24GiB or 800MiB"


def parse_bytes(text: str) -> int:
    """Parse a size such as ``24GiB``, ``800MiB`` or ``1.5GB`` into bytes (a bare number means bytes)."""
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"'{text}' is not a size; use {BYTES_ACCEPTED}")
    number, unit = match.groups()
    factor = _UNITS.get((unit or "B").upper())
    if factor is None:
        raise ValueError(f"'{text}' has an unknown unit '{unit}'; use {BYTES_ACCEPTED}")
    value = int(round(float(number) * factor))
    if value <= 0:
        raise ValueError(f"'{text}' is not positive; use {BYTES_ACCEPTED}")
    return value


def is_cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


def cuda_index(device: str | torch.device) -> int:
    """The ordinal of a CUDA device; plain ``cuda`` means the current device (some torch calls need it)."""
    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index


def synchronize(device: str | torch.device) -> None:
    """Wait for all queued work on ``device`` (a no-op off CUDA, where work is already synchronous)."""
    if is_cuda(device):
        torch.cuda.synchronize(torch.device(device))


@dataclass
class SyncTimer:
    """A synchronized wall-clock bracket: ``with SyncTimer(dev) as t: work()`` then ``t.seconds``."""

    device: str | torch.device = "cpu"
    start_ns: int = 0
    stop_ns: int = 0

    def __enter__(self) -> SyncTimer:
        synchronize(self.device)
        self.start_ns = time.perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        synchronize(self.device)
        self.stop_ns = time.perf_counter_ns()

    @property
    def seconds(self) -> float:
        return (self.stop_ns - self.start_ns) / 1e9


def reset_peaks(device: str | torch.device) -> None:
    """Reset the allocator's peak counters so the next ``read_peaks`` covers one trial only."""
    if is_cuda(device):
        torch.cuda.reset_peak_memory_stats(torch.device(device))


def read_peaks(device: str | torch.device) -> tuple[int | None, int | None]:
    """(peak allocated, peak reserved) bytes since the last reset; (None, None) where not measurable."""
    if not is_cuda(device):
        return None, None
    dev = torch.device(device)
    return int(torch.cuda.max_memory_allocated(dev)), int(torch.cuda.max_memory_reserved(dev))


def current_allocated(device: str | torch.device) -> int | None:
    return int(torch.cuda.memory_allocated(torch.device(device))) if is_cuda(device) else None


def apply_budget(budget_bytes: int | None, device: str | torch.device) -> float | None:
    """Cap this process's device memory at ``budget_bytes`` through the per-process memory fraction."""
    if budget_bytes is None:
        return None
    if not is_cuda(device):
        raise ValueError("a device-memory budget needs a CUDA device; drop --budget or use --device cuda")
    index = cuda_index(device)
    total = torch.cuda.get_device_properties(index).total_memory
    if budget_bytes > total:
        raise ValueError(
            f"budget {format_bytes(budget_bytes)} exceeds the card's {format_bytes(total)}; "
            "use a budget at most the card's memory"
        )
    fraction = budget_bytes / total
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return fraction


def release_budget(device: str | torch.device) -> None:
    """Undo ``apply_budget`` (fraction 1.0) and return cached blocks to the driver."""
    if is_cuda(device):
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0, cuda_index(device))


# --- out-of-memory as data --------------------------------------------------------------------------

_SIZE_IN_TEXT = r"(\d+(?:\.\d+)?)\s*(bytes|B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)"
_OOM_FIELDS: dict[str, re.Pattern[str]] = {
    "requested": re.compile(r"[Tt]ried to allocate " + _SIZE_IN_TEXT),  # the CPU allocator's message too
    "total": re.compile(r"total capacity of " + _SIZE_IN_TEXT),
    "free": re.compile(r"of which " + _SIZE_IN_TEXT + r" is free"),
    "budget": re.compile(_SIZE_IN_TEXT + r" allowed;"),
    "allocated": re.compile(r"[Oo]f the allocated memory " + _SIZE_IN_TEXT + r" is allocated by PyTorch"),
    "reserved_unallocated": re.compile(_SIZE_IN_TEXT + r" is reserved by PyTorch but unallocated"),
}
_CPU_OOM = re.compile(r"you tried to allocate (\d+) bytes")


def _to_bytes(number: str, unit: str) -> int:
    unit = {"bytes": "B"}.get(unit, unit)
    return int(round(float(number) * _UNITS[unit.upper()]))


def is_out_of_memory(exc: BaseException) -> bool:
    """True for PyTorch's out-of-memory errors on any device, including the CPU allocator's."""
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    text = str(exc)
    return "out of memory" in text.lower() or bool(_CPU_OOM.search(text))


def parse_oom(message: str) -> dict[str, int | None]:
    """Byte figures of an out-of-memory message: requested, total, free, allocated, reserved, budget."""
    found = {
        name: _to_bytes(*m.groups()) if (m := pattern.search(message)) else None
        for name, pattern in _OOM_FIELDS.items()
    }
    allocated, slack = found["allocated"], found.pop("reserved_unallocated")
    found["reserved"] = allocated + slack if allocated is not None and slack is not None else None
    return {key: found[key] for key in ("requested", "total", "free", "allocated", "reserved", "budget")}


@dataclass
class TrialFailure:
    """How a trial failed: ``resource_failure`` (out of memory, with byte figures) or ``error``."""

    status: str
    message: str
    oom: dict[str, Any]

    @classmethod
    def from_exception(cls, exc: BaseException, budget: int | None = None) -> TrialFailure:
        message = f"{type(exc).__name__}: {exc}".strip()
        if is_out_of_memory(exc):
            figures = parse_oom(str(exc))
            if figures["budget"] is None:
                figures["budget"] = budget
            return cls("resource_failure", message, figures)
        return cls("error", message, {})


class StageClock:
    """Charges the time between consecutive marks to the stage each mark names.

    Switched off (``enabled=False``, a claim run's clock) it marks nothing and wraps nothing, so it adds
    nothing inside the timed bracket.
    """

    def __init__(
        self, device: str | torch.device = "cpu", synchronized: bool = True, *, enabled: bool = True
    ) -> None:
        self.device = device
        self.synchronized = synchronized
        self.enabled = enabled
        self.events = is_cuda(device) and not synchronized
        self.marks: list[tuple[str, Any]] = []
        # Synchronized: the host clock at each mark as it was reached, before its synchronization.
        self.reached: list[float] = []
        self.iteration_marks: list[int] = []

    def _now(self) -> Any:
        if self.events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        if self.synchronized:
            self.reached.append(time.perf_counter())
            synchronize(self.device)
        return time.perf_counter()

    def start(self) -> None:
        if self.enabled:
            self.reached = []
            self.marks = [("", self._now())]
            self.iteration_marks = []

    def mark(self, stage: str) -> None:
        """Charge the time since the previous mark to ``stage``."""
        if self.enabled:
            self.marks.append((stage, self._now()))

    def iteration(self) -> None:
        """Mark the start of a training iteration (the time before it, its fetch, goes to ``data``)."""
        if self.enabled:
            self.mark("data")
            self.iteration_marks.append(len(self.marks) - 1)

    def wrap(self, function: Any, before: str, after: str) -> Any:
        """``function`` bracketed: time up to its call goes to ``before``, its own time to ``after``."""
        if not self.enabled:
            return function

        def bracketed(*args: Any, **kwargs: Any) -> Any:
            self.mark(before)
            try:
                return function(*args, **kwargs)
            finally:
                self.mark(after)

        return bracketed

    def _seconds(self, earlier: Any, later: Any) -> float:
        return earlier.elapsed_time(later) / 1e3 if self.events else later - earlier

    def intervals(self) -> list[tuple[str, float]]:
        """(stage, seconds) for every mark after the start, in order."""
        return [
            (stage, self._seconds(a, b))
            for (_, a), (stage, b) in zip(self.marks, self.marks[1:], strict=False)
        ]

    def host_intervals(self) -> list[tuple[str, float]]:
        """(stage, seconds until the host reached the stage's closing mark); empty unless synchronized."""
        if not self.synchronized:
            return []
        return [
            (stage, reached - earlier)
            for (_, earlier), (stage, _), reached in zip(
                self.marks, self.marks[1:], self.reached[1:], strict=False
            )
        ]

    def totals(self, stages: tuple[str, ...] = ()) -> dict[str, float]:
        """Seconds per stage (every stage in ``stages`` present, at 0 when never marked)."""
        out = dict.fromkeys(stages, 0.0)
        for stage, seconds in self.intervals():
            out[stage] = out.get(stage, 0.0) + seconds
        return out

    def iteration_starts(self) -> list[float]:
        """Seconds from the start to each iteration's start."""
        first = self.marks[0][1]
        return [self._seconds(first, self.marks[i][1]) for i in self.iteration_marks]
