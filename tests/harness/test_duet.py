"""Duet rounds keep the machine loaded until every trial of the round has ended (``harness.schedule``).

The arm that ends first runs discarded fillers; its partner's end stops a running filler at once.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from harness.cli import main
from harness.isolation import WorkerDied, run_in_worker
from harness.tables import RunFolder

QUIET = ["--quiet", "--no-report", "--warmup", "0", "--order", "duet"]


def only_folder(out: Path) -> RunFolder:
    (path,) = [p for p in out.iterdir() if p.is_dir()]
    return RunFolder.open(path)


def test_the_half_that_ends_first_keeps_working_until_its_partner_ends(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    command = ["sh", "-c", f"echo {{arm}} >> {ledger}; sleep {{arm}}"]
    argv = ["command", "--arms", "0.2,1.2", "--pairs", "2", "--out", str(tmp_path / "runs"), *QUIET]
    assert main([*argv, "--", *command]) == 0
    runs = ledger.read_text().split()
    assert runs.count("1.2") == 2  # measured only
    assert runs.count("0.2") >= 2 + 2 * 2  # measured, then fillers while 1.2 s ran (about five a round)
    folder = only_folder(tmp_path / "runs")
    assert sorted(r["index"] for r in folder.rows()) == [0, 1, 2, 3]
    assert sorted(p.name for p in (folder.path / "trials").iterdir()) == ["0.log", "1.log", "2.log", "3.log"]


def test_a_partners_end_stops_a_running_filler_at_once(tmp_path: Path) -> None:
    """From its third run the short arm sleeps 60 s; the round ends with the partner's 1 s, not a minute
    later.

    Its first two runs are the untimed first trial and its measured one, or its measured one and a first
    filler.
    """
    marks = tmp_path / "m"
    runs = f"$(cat {marks}{{arm}} 2>/dev/null | wc -l)"
    script = f"echo >> {marks}{{arm}}; if [ {runs} -ge 3 ]; then sleep 60; else sleep {{arm}}; fi"
    argv = ["command", "--arms", "0.2,1.0", "--pairs", "1", "--out", str(tmp_path / "runs"), *QUIET]
    started = time.monotonic()
    assert main([*argv, "--", "sh", "-c", script]) == 0
    assert time.monotonic() - started < 30
    assert len((tmp_path / "m0.2").read_text().splitlines()) >= 3  # the minute-long filler did start
    rows = only_folder(tmp_path / "runs").rows()
    assert [r["status"] for r in rows] == ["ok", "ok"]


def test_a_worker_is_ended_once_its_wait_is_called_off(tmp_path: Path) -> None:
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    started = time.monotonic()
    with pytest.raises(WorkerDied, match="called off"):
        run_in_worker("time:sleep", 60, cancel=cancel)  # type: ignore[arg-type]
    assert time.monotonic() - started < 20
