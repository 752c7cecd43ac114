"""The screen refuses a guard past any count."""

from __future__ import annotations

from pathlib import Path


def test_a_guard_past_any_count_is_one_line(tmp_path: Path, bench) -> None:
    """Every other count is capped; a guard of 10^22 ran, and could only fail inside every trial on CUDA."""
    command = ["screen", "--device", "cpu", "--scales", "n", "--steps", "1", "--pairs", "1", "--warmup", "0"]
    bench.refused([*command, "--guards", "9" * 23, "--out", str(tmp_path)], "--guards")
    assert list(tmp_path.iterdir()) == []
