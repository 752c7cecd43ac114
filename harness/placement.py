"""CPU placement: which cores a trial's worker and the parent run on, and the worker's thread counts."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, replace
from itertools import groupby
from typing import Any

import psutil
import torch

PLACEMENT_ENV = "BENCH_CPU_PLACEMENT"
CPUS_ACCEPTED = "auto, or a list of cores such as 2-7 or 2,3,5-6"
MIN_CORES_TO_KEEP_APART = 3
_ITEM = re.compile(r"^(\d+)(?:-(\d+))?$", re.ASCII)  # ASCII digits: int() also reads "٠" as 0
# Core numbers past this name no machine (Linux builds for at most 8192 CPUs): refused before a range of them
# is expanded, which at 0-999999999 took 24 GB.
MAX_CORE_INDEX = 65_535
THREAD_FIELDS = ("torch_threads", "interop_threads", "omp_threads", "mkl_threads")


@dataclass(frozen=True)
class Placement:
    """Where a fit runs: the worker's cores and thread counts, and the parent's cores (the same every trial)."""

    requested: str
    parent_cores: tuple[int, ...]
    worker_cores: tuple[int, ...]
    torch_threads: int
    interop_threads: int
    omp_threads: int
    mkl_threads: int
    reason: str

    def __post_init__(self) -> None:
        for name in ("parent_cores", "worker_cores"):  # lists, as read back from JSON
            object.__setattr__(self, name, tuple(int(c) for c in getattr(self, name)))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Placement:
        return cls(**{k: record[k] for k in cls.__dataclass_fields__})

    def brief(self) -> str:
        """The console's line: the cores and the torch threads; the report gives the reason too."""
        return (
            f"worker on {_cores(self.worker_cores)} ({self.torch_threads} torch threads), "
            f"parent on {_cores(self.parent_cores)}"
        )

    def describe(self) -> str:
        """One line for the console and the report's protocol paragraph."""
        return (
            f"worker on {_cores(self.worker_cores)} (torch {self.torch_threads} intra-op / "
            f"{self.interop_threads} inter-op threads, OpenMP {self.omp_threads}, MKL {self.mkl_threads}), "
            f"parent on {_cores(self.parent_cores)}: {self.reason}"
        )


def format_cores(cores: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` → ``0-2,5`` (the kernel's ``Cpus_allowed_list`` spelling)."""
    runs = groupby(enumerate(sorted(set(cores))), lambda pair: pair[1] - pair[0])
    spans = [[core for _, core in run] for _, run in runs]
    return ",".join(str(s[0]) if len(s) == 1 else f"{s[0]}-{s[-1]}" for s in spans)


def _cores(cores: Iterable[int]) -> str:
    ordered = sorted(set(cores))
    return f"core {ordered[0]}" if len(ordered) == 1 else f"cores {format_cores(ordered)}"


def is_placement_form(text: str) -> bool:
    """Whether ``text`` is what ``--cpus`` takes in form."""
    text = str(text).strip().lower()
    if text in ("auto", "none"):
        return True
    try:
        parse_core_list(text)  # bounded before any range is expanded
    except ValueError:
        return False
    return True


def parse_core_list(text: str) -> tuple[int, ...]:
    """``2,3,5-6`` → ``(2, 3, 5, 6)``; ``ValueError`` (one line) on anything else."""
    items = [item.strip() for item in str(text).split(",")]
    cores: set[int] = set()
    for item in items:
        match = _ITEM.match(item)
        if not match:
            raise ValueError(f"--cpus '{text}' is not a core list; use {CPUS_ACCEPTED}")
        low, high = int(match.group(1)), int(match.group(2) or match.group(1))
        if high > MAX_CORE_INDEX:
            raise ValueError(
                f"--cpus '{text}': core {high} is past any machine's (core numbers run to {MAX_CORE_INDEX} at most)"
            )
        if high < low:
            raise ValueError(f"--cpus '{text}': the range {item} runs backwards; write {high}-{low}")
        cores.update(range(low, high + 1))
    return tuple(sorted(cores))


def allowed_cores() -> tuple[int, ...]:
    """The cores this process may run on (its affinity mask), ascending."""
    if not hasattr(os, "sched_getaffinity"):
        raise ValueError("--cpus: CPU placement needs Linux (os.sched_getaffinity is not available here)")
    return tuple(sorted(os.sched_getaffinity(0)))


def choose_placement(cpus: str = "auto", allowed: Iterable[int] | None = None) -> Placement:
    """The placement for ``--cpus`` (``auto`` or a core list) within ``allowed``."""
    pool = tuple(sorted(set(allowed))) if allowed is not None else allowed_cores()
    if not pool:
        raise ValueError("--cpus: this process may use no core at all")
    text = str(cpus).strip()
    if text.lower() == "auto":
        worker, parent, reason = _auto(pool)
        requested = "auto"
    else:
        worker = parse_core_list(text)
        refused = sorted(set(worker) - set(pool))
        if refused:
            raise ValueError(
                f"--cpus {text}: core(s) {format_cores(refused)} are not among those this process may use "
                f"({format_cores(pool)}); use {CPUS_ACCEPTED} within them"
            )
        rest = tuple(c for c in pool if c not in worker)
        if rest:
            parent = rest
            reason = f"--cpus {text} as given; the parent keeps the other allowed cores"
        else:
            parent = worker[:1]
            reason = f"--cpus {text} as given takes every allowed core; the parent shares core {worker[0]}"
        requested = text
    return Placement(requested, parent, worker, *[len(worker)] * 4, reason)


def _auto(pool: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...], str]:
    if len(pool) == 1:
        return pool, pool, f"auto: one allowed core ({pool[0]}), so nothing to keep apart; both share it"
    if len(pool) < MIN_CORES_TO_KEEP_APART:
        return (
            pool,
            pool[:1],
            f"auto: only {len(pool)} allowed cores ({format_cores(pool)}); the worker keeps them all, since "
            f"the parent only waits during a trial, and the parent is pinned to core {pool[0]}, which it shares",
        )
    return (
        pool[1:],
        pool[:1],
        f"auto: the lowest allowed core ({pool[0]}) for the parent, the other {len(pool) - 1} for the worker",
    )


def split_placement(placement: Placement, parts: int) -> list[Placement]:
    """The worker cores cut into ``parts`` equal contiguous shares."""
    cores = placement.worker_cores
    if len(cores) < parts:
        raise ValueError(
            f"{parts} workers at once need {parts} worker cores or more; the placement has {len(cores)}"
        )
    size = len(cores) // parts
    return [
        replace(
            placement,
            worker_cores=cores[k * size : (k + 1) * size],
            **dict.fromkeys(THREAD_FIELDS, size),
            reason=f"{placement.reason}; share {k + 1} of {parts} of the worker cores",
        )
        for k in range(parts)
    ]


def worker_environment(placement: Placement) -> dict[str, str]:
    """Environment entries for the worker: thread counts read at library load, and the placement itself."""
    return {
        "OMP_NUM_THREADS": str(placement.omp_threads),
        "MKL_NUM_THREADS": str(placement.mkl_threads),
        PLACEMENT_ENV: json.dumps(placement.to_dict()),
    }


def set_process_affinity(cores: Iterable[int]) -> None:
    """Pin every thread of this process (not only the calling one) to ``cores``; new threads inherit it."""
    mask = set(cores)
    done: set[int] = set()
    while True:  # a thread started during the loop is caught on the next pass
        pending = [thread.id for thread in psutil.Process().threads() if thread.id not in done]
        if not pending:
            return
        for tid in pending:
            with suppress(ProcessLookupError):  # the thread ended meanwhile
                os.sched_setaffinity(tid, mask)
            done.add(tid)


def apply_from_environment(environ: dict[str, str] | None = None) -> dict[str, Any] | None:
    """Place this worker as its parent's ``worker_environment`` says: all its threads' affinity, then torch's
    thread counts. None (nothing done) where the environment holds no placement."""
    text = (os.environ if environ is None else environ).get(PLACEMENT_ENV)
    if not text:
        return None
    placement = Placement.from_dict(json.loads(text))
    set_process_affinity(placement.worker_cores)
    torch.set_num_threads(placement.torch_threads)
    try:
        torch.set_num_interop_threads(placement.interop_threads)
        interop_set = True
    except RuntimeError:
        interop_set = False
    return {
        "placed_cores": format_cores(os.sched_getaffinity(0)),
        "placed_torch_threads": torch.get_num_threads(),
        "placed_interop_threads": torch.get_num_interop_threads(),
        "placed_interop_set": interop_set,
    }


@contextmanager
def parent_pinned(placement: Placement) -> Iterator[None]:
    """Every thread of the calling (parent) process pinned to its cores for the block, then restored."""
    previous = frozenset(os.sched_getaffinity(0))
    set_process_affinity(placement.parent_cores)
    try:
        yield
    finally:
        set_process_affinity(previous)
