"""Per-trial telemetry: what the machine, the trial's process and the GPUs did while one trial ran."""

from __future__ import annotations

import math
import os
import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

import psutil

from harness.env import SMI_FIGURES, query_smi

BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq")  # guest time is already inside user and nice
TOTAL_FIELDS = (*BUSY_FIELDS, "idle", "iowait", "steal")

# Steal as a share of busy + steal (idle CPUs accrue none); 3% is about three standard deviations of one fit.
STEAL_FLAG_SHARE = 0.03
# A clock-limiting policy active for 1% of the trial costs at most ~1% of its device time.
VIOLATION_FLAG_SHARE = 0.01

USAGE_FIELDS = ("user_s", "system_s", "children_user_s", "children_system_s")
FIELD_TYPES: dict[str, type] = {
    **dict.fromkeys(
        ("cpu_logical", "worker_voluntary_switches", "worker_involuntary_switches", "gpu_count"), int
    ),
    **dict.fromkeys(("cpu_times_source", "cpu_mhz_source", "worker_usage_source", "gpu_source"), str),
    **dict.fromkeys(
        (
            *("telemetry_seconds", "load1_start", "cpu_mhz_start", "cpu_mhz_end"),
            *(f"cpu_{name}_share" for name in ("busy", "iowait", "steal")),
            *(f"worker_{name}" for name in USAGE_FIELDS),
        ),
        float,
    ),
}
GPU_READINGS = {"sm_clock_mhz": float, "mem_clock_mhz": float, "temperature_c": float, "power_w": float}
# Counters read at both ends of a trial: the row's field, and the scale of their difference to its unit.
GPU_COUNTERS = {
    "power_violation_ns": ("power_violation_s", 1e-9),
    "thermal_violation_ns": ("thermal_violation_s", 1e-9),
    "energy_mj": ("energy_j", 1e-3),
}
GPU_FIELD_TYPES: dict[str, type] = {
    **{
        f"{name}_{end}": kind
        for end in ("start", "end")
        for name, kind in {**GPU_READINGS, "throttle_mask": int, "throttle_reasons": str}.items()
    },
    **{field: float for field, _ in GPU_COUNTERS.values()},
}
_GPU_KEY = re.compile(r"^gpu(\d+)_(.+)$")


def field_type(key: str) -> type | None:
    """The type a row's telemetry field holds."""
    match = _GPU_KEY.match(key)
    return GPU_FIELD_TYPES.get(match.group(2)) if match else FIELD_TYPES.get(key)


# --- GPU readings: NVML, else nvidia-smi ----------------------------------------------------------------------

_REASON_NAMES = (
    "gpu_idle applications_clocks_setting sw_power_cap hw_slowdown sync_boost sw_thermal_slowdown"
    " hw_thermal_slowdown hw_power_brake_slowdown display_clock_setting board_limit reliability"
)
THROTTLE_REASONS = {1 << bit: name for bit, name in enumerate(_REASON_NAMES.split())}
# Settings and idleness, not events that take speed from a running trial; every other bit (power, thermal,
# hardware slowdown, sync boost holding this GPU to a slower one, board and reliability limits, and bits this
# table does not know) is one that matters.
BENIGN_REASONS = 0x1 | 0x2 | 0x100
SMI_FIELDS = ("index", "clocks.sm", "clocks.mem", "temperature.gpu", "power.draw")
SMI_REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")


def decode_reasons(mask: int) -> list[str]:
    """Names of the set bits of a clock-event (throttle) reasons mask, unknown bits as ``unknown_0x…``."""
    bits = (1 << n for n in range(mask.bit_length()) if mask >> n & 1)
    return [THROTTLE_REASONS.get(bit, f"unknown_{bit:#x}") for bit in bits]


def reasons_that_matter(mask: int) -> list[str]:
    """The names of the bits of ``mask`` that take speed from a running trial (not idle or settings)."""
    return decode_reasons(mask & ~BENIGN_REASONS)


def _load_nvml() -> Any:
    """The ``pynvml`` module, or None when it does not import."""
    try:
        import pynvml  # imported at the first reading: a CPU-only run never loads it
    except ImportError:
        return None
    return pynvml


def _ask(read: Any, *args: Any) -> Any:
    """``read(*args)``, or None when it raises (one field NVML cannot read is null, not a failed snapshot)."""
    try:
        return read(*args)
    except Exception:  # noqa: BLE001 - NVMLError and its kin, or a function this pynvml lacks
        return None


def _nvml_readings(indices: set[int] | None) -> list[dict[str, Any]] | None:
    nvml = _load_nvml()
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no library, no permission: fall back
        return None
    try:
        count = nvml.nvmlDeviceGetCount()
        return [
            _nvml_device(nvml, index, nvml.nvmlDeviceGetHandleByIndex(index))
            for index in range(count)
            if indices is None or index in indices
        ]
    except Exception:  # noqa: BLE001 - NVML broke mid-way: fall back rather than keep half a reading
        return None
    finally:
        _ask(nvml.nvmlShutdown)


def _nvml_device(nvml: Any, index: int, handle: Any) -> dict[str, Any]:
    reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    power_mw = _float(_ask(nvml.nvmlDeviceGetPowerUsage, handle))
    policies = {"power": nvml.NVML_PERF_POLICY_POWER, "thermal": nvml.NVML_PERF_POLICY_THERMAL}
    return {
        "index": index,
        "sm_clock_mhz": _float(_ask(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)),
        "mem_clock_mhz": _float(_ask(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM)),
        "temperature_c": _float(_temperature(nvml, handle)),
        "power_w": None if power_mw is None else power_mw / 1000.0,
        "throttle_mask": None if reasons is None else _int(_ask(reasons, handle)),
        **{  # cumulative time (ns) the clocks were held down by each policy
            f"{name}_violation_ns": _int(
                getattr(_ask(nvml.nvmlDeviceGetViolationStatus, handle, policy), "violationTime", None)
            )
            for name, policy in policies.items()
        },
        "energy_mj": _float(_ask(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)),
    }


def _temperature(nvml: Any, handle: Any) -> Any:
    """The GPU die temperature (the older call first: the newer one needs a newer driver)."""
    for name in ("nvmlDeviceGetTemperature", "nvmlDeviceGetTemperatureV"):
        read = getattr(nvml, name, None)
        value = None if read is None else _ask(read, handle, nvml.NVML_TEMPERATURE_GPU)
        if value is not None:
            return value
    return None


def _smi_readings(indices: set[int] | None) -> list[dict[str, Any]] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    for reason_field in SMI_REASON_FIELDS:  # the newer name first; older drivers know only the second
        text = query_smi([*SMI_FIELDS, reason_field])
        if text is not None:
            break
    devices = []
    for line in (text or "").splitlines():
        cells = [c.strip() for c in line.split(",")]
        index = _int(cells[0]) if len(cells) == len(SMI_FIELDS) + 1 else None
        if index is None or (indices is not None and index not in indices):
            continue
        figures = dict(zip(SMI_FIGURES, map(_float, cells[1:5]), strict=True))
        devices.append(
            {"index": index, **figures, "throttle_mask": _int(cells[5]), **dict.fromkeys(GPU_COUNTERS)}
        )
    return devices or None


def read_gpus(indices: Iterable[int] | None = None) -> tuple[str | None, list[dict[str, Any]]]:
    """(source, one reading per device): NVML, else ``nvidia-smi``, else (None, [])."""
    wanted = None if indices is None else set(indices)
    for source, reader in (("nvml", _nvml_readings), ("nvidia-smi", _smi_readings)):
        devices = reader(wanted)
        if devices is not None:
            return source, devices
    return None, []


def _float(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _int(value: Any) -> int | None:
    """A whole number, from an int or from text in decimal or ``0x…`` (as nvidia-smi prints masks)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    try:
        return int(text, 16 if text.startswith("0x") else 10)
    except ValueError:
        return None


# --- the trial's process -------------------------------------------------------------------------------------


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
    except Exception:  # noqa: BLE001 - no such process, no permission: unreadable
        return ProcessUsage()
    return ProcessUsage(*times[:4], *_thread_switches(pid), "psutil")


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
        return tuple(psutil.Process(pid).num_ctx_switches())
    except Exception:  # noqa: BLE001 - unreadable
        return None, None


# --- machine CPU --------------------------------------------------------------------------------------------


def read_cpu_times() -> tuple[dict[str, float] | None, str | None]:
    """Machine-wide CPU time counters (``/proc/stat`` on Linux) and their source; (None, None) if unreadable."""
    try:
        return psutil.cpu_times()._asdict(), "psutil"
    except Exception:  # noqa: BLE001 - unsupported here: unreadable
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
    cpu_times, mhz, (gpu_source, gpus) = read_cpu_times(), read_cpu_mhz(cores), read_gpus(gpu_indices)
    try:
        load1: float | None = float(os.getloadavg()[0])
    except (OSError, AttributeError):
        load1 = None
    return Snapshot(
        time.monotonic_ns(), os.cpu_count(), *cpu_times, load1, *mhz, gpu_source, tuple(gpus), usage
    )


def trial_fields(start: Snapshot, end: Snapshot, usage: ProcessUsage | None = None) -> dict[str, Any]:
    """The flat row of one trial from its two snapshots (``usage``: a worker's, where it sent its own)."""
    used = usage if usage is not None else end.usage.minus(start.usage)
    shares = cpu_shares(start.cpu_times, end.cpu_times)
    same_source = start.cpu_times_source == end.cpu_times_source
    row: dict[str, Any] = {
        "telemetry_seconds": round((end.monotonic_ns - start.monotonic_ns) / 1e9, 6),
        "cpu_logical": start.cpu_logical,
        **{f"cpu_{name}_share": _rounded(share) for name, share in shares.items()},
        "cpu_times_source": start.cpu_times_source if same_source else None,
        "load1_start": start.load1,
        "cpu_mhz_start": start.cpu_mhz,
        "cpu_mhz_end": end.cpu_mhz,
        "cpu_mhz_source": start.cpu_mhz_source or end.cpu_mhz_source,
        **{f"worker_{name}": _rounded(getattr(used, name)) for name in USAGE_FIELDS},
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
        at = {"start": first.get(index, {}), "end": last.get(index, {})}
        for when, reading in at.items():
            for name in (*GPU_READINGS, "throttle_mask"):
                row[f"gpu{index}_{name}_{when}"] = reading.get(name)
            mask = reading.get("throttle_mask")
            row[f"gpu{index}_throttle_reasons_{when}"] = (
                None if mask is None else "+".join(decode_reasons(mask))
            )
        for name, (field, scale) in GPU_COUNTERS.items():
            a, b = at["start"].get(name), at["end"].get(name)
            row[f"gpu{index}_{field}"] = (
                None if a is None or b is None or b < a else round((b - a) * scale, 6)
            )
    return row


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
    gpu_keys = sorted(
        (int(m[1]), m[2], key) for key in row if (m := _GPU_KEY.match(key)) and row[key] is not None
    )
    for index, field, key in gpu_keys:
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
