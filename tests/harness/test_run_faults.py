"""A run under faults: a folder in use, failed writes, a full disk, interrupts, a closed stdout, refusals."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

import harness.run
from harness.cli import main
from harness.errors import InputError
from harness.folder_format import LOG
from harness.tables import RunFolder, RunFolderBusy, RunFolderWriteError
from harness.tier import BaseTier, TierRegistry
from tests.argv import BENCH, ONE_PAIR, TINY_FIT
from tests.processes import started, wait_for
from tests.runfolders import copy_run, corrupt_plan, only_run, set_field, tmp_files, untouched
from tests.trialfns import BEHAVIOURS, TIERS, plan_of, runner

# A pair-tier run (so `bench pair --resume` accepts its folder) whose trials sleep instead of fitting.
HOLD_A_PAIR_RUN = """
import sys
from pathlib import Path
from experiments.fit.plan import make_plan
from experiments.tiers import TIERS
from harness.protocol_options import ProtocolOptions
from harness.run import Runner, RunOptions
from tests.trialfns import TINY_FIT_SETTINGS, TWO_ARMS, sleepy

out, sleep = Path(sys.argv[1]), float(sys.argv[2])
protocol = ProtocolOptions(TWO_ARMS, warmup=0, pairs=2)
plan = make_plan(protocol, TINY_FIT_SETTINGS, "bench pair --workload embedded")
plan.settings["sleep"] = sleep
Runner(TIERS, RunOptions(out=out, quiet=True, report=False)).start(plan, sleepy(plan))
"""


def _figure(ctx) -> dict:
    return {"value": 1.0}


def _tiers_with_a_claim():
    """The test tier, with a claim (so a run writes claim.txt)."""
    return TierRegistry(
        [
            BaseTier(
                "test",
                trial_function=lambda plan: BEHAVIOURS[plan.settings["behaviour"]](plan),
                claim=lambda run: "a claim\n",
            )
        ]
    )


def test_a_second_run_on_a_folder_in_use_is_one_line_exit_2_and_runs_nothing(tmp_path: Path, capsys) -> None:
    """Process A runs a folder; while it does, this process resumes it (API and CLI): refused, nothing run."""
    runs = tmp_path / "runs"
    with started(
        [sys.executable, "-c", HOLD_A_PAIR_RUN, str(runs), "0.6"], stdout=subprocess.DEVNULL
    ) as holder:
        wait_for(
            lambda: runs.is_dir() and any(runs.iterdir()) and any(next(runs.iterdir()).glob("started-*"))
        )
        folder = only_run(runs)
        with pytest.raises(RunFolderBusy, match=f"in use by another run \\(process {holder.pid}\\)"):
            runner(runs).resume(folder.path, _figure)
        assert main(["pair", "--resume", str(folder.path), "--quiet", "--no-report"]) == 2
        error = capsys.readouterr().err.strip()
        assert error.count("\n") == 0 and "in use by another run" in error, error
        assert holder.wait(timeout=120) == 0, holder.stderr.read()
    indices = [r["index"] for r in folder.rows()]
    assert indices == [0, 1, 2, 3]  # each scheduled trial once: the refused runs ran nothing
    starters = {p.read_text() for p in folder.path.glob("started-*")}
    assert starters == {str(holder.pid)}
    runner(runs).resume(folder.path, _figure)  # the lock died with its holder: usable again
    assert [r["index"] for r in folder.rows()] == [0, 1, 2, 3]


@pytest.fixture
def tiny_disk(tmpfs):
    """A 200 KiB tmpfs, and a function that grows it to 64 MiB."""
    mount = tmpfs("200k")
    return mount, lambda: subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)


def _temporary_of(written: str, name: str) -> bool:
    """``written`` is a temporary file of ``write_atomic`` for the file ``name`` less its ``.tmp``."""
    return (
        name.endswith(".tmp")
        and written.startswith(name.removesuffix(".tmp") + ".")
        and written.endswith(".tmp")
    )


def _fail_writes_to(monkeypatch, name: str, call: int = 1):
    """Make the ``call``-th ``os.write`` into a file named ``name`` write half its bytes and raise ENOSPC."""
    real_write, seen = os.write, []

    def write(fd: int, data) -> int:
        target = os.readlink(f"/proc/self/fd/{fd}") if os.path.exists(f"/proc/self/fd/{fd}") else ""
        if Path(target).name == name or _temporary_of(Path(target).name, name):
            seen.append(fd)
            if len(seen) == call:
                real_write(fd, bytes(data)[: len(data) // 2])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    return seen


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
def test_a_row_that_cannot_be_written_stops_the_run_and_runs_again_on_resume(
    tmp_path: Path, monkeypatch
) -> None:
    plan = plan_of("sleepy", warmup=0, pairs=2)
    _fail_writes_to(monkeypatch, LOG, call=3)
    with pytest.raises(RunFolderWriteError) as stopped:
        runner(tmp_path).start(plan)
    message = str(stopped.value)
    assert "\n" not in message and "No space left on device" in message and LOG in message, message
    folder = only_run(tmp_path)
    assert f"--resume {folder.path}" in message and "trial 3" in message, message
    assert folder.file(LOG).read_bytes().endswith(b"\n")  # the half-written row was taken back
    assert [r["index"] for r in folder.rows()] == [0, 1]
    assert tmp_files(folder.path) == []
    monkeypatch.undo()
    runner(tmp_path).resume(folder.path)
    scheduled = [r["index"] for r in folder.rows() if r["index"] < 4]  # the resume's own warm-up is index 4
    assert scheduled == [0, 1, 2, 3]  # trial 3 ran again, nothing twice


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
def test_a_row_that_cannot_be_written_in_a_duet_round_stops_the_run_too(tmp_path: Path, monkeypatch) -> None:
    """A duet round runs its trials in threads: a failed write there must stop the run, not vanish."""
    plan = plan_of("sleepy", warmup=0, pairs=2, order="duet")
    plan.in_process = False  # a concurrent order is for worker tiers; the trials here need no worker
    _fail_writes_to(monkeypatch, LOG, call=2)
    with pytest.raises(RunFolderWriteError, match="No space left on device.*--resume"):
        runner(tmp_path).start(plan)
    folder = only_run(tmp_path)
    assert len(folder.rows()) == 1 and tmp_files(folder.path) == []
    monkeypatch.undo()
    runner(tmp_path).resume(folder.path)
    assert sorted(r["index"] for r in folder.rows() if r["index"] < 4) == [
        0,
        1,
        2,
        3,
    ]  # and the resume's warm-up


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
@pytest.mark.parametrize("table", ["pairs.csv", "claim.txt"])
def test_a_table_that_cannot_be_written_stops_with_one_line_and_no_temporary_file(
    tmp_path: Path, monkeypatch, table: str
) -> None:
    figures = {"baseline": [10, 10], "candidate": [8, 9]}
    tiers = _tiers_with_a_claim()
    _fail_writes_to(monkeypatch, table + ".tmp")
    with pytest.raises(RunFolderWriteError, match=f"{table}.*No space left on device.*--resume"):
        runner(tmp_path, tiers=tiers).start(plan_of("scripted", warmup=0, pairs=2, figures=figures))
    folder = only_run(tmp_path)
    assert tmp_files(folder.path) == [] and not folder.file(table).exists()
    assert len(folder.rows()) == 4  # every trial is in the log
    monkeypatch.undo()
    runner(tmp_path, tiers=tiers).resume(folder.path)  # nothing left to run: the tables are written
    assert folder.file(table).is_file()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
def test_a_table_that_cannot_be_rewritten_between_rounds_stops_there_and_resume_finishes(
    tmp_path: Path, monkeypatch
) -> None:
    """The tables are rewritten between rounds (`TABLES_REFRESH_SECONDS`). A write that fails there stops the
    run in one line naming --resume, every trial kept.
    """
    monkeypatch.setattr(harness.run, "TABLES_REFRESH_SECONDS", 0.0)
    figures = {"baseline": [10, 10, 10], "candidate": [8, 9, 8]}
    _fail_writes_to(monkeypatch, "pairs.csv.tmp")
    with pytest.raises(RunFolderWriteError, match=r"pairs\.csv.*No space left on device.*--resume"):
        runner(tmp_path).start(plan_of("scripted", warmup=0, pairs=3, figures=figures))
    folder = only_run(tmp_path)
    assert tmp_files(folder.path) == [] and not folder.file("pairs.csv").exists()
    assert sorted(r["index"] for r in folder.rows()) == [0, 1]  # round 1 whole; round 2 never started
    monkeypatch.undo()
    runner(tmp_path).resume(folder.path)
    assert sorted(r["round"] for r in folder.rows() if r["phase"] == "measured") == [0, 0, 1, 1, 2, 2]
    assert len(pd.read_csv(folder.file("pairs.csv"))) == 3


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
def test_a_run_folder_that_cannot_be_set_up_is_removed(tmp_path: Path, monkeypatch) -> None:
    _fail_writes_to(monkeypatch, "env.json.tmp")
    with pytest.raises(RunFolderWriteError, match="env.json.*No space left on device.*nothing was run"):
        runner(tmp_path / "runs").start(plan_of("sleepy", warmup=0, pairs=1))
    assert not any((tmp_path / "runs").iterdir())


@pytest.mark.slow
def test_a_full_disk_stops_a_fit_with_one_line_and_resume_finishes(tiny_disk, capsys) -> None:
    """The issue's case on a real 200 KiB tmpfs: the first checkpoint fills it."""
    disk, grow = tiny_disk
    command = ["pair", *TINY_FIT, *ONE_PAIR, "--quiet", "--no-report"]
    assert main([*command, "--out", str(disk)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "No space left on device" in error and "--resume" in error, error
    folder = only_run(disk)
    assert tmp_files(disk) == []
    assert folder.rows() == []  # the trial that hit the full disk has no row: it runs again on resume
    # The untimed first trial (the estimate before any trial) hit the full disk, in a folder since removed.
    assert sorted(p.name for p in folder.path.iterdir() if p.is_dir()) == []
    grow()
    assert main(["pair", "--resume", str(folder.path), "--quiet", "--no-report"]) == 0
    assert [r["index"] for r in folder.rows()] == [0, 1]
    assert all(r["status"] == "ok" for r in folder.rows())
    assert sorted(p.name for p in (folder.path / "trials").iterdir()) == ["0.log", "1.log"]


@pytest.mark.parametrize("pairs", [2, "auto"])
def test_a_resume_with_nothing_left_to_run_makes_no_trial_function(tmp_path: Path, pairs) -> None:
    """A finished run resumed to rewrite its tables makes no trial function; the fit tier's would first build
    a data set.

    With --pairs auto, a run that its last look stopped is as finished.
    """
    extra = {"precision": 50.0, "max_pairs": 6} if pairs == "auto" else {}
    folder = runner(tmp_path).start(plan_of("sleepy", warmup=0, pairs=pairs, **extra)).folder
    made = []
    counting = TierRegistry(
        [
            BaseTier(
                "test",
                trial_function=lambda plan: made.append(plan) or TIERS.get("test").trial_function(plan),
            )
        ]
    )
    rows = folder.file("trials.jsonl").read_bytes()
    run = runner(tmp_path, tiers=counting).resume(folder.path)
    assert made == [] and folder.file("trials.jsonl").read_bytes() == rows
    assert not run.summaries.claims.empty  # the tables were written again from the log


def test_a_resume_whose_recorded_cores_this_machine_lacks_is_one_line(
    finished_run: RunFolder, tmp_path: Path
) -> None:
    """A plan placed on cores this machine lacks (`--cpus 0-4095`) is refused in one line naming the plan's
    value and this machine's cores.
    """
    folder = copy_run(finished_run, tmp_path / "run")
    corrupt_plan(folder, set_field("protocol.cpus", "0-4095"))
    _resume_refused(folder, tmp_path, r"--cpus 0-4095 recorded in the plan: core\(s\) .* are not among")


def _resume_refused(folder: RunFolder, out: Path, match: str) -> None:
    """Resuming ``folder`` is refused (an ``InputError`` matching ``match``); every file is left as it was."""
    before = untouched(folder)
    with pytest.raises(InputError, match=match):
        runner(out).resume(folder.path)
    assert untouched(folder) == before


def _drop_last_row(folder: RunFolder) -> None:
    log = folder.file("trials.jsonl")
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:-1]))


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks a resume where the plan's CUDA device is absent"
)
def test_a_resume_where_the_runs_cuda_device_is_absent_is_one_line(
    finished_run: RunFolder, tmp_path: Path
) -> None:
    """A CUDA run resumed where CUDA is absent is refused before anything is written, naming the device."""
    folder = copy_run(finished_run, tmp_path / "run")
    corrupt_plan(folder, set_field("protocol.device", "cuda"))
    _drop_last_row(folder)
    _resume_refused(folder, tmp_path, "the run is on cuda, and this machine has 0 CUDA devices")


def test_a_resume_refused_for_its_budget_leaves_env_json_as_it_was(
    finished_run: RunFolder, tmp_path: Path
) -> None:
    """A resume refused for its in-process plan's budget leaves env.json as it was: no resume recorded that
    never ran.
    """
    folder = copy_run(finished_run, tmp_path / "run")

    def in_process_with_a_budget(plan: dict) -> None:
        plan["in_process"] = True
        plan["protocol"]["budget"] = 1000

    corrupt_plan(folder, in_process_with_a_budget)
    _drop_last_row(folder)
    _resume_refused(folder, tmp_path, "--budget")


def test_a_torn_last_line_is_still_ignored_and_cut_by_the_next_append(
    finished_run: RunFolder, tmp_path: Path, capsys
) -> None:
    folder = copy_run(finished_run, tmp_path / "run")
    path = folder.file("trials.jsonl")
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + lines[-1][:40])  # killed while writing trial 4's row
    assert main(["report", str(folder.path), "-o", str(tmp_path / "r.md")]) == 0
    runner(tmp_path).resume(folder.path)
    rows = folder.rows()  # the resume warms up once (a row outside the schedule), then runs trial 4 again
    assert path.read_text().count("\n") == 6 and [r["index"] for r in rows if r["index"] < 5] == [
        0,
        1,
        2,
        3,
        4,
    ]
    assert [r.get("warmup_reason") for r in rows if r["index"] >= 5] == ["resume"]
    assert main(["report", str(folder.path), "-o", str(tmp_path / "r.md")]) == 0


QUIET_FIT = [*BENCH, "pair", *TINY_FIT, *ONE_PAIR, "--quiet"]


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_an_interrupt_says_where_the_run_is_and_exits_130(tmp_path: Path, signal_name: str) -> None:
    with started([*QUIET_FIT, "--no-report", "--out", str(tmp_path)]) as process:
        wait_for(lambda: any(tmp_path.glob("pair-*/trials/0.log")))
        process.send_signal(getattr(signal, signal_name))
        out, err = process.communicate(timeout=60)
    folder = only_run(tmp_path)
    assert process.returncode == 130, err
    assert f"run folder: {folder.path}" in out  # --quiet prints the run folder too
    last = err.strip().splitlines()[-1]
    assert last.startswith("bench: interrupted") and f"--resume {folder.path}" in last, err
    assert main(["pair", "--resume", str(folder.path), "--quiet", "--no-report"]) == 0
    assert [r["index"] for r in folder.rows()] == [0, 1]


@pytest.mark.slow
def test_a_closed_stdout_never_stops_a_run(tmp_path: Path) -> None:
    """`bench pair --quiet | head -2`: the reader goes after two lines; the run finishes all the same."""
    with started([*QUIET_FIT, "--out", str(tmp_path)], text=False) as process:
        head = [process.stdout.readline() for _ in range(2)]
        process.stdout.close()
        err = process.stderr.read().decode()
        process.wait(timeout=300)
    assert all(head) and process.returncode == 0, err
    assert "BrokenPipe" not in err and "Exception ignored" not in err, err
    folder = only_run(tmp_path)
    assert [r["index"] for r in folder.rows()] == [0, 1]
    assert folder.file("claim.txt").is_file() and folder.file("report.md").is_file()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
def test_the_log_is_fsynced_after_every_row(tmp_path: Path, monkeypatch) -> None:
    """Each row is on disk before the next trial starts: one fsync of the log per row, after its bytes."""
    real_fsync, synced = os.fsync, []

    def fsync(fd: int) -> None:
        target = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if target.name == LOG:
            synced.append(target.read_bytes().count(b"\n"))  # rows in the file at the moment of the fsync
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    folder = runner(tmp_path).start(plan_of("sleepy", warmup=1, pairs=2)).folder
    assert len(folder.rows()) == 5
    assert synced == [1, 2, 3, 4, 5]
