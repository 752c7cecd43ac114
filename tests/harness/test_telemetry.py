"""Per-trial telemetry: every field present and typed, null where unreadable.

NVML and nvidia-smi may be absent, failing or printing garbage. Also /proc/stat deltas, throttle-reason
decoding, process accounting, and flags.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from harness import isolation, telemetry
from harness.telemetry import FIELD_TYPES, GPU_FIELD_TYPES, ProcessUsage, Snapshot
from tests import ROOT, child_env

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def assert_typed(row: dict[str, Any]) -> None:
    """Every fixed field and every per-device field present, None or of its type, and JSON-ready."""
    for key, kind in FIELD_TYPES.items():
        assert key in row, key
        assert row[key] is None or (isinstance(row[key], kind) and not isinstance(row[key], bool)), (
            key,
            row[key],
        )
    count = row["gpu_count"] or 0
    gpu_keys = [k for k in row if k.startswith("gpu") and k not in FIELD_TYPES]
    assert len(gpu_keys) == count * len(GPU_FIELD_TYPES)
    for key in gpu_keys:
        index, _, field = key[3:].partition("_")
        assert index.isdigit() and field in GPU_FIELD_TYPES, key
        kind = GPU_FIELD_TYPES[field]
        assert row[key] is None or (isinstance(row[key], kind) and not isinstance(row[key], bool)), (
            key,
            row[key],
        )
    json.dumps(row, allow_nan=False)


# --- fakes ---------------------------------------------------------------------------------------------------


class FakeNvmlError(Exception):
    pass


def fake_nvml(devices: list[dict[str, Any]], fail_init: bool = False, broken: tuple[str, ...] = ()) -> Any:
    """A stand-in for pynvml over mutable per-device readings; a name in ``broken`` raises for every device."""

    def call(name: str, key: str):
        def read(handle: int, *args: Any) -> Any:
            if name in broken:
                raise FakeNvmlError(f"{name}: not supported")
            return devices[handle][key]

        return read

    def init() -> None:
        if fail_init:
            raise FakeNvmlError("Driver Not Loaded")

    return SimpleNamespace(
        NVML_CLOCK_SM=1,
        NVML_CLOCK_MEM=2,
        NVML_TEMPERATURE_GPU=0,
        NVML_PERF_POLICY_POWER=0,
        NVML_PERF_POLICY_THERMAL=1,
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(devices),
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetClockInfo=lambda handle, kind: call("clock", "sm" if kind == 1 else "mem")(handle),
        nvmlDeviceGetTemperature=call("temperature", "temperature"),
        nvmlDeviceGetPowerUsage=call("power", "power_mw"),
        nvmlDeviceGetCurrentClocksEventReasons=call("reasons", "reasons"),
        nvmlDeviceGetTotalEnergyConsumption=call("energy", "energy_mj"),
        nvmlDeviceGetViolationStatus=lambda handle, policy: SimpleNamespace(
            violationTime=call("violation", "power_ns" if policy == 0 else "thermal_ns")(handle)
        ),
    )


def gpu(
    sm: int = 1980, reasons: int = 0x0, power_ns: int = 0, thermal_ns: int = 0, energy_mj: int = 0
) -> dict:
    return {
        "sm": sm,
        "mem": 3201,
        "temperature": 41,
        "power_mw": 120500,
        "reasons": reasons,
        "power_ns": power_ns,
        "thermal_ns": thermal_ns,
        "energy_mj": energy_mj,
    }


@pytest.fixture
def no_nvml(monkeypatch) -> None:
    monkeypatch.setattr(telemetry, "_load_nvml", lambda: None)


@pytest.fixture
def smi_says(monkeypatch):
    """Make nvidia-smi 'exist' and print what the test gives per query (None: it fails)."""

    def install(answer) -> list[list[str]]:
        asked: list[list[str]] = []
        monkeypatch.setattr(telemetry.shutil, "which", lambda name: "/usr/bin/nvidia-smi")

        def run(fields: list[str]) -> str | None:
            asked.append(fields)
            return answer(fields) if callable(answer) else answer

        monkeypatch.setattr(telemetry, "query_smi", run)
        return asked

    return install


def no_smi(monkeypatch) -> None:
    monkeypatch.setattr(telemetry.shutil, "which", lambda name: None)


# --- fields, typed and null where unreadable -----------------------------------------------------------------


@linux
def test_every_field_present_and_typed_on_this_machine() -> None:
    start = telemetry.snapshot("self")
    until = time.monotonic() + 0.05  # /proc/stat counts 10 ms ticks: a shorter loop can see none pass
    while time.monotonic() < until:
        sum(i * i for i in range(10_000))
    row = telemetry.trial_fields(start, telemetry.snapshot("self"))
    assert_typed(row)
    assert row["cpu_times_source"] == "psutil" and row["cpu_busy_share"] is not None
    assert 0.0 <= row["cpu_busy_share"] <= 1.0 and row["cpu_logical"] == os.cpu_count()
    assert row["worker_usage_source"] == "getrusage" and row["worker_user_s"] >= 0.0
    assert row["load1_start"] is not None and row["telemetry_seconds"] > 0


def test_gpu_fields_null_when_neither_nvml_nor_smi_answers(monkeypatch, no_nvml) -> None:
    no_smi(monkeypatch)
    assert telemetry.read_gpus() == (None, [])
    row = telemetry.trial_fields(telemetry.snapshot(), telemetry.snapshot())
    assert_typed(row)
    assert row["gpu_source"] is None and row["gpu_count"] is None
    assert not [k for k in row if k.startswith("gpu") and k[3:4].isdigit()]


SMI_LINES = "0, 1980, 3201, 43, 121.52, 0x0000000000000004\n1, 345, 3201, 30, 70.10, 0x0000000000000001\n"


def test_nvml_failing_to_initialize_falls_back_to_nvidia_smi(monkeypatch, smi_says) -> None:
    monkeypatch.setattr(telemetry, "_load_nvml", lambda: fake_nvml([gpu()], fail_init=True))
    smi_says(SMI_LINES)
    source, devices = telemetry.read_gpus()
    assert source == "nvidia-smi" and [d["index"] for d in devices] == [0, 1]
    assert devices[0]["sm_clock_mhz"] == 1980.0 and devices[0]["power_w"] == 121.52
    assert devices[0]["throttle_mask"] == 0x4 and devices[1]["throttle_mask"] == 0x1
    row = telemetry.trial_fields(telemetry.snapshot(), telemetry.snapshot())
    assert_typed(row)
    assert row["gpu_count"] == 2 and row["gpu0_throttle_reasons_end"] == "sw_power_cap"
    assert row["gpu0_power_violation_s"] is None and row["gpu0_energy_j"] is None  # no counters there


def test_nvml_not_importable_falls_back_and_smi_older_field_name_is_tried(
    monkeypatch, no_nvml, smi_says
) -> None:
    asked = smi_says(lambda fields: None if "clocks_event_reasons.active" in fields else SMI_LINES)
    source, devices = telemetry.read_gpus(indices=[1])
    assert source == "nvidia-smi" and [d["index"] for d in devices] == [1]
    assert [fields[-1] for fields in asked] == [
        "clocks_event_reasons.active",
        "clocks_throttle_reasons.active",
    ]


@pytest.mark.parametrize(
    "garbage",
    ["", "NVIDIA-SMI has failed because it couldn't communicate with the driver.", "a,b\n,,,,,,,\n"],
)
def test_nvml_failing_and_smi_printing_garbage_gives_nulls(monkeypatch, smi_says, garbage: str) -> None:
    monkeypatch.setattr(telemetry, "_load_nvml", lambda: fake_nvml([gpu()], fail_init=True))
    smi_says(garbage)
    assert telemetry.read_gpus() == (None, [])
    row = telemetry.trial_fields(telemetry.snapshot(), telemetry.snapshot())
    assert_typed(row)
    assert row["gpu_source"] is None and row["gpu_count"] is None


def test_smi_cells_it_cannot_read_are_null_one_by_one(no_nvml, smi_says) -> None:
    smi_says("0, [N/A], 3201, 43, [N/A], 0xzz\n")
    source, devices = telemetry.read_gpus()
    assert source == "nvidia-smi"
    assert devices[0]["sm_clock_mhz"] is None and devices[0]["power_w"] is None
    assert devices[0]["throttle_mask"] is None and devices[0]["mem_clock_mhz"] == 3201.0
    row = telemetry.trial_fields(telemetry.snapshot(), telemetry.snapshot())
    assert_typed(row)
    assert row["gpu0_throttle_reasons_start"] is None


def test_nvml_readings_and_counter_deltas_over_the_trial(monkeypatch) -> None:
    devices = [gpu(sm=345, reasons=0x1, energy_mj=1_000_000), gpu(sm=1980, reasons=0x0)]
    monkeypatch.setattr(telemetry, "_load_nvml", lambda: fake_nvml(devices))
    start = telemetry.snapshot()
    devices[0].update(sm=1755, reasons=0x4 | 0x1, power_ns=2_500_000_000, thermal_ns=0, energy_mj=1_250_000)
    end = telemetry.snapshot()
    row = telemetry.trial_fields(start, end)
    assert_typed(row)
    assert row["gpu_source"] == "nvml" and row["gpu_count"] == 2
    assert row["gpu0_sm_clock_mhz_start"] == 345.0 and row["gpu0_sm_clock_mhz_end"] == 1755.0
    assert row["gpu0_power_w_start"] == 120.5 and row["gpu0_temperature_c_end"] == 41.0
    assert row["gpu0_throttle_reasons_start"] == "gpu_idle"
    assert row["gpu0_throttle_reasons_end"] == "gpu_idle+sw_power_cap" and row["gpu0_throttle_mask_end"] == 5
    assert row["gpu0_power_violation_s"] == 2.5 and row["gpu0_thermal_violation_s"] == 0.0
    assert row["gpu0_energy_j"] == 250.0 and row["gpu1_throttle_reasons_end"] == ""


def test_an_nvml_field_that_fails_is_null_and_the_rest_is_kept(monkeypatch) -> None:
    monkeypatch.setattr(telemetry, "_load_nvml", lambda: fake_nvml([gpu()], broken=("power", "violation")))
    row = telemetry.trial_fields(telemetry.snapshot(), telemetry.snapshot())
    assert_typed(row)
    assert row["gpu_source"] == "nvml" and row["gpu0_sm_clock_mhz_start"] == 1980.0
    assert row["gpu0_power_w_start"] is None and row["gpu0_power_violation_s"] is None


def test_gpu_readable_at_start_but_not_at_end_keeps_the_device_with_nulls(monkeypatch, smi_says) -> None:
    devices = [gpu()]
    monkeypatch.setattr(telemetry, "_load_nvml", lambda: fake_nvml(devices))
    start = telemetry.snapshot()
    monkeypatch.setattr(telemetry, "_load_nvml", lambda: None)
    smi_says(None)
    row = telemetry.trial_fields(start, telemetry.snapshot())
    assert_typed(row)
    assert row["gpu_count"] == 1 and row["gpu0_sm_clock_mhz_start"] == 1980.0
    assert row["gpu0_sm_clock_mhz_end"] is None and row["gpu0_energy_j"] is None


# --- CPU time shares ----------------------------------------------------------------------------------------

FIELDS = "user nice system idle iowait irq softirq steal guest guest_nice".split()


def counters(text: str) -> dict[str, float]:
    """CPU time counters as ``/proc/stat``'s ``cpu`` line gives them (older kernels: fewer fields)."""
    return dict(zip(FIELDS, map(float, text.split()), strict=False))


START = counters("100 0 50 800 10 0 0 40 0 0")
END = counters("400 0 150 1200 30 0 20 80 100 0")


def test_cpu_shares_on_a_synthetic_pair_of_readings() -> None:
    shares = telemetry.cpu_shares(START, END)
    # deltas: user 300, system 100, idle 400, iowait 20, softirq 20, steal 40 (guest 100 is inside user)
    total = 300 + 100 + 400 + 20 + 20 + 40
    assert shares["busy"] == pytest.approx((300 + 100 + 20) / total)
    assert shares["iowait"] == pytest.approx(20 / total)
    assert shares["steal"] == pytest.approx(40 / total)


def test_cpu_times_unreadable_parts_are_null(monkeypatch) -> None:
    assert telemetry.cpu_shares(None, END) == {"busy": None, "iowait": None, "steal": None}
    old_kernel = telemetry.cpu_shares(counters("1 0 1 8"), counters("3 0 3 12"))
    assert old_kernel == {"busy": pytest.approx(0.5), "iowait": None, "steal": None}
    shares = telemetry.cpu_shares(START, {**END, "iowait": 5.0})  # a counter that ran backwards
    assert shares["iowait"] is None and shares["steal"] == pytest.approx(40 / (300 + 100 + 400 + 20 + 40))
    assert telemetry.cpu_shares(START, START)["busy"] is None  # no time passed

    def unsupported() -> None:
        raise NotImplementedError("no CPU times here")

    monkeypatch.setattr(telemetry.psutil, "cpu_times", unsupported)
    assert telemetry.read_cpu_times() == (None, None)
    row = telemetry.trial_fields(telemetry.snapshot(), telemetry.snapshot())
    assert row["cpu_busy_share"] is None and row["cpu_times_source"] is None


# --- throttle reasons ----------------------------------------------------------------------------------------


def test_throttle_reasons_are_decoded_from_the_bitmask() -> None:
    assert telemetry.decode_reasons(0) == []
    assert telemetry.decode_reasons(0x1) == ["gpu_idle"]
    assert telemetry.decode_reasons(0x4 | 0x8 | 0x40) == [
        "sw_power_cap",
        "hw_slowdown",
        "hw_thermal_slowdown",
    ]
    assert telemetry.decode_reasons(0x1 | 0x800) == ["gpu_idle", "unknown_0x800"]
    assert telemetry.decode_reasons(0x7FF) == list(telemetry.THROTTLE_REASONS.values())
    assert telemetry.reasons_that_matter(0x1 | 0x2 | 0x100) == []
    assert telemetry.reasons_that_matter(0x1 | 0x20 | 0x80) == [
        "sw_thermal_slowdown",
        "hw_power_brake_slowdown",
    ]


# --- the trial's process -------------------------------------------------------------------------------------

SLEEPS = 200  # each sleep blocks once: a voluntary context switch
BURNER = textwrap.dedent(
    f"""
    import subprocess, sys, threading, time

    def burn(seconds):
        t = time.thread_time()
        while time.thread_time() - t < seconds:
            pass
        for _ in range({SLEEPS}):
            time.sleep(0.001)

    worker = threading.Thread(target=burn, args=(0.3,))
    worker.start()
    worker.join()
    subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time()\\n"
                    "while time.process_time() - t < 0.3: pass\\nfor _ in range({SLEEPS}): time.sleep(0.001)"])
    """
)


@linux
def test_wait_and_reap_accounts_for_threads_that_ended_and_reaped_children() -> None:
    process = subprocess.Popen([sys.executable, "-c", BURNER])
    usage = isolation.wait_and_reap(process, timeout_s=120)
    assert process.returncode == 0 and usage.source == "wait4"
    tick = 0.02  # /proc counts CPU time in 10 ms ticks
    assert usage.user_s + usage.system_s >= 0.3 - tick  # the thread's 0.3 s, though it ended before the exit
    assert usage.children_user_s + usage.children_system_s >= 0.3 - tick  # the grandchild's 0.3 s
    assert usage.voluntary_switches >= 2 * SLEEPS  # the ended thread's and the grandchild's, counted
    assert usage.involuntary_switches >= 0


@linux
def test_wait_and_reap_times_out_leaving_the_child_to_kill_and_reap() -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    with pytest.raises(subprocess.TimeoutExpired):
        isolation.wait_and_reap(process, timeout_s=0.2)
    assert process.returncode is None and Path(f"/proc/{process.pid}").exists()
    process.kill()
    usage = isolation.wait_and_reap(process)
    assert process.returncode == -9 and usage.source == "wait4"


@linux
def test_a_live_child_is_read_through_psutil_and_a_missing_one_is_null() -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", BURNER + "\nimport sys\nsys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        usage = telemetry.ProcessUsage()
        for _ in range(600):
            usage = telemetry.usage_of_pid(process.pid)
            if usage.children_user_s is not None and usage.children_user_s + usage.children_system_s > 0.25:
                break
            time.sleep(0.05)
        assert usage.source == "psutil" and usage.user_s + usage.system_s >= 0.28
        assert isinstance(usage.voluntary_switches, int) and usage.voluntary_switches >= 1
    finally:
        process.stdin.close()
        process.wait(timeout=60)
    assert telemetry.usage_of_pid(process.pid) == ProcessUsage()  # reaped: nothing to read, all null


def test_in_process_usage_is_the_difference_of_the_two_readings() -> None:
    start = telemetry.snapshot("self")
    t = time.process_time()
    while time.process_time() - t < 0.2:
        pass
    row = telemetry.trial_fields(start, telemetry.snapshot("self"))
    assert row["worker_user_s"] + row["worker_system_s"] >= 0.2 - 0.002
    earlier = ProcessUsage(1.0, 2.0, None, 0.5, 10, 3, "getrusage")
    later = ProcessUsage(1.5, 2.25, 0.1, 0.75, 12, 3, "getrusage")
    assert later.minus(earlier) == ProcessUsage(0.5, 0.25, None, 0.25, 2, 0, "getrusage")


# --- flags ---------------------------------------------------------------------------------------------------


def synthetic(
    times: dict[str, float],
    *,
    seconds: float = 0.0,
    load: float = 1.0,
    cores: int = 16,
    gpus: tuple[dict, ...] = (),
) -> Snapshot:
    return Snapshot(
        monotonic_ns=int(seconds * 1e9),
        cpu_logical=cores,
        cpu_times=times,
        cpu_times_source="psutil",
        load1=load,
        cpu_mhz=None,
        cpu_mhz_source=None,
        gpu_source="nvml" if gpus else None,
        gpus=gpus,
        usage=ProcessUsage(),
    )


def reading(mask: int, power_ns: int = 0, thermal_ns: int = 0) -> dict[str, Any]:
    return {
        "index": 0,
        "sm_clock_mhz": 1980.0,
        "mem_clock_mhz": 3201.0,
        "temperature_c": 40.0,
        "power_w": 120.0,
        "throttle_mask": mask,
        "power_violation_ns": power_ns,
        "thermal_violation_ns": thermal_ns,
        "energy_mj": 0.0,
    }


def row_of(
    *, steal: int = 5, busy: int = 500, end_mask: int = 0x0, power_ns: int = 0, load: float = 1.0
) -> dict[str, Any]:
    """A 60 s trial on 16 cores: ``busy`` and ``steal`` ticks of 1000 in all, the GPU idle at the start."""
    idle = 1000 - busy - steal
    start = synthetic(counters("0 0 0 0 0 0 0 0 0 0"), load=load, gpus=(reading(0x1),))
    end = synthetic(
        counters(f"{busy} 0 0 {idle} 0 0 0 {steal} 0 0"),
        seconds=60.0,
        gpus=(reading(end_mask, power_ns=power_ns),),
    )
    row = telemetry.trial_fields(start, end)
    assert_typed(row)
    return row


def test_a_clean_row_raises_no_flag() -> None:
    row = row_of()
    assert row["cpu_steal_share"] == pytest.approx(0.005) and row["gpu0_throttle_reasons_start"] == "gpu_idle"
    assert telemetry.flags(row) == []
    assert telemetry.flags(row_of(end_mask=0x2 | 0x100)) == []  # clock settings, not throttling
    assert telemetry.flags(row_of(steal=10, busy=500)) == []  # 2% of the wanted time: below the bar


def test_a_throttled_row_is_flagged_with_its_reasons() -> None:
    flagged = telemetry.flags(row_of(end_mask=0x1 | 0x4 | 0x8))
    assert flagged == ["gpu0 reported sw_power_cap+hw_slowdown at the trial's end"]
    held = telemetry.flags(row_of(power_ns=int(2.4e9)))
    assert held == ["gpu0 was held down by power policy for 2.40 s (4.0% of the trial)"]
    assert telemetry.flags(row_of(power_ns=int(0.3e9))) == []  # 0.5% of the trial


def test_a_heavy_steal_row_is_flagged() -> None:
    row = row_of(steal=40, busy=400)  # 4% of all CPU time, 9% of the time the CPUs wanted
    flagged = telemetry.flags(row)
    assert len(flagged) == 1 and flagged[0].startswith(
        "CPU steal took 9.1% of the CPU time wanted (4.0% of all"
    )


def test_a_load_above_the_cores_at_the_start_is_flagged() -> None:
    assert telemetry.flags(row_of(load=16.0)) == []
    assert telemetry.flags(row_of(load=17.5)) == [
        "1-minute load 17.50 at the start, above the 16 logical cores"
    ]


def test_flags_ignore_missing_and_null_fields() -> None:
    assert telemetry.flags({}) == []
    assert telemetry.flags({k: None for k in FIELD_TYPES} | {"gpu0_throttle_mask_end": None}) == []


# --- on a GPU ------------------------------------------------------------------------------------------------

NO_CONTEXT = textwrap.dedent(
    """
    import json, os
    import torch
    from harness import telemetry
    start = telemetry.snapshot("self")
    row = telemetry.trial_fields(start, telemetry.snapshot("self"))
    import pynvml
    pynvml.nvmlInit()
    pids = [p.pid for i in range(pynvml.nvmlDeviceGetCount())
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))]
    pynvml.nvmlShutdown()
    print(json.dumps({"row": row, "listed": os.getpid() in pids, "torch_init": torch.cuda.is_initialized()}))
    """
)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_telemetry_on_a_real_device_reads_nvml_without_a_cuda_context() -> None:
    out = subprocess.run(
        [sys.executable, "-c", NO_CONTEXT],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=child_env(),
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    row = result["row"]
    assert_typed(row)
    assert row["gpu_source"] == "nvml" and row["gpu_count"] >= 1
    assert row["gpu0_sm_clock_mhz_start"] > 0 and 0 < row["gpu0_temperature_c_start"] < 120
    assert row["gpu0_throttle_reasons_start"] is not None
    assert not result["listed"] and not result["torch_init"]  # NVML opened no CUDA context
    print(json.dumps({k: v for k, v in row.items() if k.startswith("gpu")}))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_nvidia_smi_fallback_reads_the_real_device(monkeypatch) -> None:
    monkeypatch.setattr(telemetry, "_load_nvml", lambda: None)
    source, devices = telemetry.read_gpus()
    assert source == "nvidia-smi" and devices and devices[0]["sm_clock_mhz"] > 0
    assert devices[0]["throttle_mask"] is not None


# --- the noise analysis of fit logs (scripts/noise_from_logs.py) ---------------------------------------------


def _noise_script() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("noise_from_logs", ROOT / "scripts" / "noise_from_logs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_bar_times_are_read_at_their_printed_resolution() -> None:
    noise = _noise_script()
    assert noise.parse_elapsed("14.0s") == (14.0, 0.1)
    assert noise.parse_elapsed("6.8s<25.8s") == (6.8, 0.1)
    assert noise.parse_elapsed("1:02") == (62.0, 1.0) and noise.parse_elapsed("1:02:03") == (3723.0, 1.0)
    assert noise.parse_elapsed("4.6it/s") is None and noise.parse_elapsed("x") is None


def _bar(epoch: int, done: int, elapsed: str, rate: str = "8.0it/s") -> str:
    return f"\x1b[K        {epoch}/2     0.807G      3.601      10.24    0.06722   15   640: 50% ━━━─── {done}/4 {rate} {elapsed}\r"


VAL = "\x1b[K                 Class     Images  Instances      Box(P          R      mAP50  mAP50-95): 100% ━━━━ 4/4 {}\n"
FIT_LOG = (
    "Starting training for 2 epochs...\n"
    + _bar(1, 0, " 6.7s", rate="")
    + _bar(1, 2, "7.0s<0.3s")
    + _bar(1, 4, "7.5s")
    + _bar(1, 4, "7.5s")
    + "\n"
    + VAL.format("1.5it/s 2.7s")
    + "                   all         32        113          0          0          0          0\n"
    + _bar(2, 0, " 0.2s", rate="")
    + _bar(2, 4, "5.5s")
    + "\n"
    + VAL.format("23.4it/s 0.2s")
    + "2 epochs completed in 0.005 hours.\nValidating /runs/fit/weights/best.pt...\n"
    + VAL.format("2.6it/s 1.5s")
)


def test_a_fit_log_is_split_into_its_parts_which_add_up_to_the_wall_time(tmp_path: Path) -> None:
    noise = _noise_script()
    (tmp_path / "trials").mkdir()
    (tmp_path / "trials" / "3.log").write_text(FIT_LOG)
    row = {
        "index": 3,
        "status": "ok",
        "value": 30.0,
        "arm": "a",
        "role": "baseline",
        "phase": "measured",
        "round": 1,
    }
    fit = noise.read_fit(row, tmp_path)
    assert fit.per_epoch == [7.5, 5.5]
    assert fit.parts["first_iter"] == 6.7 and fit.parts["epoch1_rest"] == pytest.approx(0.8)
    assert fit.parts["steady"] == 5.5 and fit.parts["validation"] == pytest.approx(2.7 + 0.2 + 1.5)
    assert sum(fit.parts.values()) == pytest.approx(30.0) and fit.parts["setup_other"] == pytest.approx(12.6)
    (tmp_path / "trials" / "3.log").write_text(FIT_LOG.split("Validating")[0])
    with pytest.raises(ValueError, match="could not read every epoch"):
        noise.read_fit(row, tmp_path)


@pytest.mark.parametrize("pairs", [3, 6])
def test_the_sigma_interval_covers_at_its_level(pairs: int) -> None:
    """Coverage by simulation: normal log ratios of known σ; 4000 runs give the level within ±0.015 (3 s.e.)."""
    import numpy as np

    noise = _noise_script()
    rng = np.random.default_rng(pairs)
    runs, covered = 4000, 0
    for sample in rng.normal(0.0, 0.05, size=(runs, pairs)):
        _, low, high = noise.sigma_interval(list(sample), level=0.90)
        covered += low <= 0.05 <= high
    assert abs(covered / runs - 0.90) < 0.015


def test_variance_shares_of_the_parts_add_up_to_one() -> None:
    noise = _noise_script()
    parts = [[1.0, -2.0, 0.5, 3.0], [0.2, 0.1, -0.4, 0.3], [-1.0, 0.0, 2.0, 0.5]]
    whole = [sum(column) for column in zip(*parts, strict=True)]
    assert sum(noise.covariance_share(part, whole) for part in parts) == pytest.approx(1.0)
