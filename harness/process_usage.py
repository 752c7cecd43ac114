"""How much CPU a trial's process used: its own and its reaped children's time, and its context switches."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from dataclasses import astuple, dataclass, replace
from pathlib import Path
from typing import Any

import psutil


@dataclass(frozen=True)
class ProcessUsage:
    """CPU time (s) of a process and of its reaped children, and its context switches, with their source."""

    user_s: float | None = None
    system_s: float | None = None
    children_user_s: float | None = None
    children_system_s: float | None = None
    voluntary_switches: int | None = None
    involuntary_switches: int | None = None
    source: str | None = None

    def minus(self, earlier: ProcessUsage) -> ProcessUsage:
        """The usage between ``earlier`` and this reading (None where either is None)."""

        pairs = zip(astuple(self)[:-1], astuple(earlier)[:-1], strict=True)
        deltas = [None if a is None or b is None else a - b for a, b in pairs]
        return ProcessUsage(*deltas, self.source if self.source == earlier.source else None)


USAGE_KEY = "_worker_usage"  # how a worker's whole-life usage travels back inside its result


def usage_from(record: dict[str, Any] | None) -> ProcessUsage | None:
    """A ``ProcessUsage`` from its JSON form (what ``harness.isolation`` attaches under ``USAGE_KEY``)."""
    return None if record is None else ProcessUsage(**record)


def own_usage() -> ProcessUsage:
    """The calling process's usage (all its threads) and its reaped children's, from ``getrusage``."""
    import resource  # Unix only: imported where a process reads its own usage

    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    switches = (me.ru_nvcsw + children.ru_nvcsw, me.ru_nivcsw + children.ru_nivcsw)
    return ProcessUsage(
        me.ru_utime, me.ru_stime, children.ru_utime, children.ru_stime, *switches, "getrusage"
    )


def usage_of_pid(pid: int) -> ProcessUsage:
    """Another process's usage so far, through ``psutil``."""
    try:
        times = psutil.Process(pid).cpu_times()
    except Exception:  # noqa: BLE001 - no psutil, no such process, no permission: unreadable
        return ProcessUsage()
    voluntary, involuntary = _thread_switches(pid)
    return ProcessUsage(
        times.user, times.system, times.children_user, times.children_system, voluntary, involuntary, "psutil"
    )


def _thread_switches(pid: int) -> tuple[int | None, int | None]:
    """Context switches summed over a process's threads (``psutil`` counts only the main thread's)."""
    counts = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            text = (task / "status").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        found = re.findall(r"^(?:voluntary|nonvoluntary)_ctxt_switches:\s*(\d+)", text, re.M)
        if len(found) != 2:
            return None, None
        counts.append([int(n) for n in found])
    if counts:
        return sum(c[0] for c in counts), sum(c[1] for c in counts)
    try:
        switches = psutil.Process(pid).num_ctx_switches()
    except Exception:  # noqa: BLE001 - unreadable
        return None, None
    return switches.voluntary, switches.involuntary


class Cancelled(Exception):
    """The wait was called off (``wait_and_reap``'s ``cancel`` was set) before the child exited."""


def wait_and_reap(
    process: subprocess.Popen,
    timeout_s: float | None = None,
    poll_s: float = 0.01,
    cancel: threading.Event | None = None,
) -> ProcessUsage:
    """Wait for a child started with ``subprocess.Popen`` to exit, reap it."""
    pid = process.pid
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    if not (hasattr(os, "waitid") and hasattr(os, "WNOWAIT")):
        process.wait(timeout_s)
        return ProcessUsage()
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if deadline is not None and time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(process.args, timeout_s)
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"process {pid} called off")
        time.sleep(poll_s)
    return reap(process)


def reap(process: subprocess.Popen) -> ProcessUsage:
    """Reap a child that has exited but is not yet reaped."""
    times = usage_of_pid(process.pid)
    _, status, rusage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return replace(
        times, voluntary_switches=rusage.ru_nvcsw, involuntary_switches=rusage.ru_nivcsw, source="wait4"
    )
