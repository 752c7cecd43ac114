"""Per-trial telemetry: what the machine, the trial's process and the GPUs did while one trial ran."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from harness.gpu_readings import decode_reasons, read_gpus, reasons_that_matter
from harness.process_usage import USAGE_KEY as USAGE_KEY  # how a trial's row gets its worker's usage
from harness.process_usage import ProcessUsage, own_usage, usage_of_pid
from harness.process_usage import usage_from as usage_from

PROC_STAT_FIELDS = tuple("user nice system idle iowait irq softirq steal guest guest_nice".split())
BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq")  # guest time is already inside user and nice
TOTAL_FIELDS = (*BUSY_FIELDS, "idle", "iowait", "steal")

# Steal as a share of busy + steal (idle CPUs accrue none); 3% is about three standard deviations of one fit.
STEAL_FLAG_SHARE = 0.03
# A clock-limiting policy active for 1% of the trial costs at most ~1% of its device time.
VIOLATION_FLAG_SHARE = 0.01

FIELD_TYPES: dict[str, type] = {
    **dict.fromkeys(
        ("cpu_logical", "worker_voluntary_switches", "worker_involuntary_switches", "gpu_count"), int
    ),
    **dict.fromkeys(("cpu_times_source", "cpu_mhz_source", "worker_usage_source", "gpu_source"), str),
    **dict.fromkeys(
        (
            *("telemetry_seconds", "load1_start", "cpu_mhz_start", "cpu_mhz_end"),
            *(f"cpu_{name}_share" for name in ("busy", "iowait", "steal")),
            *(f"worker_{name}" for name in ("user_s", "system_s", "children_user_s", "children_system_s")),
        ),
        float,
    ),
}
GPU_READINGS = {"sm_clock_mhz": float, "mem_clock_mhz": float, "temperature_c": float, "power_w": float}
GPU_FIELD_TYPES: dict[str, type] = {
    **{
        f"{name}_{end}": kind
        for end in ("start", "end")
        for name, kind in {**GPU_READINGS, "throttle_mask": int, "throttle_reasons": str}.items()
    },
    **dict.fromkeys(("power_violation_s", "thermal_violation_s", "energy_j"), float),
}
_GPU_KEY = re.compile(r"^gpu(\d+)_(.+)$")


def field_type(key: str) -> type | None:
    """The type a row's telemetry field holds."""
    match = _GPU_KEY.match(key)
    return GPU_FIELD_TYPES.get(match.group(2)) if match else FIELD_TYPES.get(key)


# --- machine CPU --------------------------------------------------------------------------------------------


def parse_proc_stat(text: str) -> dict[str, int] | None:
    """The machine-wide ``cpu`` line of ``/proc/stat`` as counters (clock ticks); None if absent or garbled."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            try:
                values = [int(v) for v in line.split()[1:]]
            except ValueError:
                return None
            if len(values) < 4:
                return None
            return dict(zip(PROC_STAT_FIELDS, values, strict=False))  # older kernels have fewer
    return None


def read_cpu_times() -> tuple[dict[str, float] | None, str | None]:
    """Machine-wide CPU time counters and their source (``proc_stat`` or ``psutil``); (None, None) if neither."""
    try:
        parsed = parse_proc_stat(Path("/proc/stat").read_text())
        if parsed is not None:
            return {k: float(v) for k, v in parsed.items()}, "proc_stat"
    except OSError:
        pass
    try:
        return {k: float(v) for k, v in psutil.cpu_times()._asdict().items()}, "psutil"
    except Exception:  # noqa: BLE001 - psutil missing or unsupported here: unreadable
        return None, None


def cpu_shares(start: dict[str, float] | None, end: dict[str, float] | None) -> dict[str, float | None]:
    """Busy, iowait and steal as fractions of all CPU time between two counter readings."""
    shares: dict[str, float | None] = {"busy": None, "iowait": None, "steal": None}
    if start is None or end is None:
        return shares
    deltas = {k: end[k] - start[k] for k in TOTAL_FIELDS if k in start and k in end}
    valid = {k: d for k, d in deltas.items() if d >= 0}
    total = sum(valid.values())
    if total <= 0 or any(k not in deltas for k in ("user", "system", "idle")):
        return shares
    shares["busy"] = sum(valid.get(k, 0.0) for k in BUSY_FIELDS) / total
    for name in ("iowait", "steal"):
        if name in valid:
            shares[name] = valid[name] / total
    return shares


def load_average_1min() -> float | None:
    try:
        return float(os.getloadavg()[0])
    except (OSError, AttributeError):
        return None


def read_cpu_mhz(cores: Iterable[int] | None = None) -> tuple[float | None, str | None]:
    """Mean current clock (MHz) of ``cores`` (default: all) and its source; (None, None) where unreadable."""
    try:
        clocks = [f.current for f in psutil.cpu_freq(percpu=True)]  # cpufreq, else /proc/cpuinfo, per core
    except Exception:  # noqa: BLE001 - unsupported here: unreadable
        return None, None
    if cores is not None and len(clocks) == os.cpu_count():  # one reading per core, in core order
        clocks = [clocks[core] for core in set(cores) if core < len(clocks)]
    clocks = [mhz for mhz in clocks if mhz > 0]
    return (round(sum(clocks) / len(clocks), 1), "psutil") if clocks else (None, None)


# --- snapshots and the row -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """Everything read at one instant: machine CPU counters, load, clock, GPUs, and optionally a process."""

    monotonic_ns: int
    cpu_logical: int | None
    cpu_times: dict[str, float] | None
    cpu_times_source: str | None
    load1: float | None
    cpu_mhz: float | None
    cpu_mhz_source: str | None
    gpu_source: str | None
    gpus: tuple[dict[str, Any], ...]
    usage: ProcessUsage


def snapshot(
    process: int | str | None = None,
    cores: Iterable[int] | None = None,
    gpu_indices: Iterable[int] | None = None,
) -> Snapshot:
    """Read everything now."""
    usage = own_usage() if process == "self" else usage_of_pid(process) if process else ProcessUsage()
    cpu_times, cpu_source = read_cpu_times()
    mhz, mhz_source = read_cpu_mhz(cores)
    gpu_source, gpus = read_gpus(gpu_indices)
    return Snapshot(
        monotonic_ns=time.monotonic_ns(),
        cpu_logical=os.cpu_count(),
        cpu_times=cpu_times,
        cpu_times_source=cpu_source,
        load1=load_average_1min(),
        cpu_mhz=mhz,
        cpu_mhz_source=mhz_source,
        gpu_source=gpu_source,
        gpus=tuple(gpus),
        usage=usage,
    )


def trial_fields(start: Snapshot, end: Snapshot, usage: ProcessUsage | None = None) -> dict[str, Any]:
    """The flat row of one trial from its two snapshots."""
    used = usage if usage is not None else end.usage.minus(start.usage)
    shares = cpu_shares(start.cpu_times, end.cpu_times)
    row: dict[str, Any] = {
        "telemetry_seconds": round((end.monotonic_ns - start.monotonic_ns) / 1e9, 6),
        "cpu_logical": start.cpu_logical,
        "cpu_busy_share": _rounded(shares["busy"]),
        "cpu_iowait_share": _rounded(shares["iowait"]),
        "cpu_steal_share": _rounded(shares["steal"]),
        "cpu_times_source": start.cpu_times_source
        if start.cpu_times_source == end.cpu_times_source
        else None,
        "load1_start": start.load1,
        "cpu_mhz_start": start.cpu_mhz,
        "cpu_mhz_end": end.cpu_mhz,
        "cpu_mhz_source": start.cpu_mhz_source or end.cpu_mhz_source,
        **{f"worker_{k}": _rounded(getattr(used, k)) for k in ("user_s", "system_s", "children_user_s")},
        "worker_children_system_s": _rounded(used.children_system_s),
        "worker_voluntary_switches": used.voluntary_switches,
        "worker_involuntary_switches": used.involuntary_switches,
        "worker_usage_source": used.source,
        "gpu_source": start.gpu_source or end.gpu_source,
        "gpu_count": None,
    }
    first = {gpu["index"]: gpu for gpu in start.gpus}
    last = {gpu["index"]: gpu for gpu in end.gpus}
    indices = sorted(set(first) | set(last))
    if start.gpu_source is not None or end.gpu_source is not None:
        row["gpu_count"] = len(indices)
    for index in indices:
        row.update(_gpu_fields(index, first.get(index, {}), last.get(index, {})))
    return row


def _gpu_fields(index: int, start: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for when, reading in (("start", start), ("end", end)):
        for name in (*GPU_READINGS, "throttle_mask"):
            fields[f"gpu{index}_{name}_{when}"] = reading.get(name)
        mask = reading.get("throttle_mask")
        fields[f"gpu{index}_throttle_reasons_{when}"] = (
            None if mask is None else "+".join(decode_reasons(mask))
        )

    def delta(name: str, scale: float) -> float | None:
        a, b = start.get(name), end.get(name)
        return None if a is None or b is None or b < a else round((b - a) * scale, 6)

    fields[f"gpu{index}_power_violation_s"] = delta("power_violation_ns", 1e-9)
    fields[f"gpu{index}_thermal_violation_s"] = delta("thermal_violation_ns", 1e-9)
    fields[f"gpu{index}_energy_j"] = delta("energy_mj", 1e-3)
    return fields


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


# --- flags ---------------------------------------------------------------------------------------------------


def steal_of_wanted(row: dict[str, Any]) -> float | None:
    """The share of the CPU time a trial's machine wanted (busy + steal) that steal took; None unrecorded."""
    busy, steal = row.get("cpu_busy_share"), row.get("cpu_steal_share")
    if busy is None or steal is None or not busy + steal > 0:
        return None
    return float(steal) / (float(busy) + float(steal))


def flags(row: dict[str, Any]) -> list[str]:
    """Why this trial's figure may have been moved by its machine, one reason per entry ([] when clean)."""
    found: list[str] = []
    seconds = row.get("telemetry_seconds")
    for key in sorted(row, key=_gpu_sort_key):
        match = _GPU_KEY.match(key)
        if not match or row[key] is None:
            continue
        index, field = match.groups()
        if field in ("throttle_mask_start", "throttle_mask_end"):
            matter = reasons_that_matter(int(row[key]))
            if matter:
                when = field.rsplit("_", 1)[1]
                found.append(f"gpu{index} reported {'+'.join(matter)} at the trial's {when}")
        elif field in ("power_violation_s", "thermal_violation_s") and seconds:
            share = row[key] / seconds
            if share > VIOLATION_FLAG_SHARE:
                policy = field.split("_", 1)[0]
                found.append(
                    f"gpu{index} was held down by {policy} policy for {row[key]:.2f} s ({share:.1%} of the trial)"
                )
    wanted = steal_of_wanted(row)
    if wanted is not None and wanted > STEAL_FLAG_SHARE:
        found.append(
            f"CPU steal took {wanted:.1%} of the CPU time wanted ({row['cpu_steal_share']:.1%} of all CPU time; "
            f"flagged above {STEAL_FLAG_SHARE:.0%})"
        )
    load, cores = row.get("load1_start"), row.get("cpu_logical")
    if load is not None and cores and load > cores:
        found.append(f"1-minute load {load:.2f} at the start, above the {cores} logical cores")
    return found


def _gpu_sort_key(key: str) -> tuple[int, str]:
    match = _GPU_KEY.match(key)
    return (int(match.group(1)), match.group(2)) if match else (-1, key)
