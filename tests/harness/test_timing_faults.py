"""The timer's promise no other test sees: it synchronizes right before each clock read."""

from __future__ import annotations

from harness import timing


def test_the_timer_synchronizes_immediately_before_each_clock_read(monkeypatch) -> None:
    """A stand-in device records its synchronizations; the bracket is sync, clock, work, sync, clock."""
    calls: list = []
    ticks = iter(range(1_000, 10**9, 250))
    monkeypatch.setattr(timing, "synchronize", lambda device: calls.append(("synchronize", str(device))))
    monkeypatch.setattr(timing.time, "perf_counter_ns", lambda: calls.append("clock") or next(ticks))
    with timing.SyncTimer("cuda:1") as timer:
        calls.append("work")
    monkeypatch.undo()
    sync = ("synchronize", "cuda:1")
    assert calls == [sync, "clock", "work", sync, "clock"]
    assert timer.seconds == 250 / 1e9
