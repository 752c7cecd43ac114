"""Every tier: when every trial of an arm failed, the console names its distinct errors, one line each, and the
exit status is 3 (``harness.run``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from harness.cli import main
from tests.argv import ONE_PAIR


class Broken(torch.optim.SGD):
    """Builds, then fails at every step."""

    def step(self, closure=None):
        raise RuntimeError("boom at step")


BROKEN = f"broken={__name__}:Broken"
FIT = ["--workload", "embedded", "--images", "8", "--batch", "4", "--steps", "2", "--imgsz", "32"]
QUIET_PAIR = ["--device", "cpu", *ONE_PAIR, "--quiet", "--no-report"]
FAILING = [sys.executable, "-c", "import sys; sys.exit('{arm}' == 'bad' and 'boom in the command')"]

TIERS = {
    "pair": (["pair", *FIT, "--arms", f"baseline,{BROKEN}", *QUIET_PAIR], "broken", "boom at step"),
    "command": (["command", "--arms", "good,bad", *QUIET_PAIR, "--", *FAILING], "bad", "boom"),
    "parity": (
        ["parity", "--arms", f"baseline,{__name__}:Broken", "--device", "cpu", "--steps", "1"],
        "",
        "boom",
    ),
}


@pytest.mark.parametrize("tier", sorted(TIERS))
def test_every_trial_failed_names_the_errors_and_exits_3(tier: str, tmp_path: Path, capsys) -> None:
    argv, arm, error = TIERS[tier]
    code = main([*argv[:1], "--out", str(tmp_path / "runs"), *argv[1:]])
    err = capsys.readouterr().err
    assert code == 3, err
    assert f"every trial of arm '{arm}" in err and error in err, err
    lines = [line for line in err.splitlines() if error in line]
    assert len(lines) == 1, err  # one line per distinct error
