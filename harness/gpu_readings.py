"""What the GPUs read at one instant: clocks, temperature, power, clock-event reasons and counters."""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterable
from typing import Any

from harness.env import SMI_FIGURES, _run

_REASON_NAMES = (
    "gpu_idle applications_clocks_setting sw_power_cap hw_slowdown sync_boost sw_thermal_slowdown"
    " hw_thermal_slowdown hw_power_brake_slowdown display_clock_setting board_limit reliability"
)
THROTTLE_REASONS = {1 << bit: name for bit, name in enumerate(_REASON_NAMES.split())}
# Settings and idleness, not events that take speed from a running trial; every other bit (power, thermal,
# hardware slowdown, sync boost holding this GPU to a slower one, board and reliability limits, and bits this
# table does not know) is one that matters.
BENIGN_REASONS = 0x1 | 0x2 | 0x100


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
    return {
        "index": index,
        "sm_clock_mhz": _float(_ask(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)),
        "mem_clock_mhz": _float(_ask(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM)),
        "temperature_c": _float(_temperature(nvml, handle)),
        "power_w": None if power_mw is None else power_mw / 1000.0,
        "throttle_mask": None if reasons is None else _int(_ask(reasons, handle)),
        "power_violation_ns": _violation(nvml, handle, nvml.NVML_PERF_POLICY_POWER),
        "thermal_violation_ns": _violation(nvml, handle, nvml.NVML_PERF_POLICY_THERMAL),
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


def _violation(nvml: Any, handle: Any, policy: int) -> int | None:
    """Cumulative time (ns) the device's clocks were held down by ``policy``."""
    status = _ask(nvml.nvmlDeviceGetViolationStatus, handle, policy)
    return None if status is None else _int(getattr(status, "violationTime", None))


SMI_FIELDS = ("index", "clocks.sm", "clocks.mem", "temperature.gpu", "power.draw")
NVML_ONLY = ("power_violation_ns", "thermal_violation_ns", "energy_mj")
SMI_REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")


def _run_smi(fields: list[str]) -> str | None:
    """``nvidia-smi --query-gpu=FIELDS`` as CSV without header or units; None when it fails."""
    return _run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])


def _smi_readings(indices: set[int] | None) -> list[dict[str, Any]] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    for reason_field in SMI_REASON_FIELDS:  # the newer name first; older drivers know only the second
        text = _run_smi([*SMI_FIELDS, reason_field])
        if text is not None:
            break
    else:
        return None
    devices = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(SMI_FIELDS) + 1:
            continue
        index = _int(cells[0])
        if index is None or (indices is not None and index not in indices):
            continue
        figures = dict(zip(SMI_FIGURES, map(_float, cells[1:5]), strict=True))
        devices.append(
            {"index": index, **figures, "throttle_mask": _int(cells[5]), **dict.fromkeys(NVML_ONLY)}
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
