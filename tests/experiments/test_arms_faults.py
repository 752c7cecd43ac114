"""An arm whose constructor does not fit is one line before the schedule, in every tier."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.argv import EMBEDDED, ONE_PAIR

ONE_TRIAL = [*ONE_PAIR, "--device", "cpu"]


@pytest.mark.parametrize(
    "command",
    [
        [*EMBEDDED, "--arms", "baseline,torch.optim:SGD(nosuch=1)"],
        ["screen", "--arms", "baseline,torch.optim:SGD(nosuch=1)"],
        ["probe", "--arms", "torch.optim:SGD(nosuch=1),baseline"],
    ],
)
def test_an_arm_whose_constructor_does_not_fit_is_one_line_before_the_schedule(
    tmp_path: Path, bench, no_run, command: list[str]
) -> None:
    out = tmp_path / "runs"
    bench.refused(
        [*command, *ONE_TRIAL, "--out", str(out)],
        "--arms: arm 'torch.optim:SGD(nosuch=1)' cannot be built",
        "unexpected keyword argument 'nosuch'",
    )
    assert not out.exists()
