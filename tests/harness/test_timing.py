"""Timing helpers: sizes, budgets and out-of-memory messages as PyTorch prints them."""

from __future__ import annotations

import time

import pytest
import torch

from harness import timing
from harness.formatting import format_bytes
from harness.timing import SyncTimer, TrialFailure, is_out_of_memory, parse_bytes, parse_oom

GIB, MIB = 2**30, 2**20

# Real message texts of PyTorch's CUDA caching allocator (torch 2.x), as users have reported them.
CUDA_OOM = (
    "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 8.00 GiB of which 0 bytes "
    "is free. Of the allocated memory 14.51 GiB is allocated by PyTorch, and 15.90 MiB is reserved by PyTorch "
    "but unallocated."
)
CUDA_OOM_PROCESS = (
    "CUDA out of memory. Tried to allocate 19.68 GiB. GPU 0 has a total capacity of 23.68 GiB of which "
    "11.88 GiB is free. Including non-PyTorch memory, this process has 11.79 GiB memory in use. Of the allocated "
    "memory 11.44 GiB is allocated by PyTorch, and 43.59 MiB is reserved by PyTorch but unallocated. If reserved "
    "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation.  See documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
# With a per-process memory fraction, the allocator names the cap ("<size> allowed;").
CUDA_OOM_BUDGET = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
    "113.25 GiB is free. Including non-PyTorch memory, this process has 24.47 GiB memory in use. 24.00 GiB "
    "allowed; Of the allocated memory 21.90 GiB is allocated by PyTorch, and 1.06 GiB is reserved by PyTorch "
    "but unallocated."
)
CPU_OOM = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1099511627776 bytes. Error code 12 (Cannot allocate memory)"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24GiB", 24 * GIB),
        ("800MiB", 800 * MIB),
        ("1.5GB", 1_500_000_000),
        ("4096", 4096),
        ("2 gib", 2 * GIB),
    ],
)
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    "text",
    # Digits of other scripts (Arabic-Indic, full-width) read as 24 and 2 through float(): sizes are ASCII.
    ["", "GiB", "24 parsecs", "-1GiB", "0MiB", "1..2GB", "\u0662\u0664GiB", "\uff12GiB"],
)
def test_parse_bytes_refuses_with_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="e.g. 24GiB"):
        parse_bytes(text)


def test_parse_oom_plain() -> None:
    figures = parse_oom(CUDA_OOM)
    assert figures["requested"] == 20 * MIB
    assert figures["total"] == 8 * GIB
    assert figures["free"] == 0
    assert figures["allocated"] == round(14.51 * GIB)
    assert figures["reserved"] == round(14.51 * GIB) + round(15.90 * MIB)
    assert figures["budget"] is None


def test_parse_oom_with_process_and_budget() -> None:
    assert parse_oom(CUDA_OOM_PROCESS)["free"] == round(11.88 * GIB)
    figures = parse_oom(CUDA_OOM_BUDGET)
    assert figures["budget"] == 24 * GIB
    assert figures["requested"] == 2 * GIB
    assert figures["free"] == round(113.25 * GIB)


def test_cpu_allocator_message() -> None:
    assert parse_oom(CPU_OOM)["requested"] == 2**40
    assert is_out_of_memory(RuntimeError(CPU_OOM))


def test_real_cpu_out_of_memory_is_a_resource_failure() -> None:
    """Ask the CPU allocator for far more than any machine has: PyTorch raises its own message."""
    try:
        torch.empty(2**62, dtype=torch.uint8)
    except Exception as exc:  # noqa: BLE001 - the exception type varies across torch versions
        failure = TrialFailure.from_exception(exc, budget=None)
    else:
        pytest.skip("the allocator granted 4 EiB")
    assert failure.status == "resource_failure"
    assert failure.oom["requested"] == 2**62


def test_other_exceptions_are_errors() -> None:
    failure = TrialFailure.from_exception(ValueError("bad shape"), budget=GIB)
    assert failure.status == "error" and failure.oom == {} and "bad shape" in failure.message


def test_oom_budget_falls_back_to_the_run_budget() -> None:
    failure = TrialFailure.from_exception(torch.OutOfMemoryError(CUDA_OOM), budget=6 * GIB)
    assert failure.status == "resource_failure" and failure.oom["budget"] == 6 * GIB


def test_format_bytes() -> None:
    assert format_bytes(809.9 * MIB) == "809.9 MiB"
    assert format_bytes(24 * GIB) == "24.00 GiB"
    assert format_bytes(None) == "n/a"


def test_sync_timer_measures_elapsed_time() -> None:
    with SyncTimer("cpu") as timer:
        sum(range(10000))
    assert 0 < timer.seconds < 5


def test_a_synchronized_stage_clock_splits_each_stage_into_host_time_and_the_wait_for_the_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stage's host time, until it reached the closing mark, is kept apart from the wait in that mark's
    synchronization.

    So a host-bound step and one that waits on the device read apart.
    """
    waited = 0.05
    monkeypatch.setattr(timing, "synchronize", lambda _device: time.sleep(waited))
    clock = timing.StageClock("cpu", synchronized=True)
    clock.start()
    time.sleep(0.02)
    clock.mark("optimizer")
    clock.mark("other")
    (stage, whole), (_, instant) = clock.intervals()
    (host_stage, host), (_, instant_host) = clock.host_intervals()
    assert stage == host_stage == "optimizer"
    assert 0.02 <= host < 0.02 + waited / 2  # the sleep inside the stage, not the mark's wait
    assert whole >= host + waited  # the interval holds the wait as well
    assert 0 <= instant_host < waited / 2 <= instant
    unsynchronized = timing.StageClock("cpu", synchronized=False)
    unsynchronized.start()
    unsynchronized.mark("optimizer")
    assert unsynchronized.host_intervals() == []  # no synchronization: no wait to keep apart


def test_a_switched_off_stage_clock_marks_and_wraps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim run's clock adds nothing inside the timed bracket: no mark, no synchronization, no wrapper."""
    monkeypatch.setattr(
        timing, "synchronize", lambda _device: pytest.fail("a switched-off clock synchronized")
    )
    clock = timing.StageClock("cpu", enabled=False)
    clock.start()
    clock.iteration()
    clock.mark("optimizer")
    assert clock.wrap(len, "other", "ema") is len
    assert clock.intervals() == [] and clock.totals(("optimizer",)) == {"optimizer": 0.0}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_an_unsynchronized_stage_clock_on_cuda_times_with_events() -> None:
    """On CUDA without synchronization each mark records a CUDA event; a stage is the time between events."""
    clock = timing.StageClock("cuda", synchronized=False)
    assert clock.events
    x = torch.randn(2048, 2048, device="cuda")
    clock.start()
    for _ in range(20):
        x = x @ x / 2048
    clock.mark("matmul")
    clock.mark("nothing")
    torch.cuda.synchronize()
    (first, busy), (second, idle) = clock.intervals()
    assert (first, second) == ("matmul", "nothing") and busy > idle >= 0
    assert all(isinstance(event, torch.cuda.Event) for _, event in clock.marks)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_budget_makes_a_real_cuda_oom_a_resource_failure() -> None:
    from harness.timing import apply_budget, release_budget

    apply_budget(256 * MIB, "cuda")
    try:
        with pytest.raises(torch.OutOfMemoryError) as info:
            torch.empty(512 * MIB, dtype=torch.uint8, device="cuda")
        figures = TrialFailure.from_exception(info.value, budget=256 * MIB).oom
        assert figures["requested"] == 512 * MIB
        assert figures["budget"] is not None and figures["budget"] <= 256 * MIB + MIB
    finally:
        release_budget("cuda")
