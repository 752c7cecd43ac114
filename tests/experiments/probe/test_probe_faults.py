"""The probe refuses an option of the other head."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.parametrize(
    ("head", "option", "value"),
    [
        ("lm", "--scale", "x"),
        ("lm", "--imgsz", "320"),
        ("lm", "--batch", "2"),
        ("detect", "--tokens", "5"),
        ("detect", "--vocab", "64"),
        ("detect", "--dim", "8"),
        ("detect", "--cap", "10"),
        ("detect", "--chunk", "4"),
    ],
)
def test_a_probe_option_of_the_other_head_is_refused(
    tmp_path: Path, bench, no_run, head: str, option: str, value: str
) -> None:
    """Each head's own options are refused with the other head in one line, never probed and ignored."""
    out = tmp_path / "runs"
    command = ["probe", "--device", "cpu", "--head", head, option, value, "--out", str(out)]
    bench.refused(command, f"{option} {value}", f"--head {head}")
    assert not out.exists()
