"""Parity refuses a candidate that is the baseline or cannot be built, before any trial."""

from __future__ import annotations

from pathlib import Path


def test_a_parity_candidate_that_is_the_baseline_is_refused_before_any_trial(tmp_path: Path, bench) -> None:
    """`parity --candidate baseline` is refused up front in one line naming --candidate: the case would repeat
    an arm.
    """
    bench.refused(
        ["parity", "--device", "cpu", "--candidate", "baseline", "--out", str(tmp_path)],
        "--candidate baseline is the baseline",
    )
    assert list(tmp_path.iterdir()) == []


def test_parity_of_a_candidate_that_cannot_be_built_is_exit_2_not_a_broken_contract(
    tmp_path: Path, bench
) -> None:
    out = tmp_path / "runs"
    command = [
        "parity",
        "--candidate",
        "torch.optim:SGD(nosuch=1)",
        "--steps",
        "1",
        "--device",
        "cpu",
        "--out",
        str(out),
    ]
    bench.refused(command, "--candidate: arm 'torch.optim:SGD(nosuch=1)' cannot be built")
    assert not out.exists()
