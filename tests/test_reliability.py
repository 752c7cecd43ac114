"""The run folder under faults and hostile input: nothing lost, nothing run twice, nothing misleading.

Two runs on one folder, non-finite results, failed writes, absurd counts, corrupt files, markup in user text,
unwritable outputs, arms that cannot be built, interrupts and closed pipes, options that a resume would
ignore; and the two promises no other test sees (the log is fsynced per row, the timer synchronizes right
before each clock read).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli import main
from harness.tables import RunFolder, RunFolderBusy
from tests.trialfns import runner

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

# A pair-tier run (so `bench pair --resume` accepts its folder) whose trials sleep instead of fitting.
HOLD_A_PAIR_RUN = """
import sys
from pathlib import Path
from experiments.fit.plan import FitSettings, make_plan
from experiments.tiers import TIERS
from harness.protocol import ProtocolOptions
from harness.run import Runner, RunOptions
from tests.trialfns import TWO_ARMS, sleepy

out, sleep = Path(sys.argv[1]), float(sys.argv[2])
settings = FitSettings(workload="embedded", images=8, batch=4, steps=4, val_images=8)
plan = make_plan(ProtocolOptions(TWO_ARMS, warmup=0, pairs=2), settings, "bench pair --workload embedded")
plan.settings["sleep"] = sleep
Runner(TIERS, RunOptions(out=out, quiet=True, report=False)).start(plan, sleepy(plan))
"""


def _wait_for(predicate, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


def _figure(ctx) -> dict:
    return {"value": 1.0}


def _only_folder(root: Path) -> RunFolder:
    (path,) = [p for p in root.iterdir() if p.is_dir()]
    return RunFolder(path)


# --- one run per folder --------------------------------------------------------------------------------


def test_a_second_run_on_a_folder_in_use_is_one_line_exit_2_and_runs_nothing(tmp_path: Path, capsys) -> None:
    """Process A runs a folder; while it does, this process resumes it (API and CLI): refused, nothing run."""
    runs = tmp_path / "runs"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_A_PAIR_RUN, str(runs), "0.6"],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(
            lambda: runs.is_dir() and any(runs.iterdir()) and any(next(runs.iterdir()).glob("started-*"))
        )
        folder = _only_folder(runs)
        with pytest.raises(RunFolderBusy, match=f"in use by another run \\(process {holder.pid}\\)"):
            runner(runs).resume(folder.path, _figure)
        assert main(["pair", "--resume", str(folder.path), "--quiet", "--no-report"]) == 2
        error = capsys.readouterr().err.strip()
        assert error.count("\n") == 0 and "in use by another run" in error, error
        assert holder.wait(timeout=120) == 0, holder.stderr.read()
    finally:
        if holder.poll() is None:
            holder.kill()
    indices = [r["index"] for r in folder.rows()]
    assert indices == [0, 1, 2, 3]  # each scheduled trial once: the refused runs ran nothing
    starters = {p.read_text() for p in folder.path.glob("started-*")}
    assert starters == {str(holder.pid)}
    runner(runs).resume(folder.path, _figure)  # the lock died with its holder: usable again
    assert [r["index"] for r in folder.rows()] == [0, 1, 2, 3]
