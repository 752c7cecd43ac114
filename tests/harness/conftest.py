"""Fixtures that several of the harness's fault tests share."""

from __future__ import annotations

import subprocess

import pytest

from tests.trialfns import plan_of, runner


@pytest.fixture
def read_only_disk(tmpfs):
    """A tmpfs holding a finished run folder, then remounted read-only."""
    mount = tmpfs("16m")
    folder = runner(mount / "runs").start(plan_of("sleepy", warmup=0, pairs=1)).folder
    subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
    return mount, folder
