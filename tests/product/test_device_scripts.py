"""The GPU machine's set-up stays at its documented path, `scripts/h200_env.sh`.

The one-off device scripts and their own tests live in scripts/device/ (`pytest scripts/device`), outside the
CPU suite."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import ROOT

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def test_the_device_set_up_without_wheels_says_how_to_get_them(tmp_path: Path) -> None:
    """A checkout without .whl/ (git ignores it) stops the device set-up in one line saying what is missing
    and how to get it.
    """
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "h200_env.sh", tree / "scripts")
    environment = {**os.environ, "OUT": str(tmp_path / "out")}
    result = subprocess.run(
        ["bash", "-c", ". scripts/h200_env.sh || exit $?"],
        cwd=tree,
        env=environment,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "h200_env.sh: no wheels in .whl/ (ignored by git, so a new checkout lacks them): run "
        "`bash scripts/device/h200_wheels.sh` on the machine that calls the device, then carry .whl"
    ]
    assert not (tmp_path / "out").exists()
