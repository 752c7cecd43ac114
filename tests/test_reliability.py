"""The run folder under faults and hostile input: nothing lost, nothing run twice, nothing misleading.

Two runs on one folder, non-finite results, failed writes, absurd counts, corrupt files, markup in user text,
unwritable outputs, arms that cannot be built, interrupts and closed pipes, options that a resume would
ignore; and the two promises no other test sees (the log is fsynced per row, the timer synchronizes right
before each clock read).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.cli import main
from harness.tables import RunFolder, RunFolderBusy
from tests.trialfns import plan_of, runner

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


def _tiers_with_a_claim():
    """The test tier, with a claim (so a run writes claim.txt)."""
    from harness.tier import BaseTier, TierRegistry
    from tests.trialfns import BEHAVIOURS

    return TierRegistry(
        [
            BaseTier(
                "test",
                trial_function=lambda plan: BEHAVIOURS[plan.settings["behaviour"]](plan),
                claim=lambda run: "a claim\n",
            )
        ]
    )


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


# --- non-finite results ----------------------------------------------------------------------------------

TINY_FIT = ["--workload", "embedded", "--images", "8", "--batch", "4", "--steps", "4", "--val-images", "8"]


@pytest.mark.parametrize("figure", ["nan", "inf", "-inf"])
def test_a_non_finite_value_is_an_error_row_not_a_figure(tmp_path: Path, figure: str) -> None:
    figures = {"baseline": [10, 10], "candidate": [8, figure]}
    folder = runner(tmp_path).start(plan_of("scripted", warmup=0, pairs=2, figures=figures)).folder
    rows = {(r["arm"], r["round"]): r for r in folder.rows()}
    bad = rows[("candidate", 1)]
    assert bad["status"] == "error" and bad["value"] is None
    assert bad["message"].startswith("non-finite value:") and figure in bad["message"], bad["message"]
    assert rows[("candidate", 0)]["status"] == "ok"


@pytest.mark.parametrize("figure", [0, -2.5])
def test_a_time_of_zero_or_less_is_an_error_row_where_arms_are_compared_by_ratio(
    tmp_path: Path, figure: float
) -> None:
    """A ratio needs two positive figures: a trial timed at 0 (or less) is a failed trial, never a -100%
    'infinitely faster' arm nor a crash of the statistics."""
    figures = {"baseline": [10, 10], "candidate": [8, figure]}
    folder = runner(tmp_path).start(plan_of("scripted", warmup=0, pairs=2, figures=figures)).folder
    rows = {(r["arm"], r["round"]): r for r in folder.rows()}
    bad = rows[("candidate", 1)]
    assert bad["status"] == "error" and bad["value"] is None, bad
    assert bad["message"].startswith("non-positive value:") and "ratio" in bad["message"], bad["message"]
    assert folder.file("report.md").exists() or folder.file("claims.csv").exists()


@pytest.mark.parametrize("figure", [0, 0.0, -1.5])
def test_a_logged_time_of_zero_or_less_is_one_line_from_report(
    finished_run: RunFolder, tmp_path: Path, figure: float
) -> None:
    rows = [json.loads(line) for line in finished_run.file("trials.jsonl").read_text().splitlines()]
    measured = next(r for r in rows if r["phase"] == "measured" and r["status"] == "ok")
    measured["value"] = figure
    folder = _copy(finished_run, tmp_path / "run")
    folder.file("trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    stderr = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        status = main(["report", str(folder.path), "-o", str(tmp_path / "r.md")])
    text = stderr.getvalue().strip()
    assert status == 2 and text.count("\n") == 0, text
    assert f"trial {measured['index']}'s value is {figure}" in text and "positive" in text, text


@pytest.mark.parametrize("returned", [None, "8 ms", True, [8.0]])
def test_a_value_that_is_not_a_number_is_an_error_row(tmp_path: Path, returned) -> None:
    folder = runner(tmp_path).start(plan_of("returns", warmup=0, pairs=1, returned=returned)).folder
    for row in folder.rows():
        assert row["status"] == "error" and "value" in row["message"] and row["value"] is None, row


def test_the_fit_worker_names_every_non_finite_figure_and_parameter() -> None:
    from experiments.fit.fitting import non_finite_results

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    assert (
        non_finite_results({"train_loss": 0.5, "val_loss": 1.0, "val_accuracy": 0.2}, {"model": model}) == []
    )
    with torch.no_grad():
        model[1].weight[0, 1] = float("inf")
    problems = non_finite_results(
        {"train_loss": float("nan"), "val_loss": 1.0, "val_map50": float("nan"), "val_map50_95": None},
        {"model": model},
    )
    assert problems == ["train_loss nan", "val_map50 nan", "model parameter 1.weight (1 of 2 entries)"]


@pytest.mark.slow
def test_a_fit_whose_last_step_writes_nan_fails_as_non_finite(tmp_path: Path) -> None:
    """The issue's case: NaN written at the last step gave status ok, val_loss null and a 15% "reduction"."""
    arms = "baseline,tests.workerfns:NaNAtLastStep"
    command = ["pair", *TINY_FIT, "--arms", arms, "--warmup", "0", "--pairs", "1", "--quiet", "--no-report"]
    assert main([*command, "--out", str(tmp_path)]) == 3  # every trial of the NaN arm failed
    rows = {r["arm"]: r for r in _only_folder(tmp_path).rows()}
    assert rows["baseline"]["status"] == "ok", rows["baseline"]["message"]
    failed = rows["tests.workerfns:NaNAtLastStep"]
    assert failed["status"] == "error" and failed["value"] is None
    assert "non-finite" in failed["message"] and "parameter" in failed["message"], failed["message"]
    assert "val_loss nan" in failed["message"], failed["message"]
    folder = _only_folder(tmp_path)
    assert sorted(p.name for p in (folder.path / "trials").iterdir()) == ["0.log", "1.log"]  # logs only
    claim = folder.file("claim.txt").read_text()
    assert "1 of 1 tests.workerfns:NaNAtLastStep trials failed" in claim  # never a "faster" NaN


# --- writes that complete or leave the folder as it was ----------------------------------------------------


def _tmp_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.name.endswith(".tmp"))


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 200 KiB tmpfs (root and a kernel that allows it), grown to 64 MiB by calling the yielded function."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(mount)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")

    def grow() -> None:
        subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)

    try:
        yield mount, grow
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fail_writes_to(monkeypatch, name: str, call: int = 1):
    """Make the ``call``-th ``os.write`` into a file named ``name`` write half its bytes and raise ENOSPC."""
    import errno

    real_write, seen = os.write, []

    def write(fd: int, data) -> int:
        target = os.readlink(f"/proc/self/fd/{fd}") if os.path.exists(f"/proc/self/fd/{fd}") else ""
        if Path(target).name == name:
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
    from harness.folder_format import LOG
    from harness.tables import RunFolderWriteError

    plan = plan_of("sleepy", warmup=0, pairs=2)
    _fail_writes_to(monkeypatch, LOG, call=3)
    with pytest.raises(RunFolderWriteError) as stopped:
        runner(tmp_path).start(plan)
    message = str(stopped.value)
    assert "\n" not in message and "No space left on device" in message and LOG in message, message
    folder = _only_folder(tmp_path)
    assert f"--resume {folder.path}" in message and "trial 3" in message, message
    assert folder.file(LOG).read_bytes().endswith(b"\n")  # the half-written row was taken back
    assert [r["index"] for r in folder.rows()] == [0, 1]
    assert _tmp_files(folder.path) == []
    monkeypatch.undo()
    runner(tmp_path).resume(folder.path)
    scheduled = [r["index"] for r in folder.rows() if r["index"] < 4]  # the resume's own warm-up is index 4
    assert scheduled == [0, 1, 2, 3]  # trial 3 ran again, nothing twice


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
def test_a_row_that_cannot_be_written_in_a_duet_round_stops_the_run_too(tmp_path: Path, monkeypatch) -> None:
    """A duet round runs its trials in threads: a failed write there must stop the run, not vanish."""
    from harness.folder_format import LOG
    from harness.tables import RunFolderWriteError

    plan = plan_of("sleepy", warmup=0, pairs=2, order="duet")
    plan.in_process = False  # a concurrent order is for worker tiers; the trials here need no worker
    _fail_writes_to(monkeypatch, LOG, call=2)
    with pytest.raises(RunFolderWriteError, match="No space left on device.*--resume"):
        runner(tmp_path).start(plan)
    folder = _only_folder(tmp_path)
    assert len(folder.rows()) == 1 and _tmp_files(folder.path) == []
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
    from harness.tables import RunFolderWriteError

    figures = {"baseline": [10, 10], "candidate": [8, 9]}
    tiers = _tiers_with_a_claim()
    _fail_writes_to(monkeypatch, table + ".tmp")
    with pytest.raises(RunFolderWriteError, match=f"{table}.*No space left on device.*--resume"):
        runner(tmp_path, tiers=tiers).start(plan_of("scripted", warmup=0, pairs=2, figures=figures))
    folder = _only_folder(tmp_path)
    assert _tmp_files(folder.path) == [] and not folder.file(table).exists()
    assert len(folder.rows()) == 4  # every trial is in the log
    monkeypatch.undo()
    runner(tmp_path, tiers=tiers).resume(folder.path)  # nothing left to run: the tables are written
    assert folder.file(table).is_file()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
def test_a_table_that_cannot_be_rewritten_between_rounds_stops_there_and_resume_finishes(
    tmp_path: Path, monkeypatch
) -> None:
    """The tables are rewritten between rounds as the run goes (``TABLES_REFRESH_SECONDS``): a write that fails
    there stops the run before the next round with one line naming --resume, every finished trial kept."""
    import harness.run
    from harness.tables import RunFolderWriteError

    monkeypatch.setattr(harness.run, "TABLES_REFRESH_SECONDS", 0.0)
    figures = {"baseline": [10, 10, 10], "candidate": [8, 9, 8]}
    _fail_writes_to(monkeypatch, "pairs.csv.tmp")
    with pytest.raises(RunFolderWriteError, match=r"pairs\.csv.*No space left on device.*--resume"):
        runner(tmp_path).start(plan_of("scripted", warmup=0, pairs=3, figures=figures))
    folder = _only_folder(tmp_path)
    assert _tmp_files(folder.path) == [] and not folder.file("pairs.csv").exists()
    assert sorted(r["index"] for r in folder.rows()) == [0, 1]  # round 1 whole; round 2 never started
    monkeypatch.undo()
    runner(tmp_path).resume(folder.path)
    assert sorted(r["round"] for r in folder.rows() if r["phase"] == "measured") == [0, 0, 1, 1, 2, 2]
    assert len(pd.read_csv(folder.file("pairs.csv"))) == 3


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
def test_a_run_folder_that_cannot_be_set_up_is_removed(tmp_path: Path, monkeypatch) -> None:
    from harness.tables import RunFolderWriteError

    _fail_writes_to(monkeypatch, "env.json.tmp")
    with pytest.raises(RunFolderWriteError, match="env.json.*No space left on device.*nothing was run"):
        runner(tmp_path / "runs").start(plan_of("sleepy", warmup=0, pairs=1))
    assert not any((tmp_path / "runs").iterdir())


@pytest.mark.slow
def test_a_full_disk_stops_a_fit_with_one_line_and_resume_finishes(tiny_disk, capsys) -> None:
    """The issue's case on a real 200 KiB tmpfs: the first checkpoint fills it."""
    disk, grow = tiny_disk
    command = ["pair", *TINY_FIT, "--warmup", "0", "--pairs", "1", "--quiet", "--no-report"]
    assert main([*command, "--out", str(disk)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "No space left on device" in error and "--resume" in error, error
    folder = _only_folder(disk)
    assert _tmp_files(disk) == []
    assert folder.rows() == []  # the trial that hit the full disk has no row: it runs again on resume
    # The untimed first trial (the estimate before any trial) hit the full disk, in a folder since removed.
    assert sorted(p.name for p in folder.path.iterdir() if p.is_dir()) == []
    grow()
    assert main(["pair", "--resume", str(folder.path), "--quiet", "--no-report"]) == 0
    assert [r["index"] for r in folder.rows()] == [0, 1]
    assert all(r["status"] == "ok" for r in folder.rows())
    assert sorted(p.name for p in (folder.path / "trials").iterdir()) == ["0.log", "1.log"]


# --- one validation of a run folder's files --------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> RunFolder:
    """A finished run folder of the test tier: one warm-up and two pairs."""
    root = tmp_path_factory.mktemp("finished")
    return runner(root).start(plan_of("sleepy", warmup=1, pairs=2)).folder


def _copy(folder: RunFolder, where: Path) -> RunFolder:
    import shutil

    shutil.copytree(folder.path, where)
    return RunFolder(where)


def _plan_with(folder: RunFolder, change) -> str:
    import json

    plan = json.loads(folder.file("plan.json").read_text())
    change(plan)
    return json.dumps(plan)


def _dropped(key: str):
    return lambda plan: plan.pop(key)


def _set(path: str, value):
    def change(plan: dict) -> None:
        *parents, last = path.split(".")
        target = plan
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[int(last) if last.isdigit() else last] = value

    return change


CORRUPT_PLANS = {
    "not JSON": ('{"tier": "test", ', "plan.json: not JSON"),
    "not UTF-8": (b"\xff\xfe{}", "plan.json: not JSON"),
    "an empty object": ("{}", "plan.json: not a plan: missing key"),
    "a list": ("[1, 2]", "plan.json holds a list, not a plan (a JSON object)"),
    "a number": ("7", "plan.json holds a number, not a plan"),
    "no schedule": (_dropped("schedule"), "plan.json: not a plan: missing key 'schedule'"),
    "no cases": (_dropped("cases"), "missing key 'cases'"),
    "pairs a string": (
        _set("protocol.pairs", "three"),
        "protocol.pairs is 'three', which no run can have",
    ),  # auto or ≥ 1
    "an index a string": (_set("schedule.0.index", "abc"), "schedule[0].index is 'abc', not a whole number"),
    "cases a string": (_set("cases", "x"), "plan.json: not a plan"),
    "a trial of no case": (_set("schedule.1.case", "elsewhere"), "schedule[1] names case 'elsewhere'"),
    # Unique, not dense: rounds --pairs auto adds take indices above a resume's extra warm-up.
    "an index repeated": (
        _set("schedule.1.index", 0),
        "schedule[1].index is 0, which is negative or an earlier",
    ),
    "an index negative": (_set("schedule.1.index", -1), "schedule[1].index is -1, which is negative"),
    "an unknown role": (_set("protocol.arms.0.role", "referee"), "role 'referee'"),
    "an empty schedule": (_set("schedule", []), "plan.json: the schedule is empty"),
    "no arms": (_set("protocol.arms", []), "protocol.arms is empty"),
    "a number past the parser's limit": ('{"seed": 1' + "0" * 5000 + "}", "plan.json: not JSON"),
    # Each protocol value a resume or report acts on, held to the bound its option is checked against.
    "ranks past the most": (_set("protocol.gpus", 2000), "protocol.gpus is 2000"),
    "no ranks": (_set("protocol.gpus", 0), "protocol.gpus is 0"),
    "a cool-down of ages": (_set("protocol.cooldown", 1e300), "protocol.cooldown is 1e+300"),
    "a tolerance not positive": (_set("protocol.tolerance", -5.0), "protocol.tolerance is -5.0"),
    "a time budget negative": (_set("protocol.time_budget", -1.0), "protocol.time_budget is -1.0"),
    "a device that is none": (_set("protocol.device", "tpu"), "protocol.device is 'tpu'"),
    "cpus that are no core list": (_set("protocol.cpus", "lots"), "protocol.cpus is 'lots'"),
    "a seed past the generators": (_set("protocol.seed", 2**64), "protocol.seed is 18446744073709551616"),
    "pairs past the most": (_set("protocol.pairs", 20_000), "protocol.pairs is 20000"),
    "warm-ups past the most": (_set("protocol.warmup", 5_000), "protocol.warmup is 5000"),
    "a precision of none": (_set("protocol.precision", -2.0), "protocol.precision is -2.0"),
}


def _corrupt_plan(folder: RunFolder, how) -> None:
    text = _plan_with(folder, how) if callable(how) else how
    path = folder.file("plan.json")
    path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)


def _refused_in_one_line(command: list[str], capsys, *fragments: str) -> str:
    capsys.readouterr()
    assert main(command) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0, error
    for fragment in fragments:
        assert fragment in error, error
    return error


def _untouched(folder: RunFolder) -> dict[str, tuple[bytes, int]]:
    """Each file's bytes and modification time: a refused command changes neither, run.lock included (its
    holder's pid was rewritten by a resume refused after taking the lock)."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.path.iterdir() if p.is_file()}


@pytest.mark.parametrize("case", list(CORRUPT_PLANS))
def test_a_corrupt_plan_is_one_line_naming_it_for_report_and_resume(
    finished_run: RunFolder, tmp_path: Path, capsys, case: str
) -> None:
    from harness.tables import CorruptRunFolder

    how, fragment = CORRUPT_PLANS[case]
    folder = _copy(finished_run, tmp_path / "run")
    _corrupt_plan(folder, how)
    before = _untouched(folder)
    _refused_in_one_line(["report", str(folder.path), "-o", str(tmp_path / "r.md")], capsys, fragment)
    _refused_in_one_line(["pair", "--resume", str(folder.path)], capsys, fragment)
    with pytest.raises(CorruptRunFolder, match="plan.json"):
        runner(tmp_path).resume(folder.path)
    assert _untouched(folder) == before  # nothing written (run.lock neither), nothing run


@pytest.mark.parametrize("pairs", [2, "auto"])
def test_a_resume_with_nothing_left_to_run_makes_no_trial_function(tmp_path: Path, pairs) -> None:
    """A finished run resumed (to rewrite its tables) makes no trial function: the fit tier's builds the
    synthetic data set first (under the plan's data_cache, relative to wherever the resume runs), for trials
    that will never run. With --pairs auto, a run whose last look stopped it is as finished."""
    from harness.tier import BaseTier, TierRegistry
    from tests.trialfns import TIERS

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
    """A plan placed on cores of the machine it started on (``--cpus 0-4095``) resumed where they are not is
    refused in one line naming the plan's value and this machine's cores: not a ValueError traceback."""
    folder = _copy(finished_run, tmp_path / "run")
    _corrupt_plan(folder, _set("protocol.cpus", "0-4095"))
    before = _untouched(folder)
    from harness.errors import InputError

    with pytest.raises(InputError, match=r"--cpus 0-4095 recorded in the plan: core\(s\) .* are not among"):
        runner(tmp_path).resume(folder.path)
    assert _untouched(folder) == before


def _drop_last_row(folder: RunFolder) -> None:
    log = folder.file("trials.jsonl")
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:-1]))


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks a resume where the plan's CUDA device is absent"
)
def test_a_resume_where_the_runs_cuda_device_is_absent_is_one_line(
    finished_run: RunFolder, tmp_path: Path
) -> None:
    """A CUDA run resumed on a machine without CUDA ran every trial left, each an error row (and grew a
    stopping rule's schedule to its end): refused before anything is written, naming the device."""
    from harness.errors import InputError

    folder = _copy(finished_run, tmp_path / "run")
    _corrupt_plan(folder, _set("protocol.device", "cuda"))
    _drop_last_row(folder)
    before = _untouched(folder)
    with pytest.raises(InputError, match="the run is on cuda, and this machine has 0 CUDA devices"):
        runner(tmp_path).resume(folder.path)
    assert _untouched(folder) == before


def test_a_resume_refused_for_its_budget_leaves_env_json_as_it_was(
    finished_run: RunFolder, tmp_path: Path
) -> None:
    """The budget of an in-process plan is applied after the resume was recorded in env.json: a budget this
    device refuses left a resume in the record that never ran."""
    from harness.errors import InputError

    folder = _copy(finished_run, tmp_path / "run")

    def in_process_with_a_budget(plan: dict) -> None:
        plan["in_process"] = True
        plan["protocol"]["budget"] = 1000

    _corrupt_plan(folder, in_process_with_a_budget)
    _drop_last_row(folder)
    before = _untouched(folder)
    with pytest.raises(InputError, match="--budget"):
        runner(tmp_path).resume(folder.path)
    assert _untouched(folder) == before


@pytest.mark.parametrize(
    ("command", "fragment"),
    [
        (["screen", "--device", "cpu", "--scales", "n", "--order", "duet"], "in this process"),
        (["probe", "--device", "cpu", "--order", "duet"], "in this process"),
        (["pair", "--workload", "embedded", "--order", "duet", "--cpus", "0"], "2 worker cores"),
    ],
)
def test_a_concurrent_order_the_run_cannot_keep_is_refused_before_any_folder(
    tmp_path: Path, capsys, command: list[str], fragment: str
) -> None:
    """``--order duet`` on a tier whose trials run in this process, or with fewer worker cores than arms
    at once, raised a ValueError traceback after the run folder was made: one line, no folder."""
    out = tmp_path / "runs"
    _refused_in_one_line([*command, "--out", str(out)], capsys, "--order duet", fragment)
    assert not out.exists()


def test_a_parity_candidate_that_is_the_baseline_is_refused_before_any_trial(tmp_path: Path, capsys) -> None:
    """``parity --candidate baseline`` ran both trials, then called its own plan corrupt (a case repeating an
    arm) and left a folder no command would take: refused up front, in one line naming --candidate."""
    _refused_in_one_line(
        ["parity", "--device", "cpu", "--candidate", "baseline", "--out", str(tmp_path)],
        capsys,
        "--candidate baseline is the baseline",
    )
    assert list(tmp_path.iterdir()) == []


def test_a_core_list_past_any_machine_is_one_line_not_a_memory_kill(tmp_path: Path, capsys) -> None:
    """``--cpus 0-999999999`` was expanded core by core before the bounds check: 24 GB, then the kernel's kill."""
    _refused_in_one_line(
        [*EMBEDDED, "--cpus", "0-999999999", "--out", str(tmp_path)], capsys, "--cpus", "999999999"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_guard_past_any_count_is_one_line(tmp_path: Path, capsys) -> None:
    """Every other count is capped; a guard of 10^22 ran, and could only fail inside every trial on CUDA."""
    command = ["screen", "--device", "cpu", "--scales", "n", "--steps", "1", "--pairs", "1", "--warmup", "0"]
    _refused_in_one_line([*command, "--guards", "9" * 23, "--out", str(tmp_path)], capsys, "--guards")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [("gpu_memory_bytes", [10**400]), ("cpu_count", 10**400), ("gpus_start", [{"power_w": 10**400}])],
)
def test_an_env_record_with_a_number_past_floats_is_one_line(
    finished_run: RunFolder, tmp_path: Path, capsys, field: str, value
) -> None:
    """env.json's shape check took an integer of 400 digits as an int (or a float), and the report's
    formatting then raised OverflowError (a traceback, and a figures folder left behind)."""
    folder = _copy(finished_run, tmp_path / "run")
    record = json.loads(folder.file("env.json").read_text())
    record[field] = value
    folder.file("env.json").write_text(json.dumps(record))
    _refused_in_one_line(
        ["report", str(folder.path), "-o", str(tmp_path / "r.md")], capsys, "env.json", field
    )
    assert not (tmp_path / "r.md").exists() and not (tmp_path / "r-figures").exists()


# A committed H200 run folder of each project tier: a report reads it anywhere, and a finished screen resumes
# on the CPU too (nothing is left to run), so each tier's own check of its recorded settings is seen here.
TIER_FOLDERS = {
    "screen": ROOT / "reports/h200-decisive/screen/screen-20261202-020126-5cf4",
    "pair": ROOT / "reports/archive/h200-2026-12-01/aa-placed-sequential-384",
    "stages": ROOT / "reports/h200-decisive/stages-baseline/stages-20261202-020854-c8f7",
    "parity": ROOT / "reports/h200-decisive/parity/parity-20261202-020331-f306",
    "probe": ROOT / "reports/h200-decisive/probe-lm-24GiB/probe-20261202-021522-e4fe",
}
EDITED_SETTINGS = {
    "screen: steps negative": ("screen", _set("settings.steps", -1), "--steps must be a positive"),
    "screen: a dtype it has not": ("screen", _set("settings.dtype", "float8"), "--dtype 'float8'"),
    "screen: a scale it has not": ("screen", _set("settings.scales", ["q"]), "--scales 'q'"),
    "screen: scales not its cases": ("screen", _set("settings.scales", ["n"]), "settings.scales"),
    "screen: no settings": ("screen", _set("settings", {}), "settings has no scales"),
    "screen: called a pair": ("screen", _set("tier", "pair"), "settings has no workload"),
    "screen: called a probe": ("screen", _set("tier", "probe"), "settings has no head"),
    "pair: steps negative": ("pair", _set("settings.steps", -1), "--steps must be a positive"),
    "pair: an amp it has not": ("pair", _set("settings.amp", "float8"), "--amp 'float8'"),
    "pair: no batch": ("pair", _set("settings.batch", 0), "--batch must be a positive"),
    "pair: no settings": ("pair", _set("settings", {}), "settings has no workload"),
    "pair: steps not its epochs": ("pair", _set("settings.steps", 100), "--steps 100 is not a whole number"),
    "pair: called stages": ("pair", _set("tier", "stages"), "settings.stages is false"),
    "pair: called a screen": ("pair", _set("tier", "screen"), "settings has no scales"),
    "pair: called parity": ("pair", _set("tier", "parity"), "settings has no scale"),
    "stages: called a pair": ("stages", _set("tier", "pair"), "settings.stages is true"),
    "parity: a scale it has not": ("parity", _set("settings.scale", "q"), "--scale 'q'"),
    "parity: no steps": ("parity", _set("settings.steps", 0), "--steps must be a positive"),
    "parity: called a probe": ("parity", _set("tier", "probe"), "settings has no head"),
    "probe: a head it has not": ("probe", _set("settings.head", "eye"), "--head 'eye'"),
    "probe: a variant it has not": ("probe", _set("settings.variants", ["wide"]), "--variants 'wide'"),
    "probe: a learner time negative": ("probe", _set("settings.learner_ms", -1.0), "--learner-ms -1.0"),
    "probe: a reserve negative": ("probe", _set("settings.reserve_bytes", -1), "settings.reserve_bytes"),
}


@pytest.mark.parametrize("case", list(EDITED_SETTINGS))
def test_a_plan_whose_tier_settings_no_run_can_have_is_one_line(tmp_path: Path, capsys, case: str) -> None:
    """An edited plan.json whose tier, or the settings its tier records, are values no run of that tier could
    have is refused in one line by its tier's own checks (the ones its options get), before a report or a
    resume reads them: not a traceback, nor a report of a fit of -1 steps, nor a resume that runs them."""
    from experiments.tiers import TIERS
    from harness.tables import CorruptRunFolder
    from harness.tier import Run

    tier, how, fragment = EDITED_SETTINGS[case]
    folder = _copy(RunFolder(TIER_FOLDERS[tier]), tmp_path / "run")
    _corrupt_plan(folder, how)
    before = {p.name: p.read_bytes() for p in folder.path.iterdir() if p.is_file()}
    _refused_in_one_line(
        ["report", str(folder.path), "-o", str(tmp_path / "r.md")], capsys, "plan.json", fragment
    )
    if tier == "screen":
        _refused_in_one_line(["screen", "--resume", str(folder.path)], capsys, "plan.json", fragment)
    with pytest.raises(CorruptRunFolder, match=re.escape(fragment)):
        Run.load(folder, tiers=TIERS)
    assert {p.name: p.read_bytes() for p in folder.path.iterdir() if p.is_file()} == before
    assert not (tmp_path / "r.md").exists()


def _log_with(folder: RunFolder, edit) -> None:
    lines = folder.file("trials.jsonl").read_text().splitlines(keepends=True)
    folder.file("trials.jsonl").write_text("".join(edit(lines)))


def _row_field(number: int, key: str, raw: str):
    """Line ``number`` (1-based) of the log with ``key`` set to the JSON text ``raw``, written as is."""
    import json

    def edit(lines: list[str]) -> list[str]:
        row = json.loads(lines[number - 1])
        row[key] = "@@raw@@"
        lines = list(lines)
        lines[number - 1] = json.dumps(row).replace('"@@raw@@"', raw) + "\n"
        return lines

    return edit


CORRUPT_LOGS = {
    "an empty row": (lambda lines: [*lines[:2], "{}\n", *lines[2:]], "line 3: no 'index'"),
    "an index that is text": (
        lambda lines: [*lines[:2], '{"index": "abc"}\n', *lines[2:]],
        "line 3: 'index' is 'abc', not a whole number",
    ),
    "garbage in the middle": (lambda lines: [lines[0], "hello\n", *lines[1:]], "line 2: not JSON"),
    "a row that is a list": (lambda lines: [*lines, "[1]\n"], "line 6: not a JSON object"),
    "a trial not in the plan": (
        lambda lines: [*lines[:-1], lines[-1].replace('"index": 4', '"index": 40')],
        "line 5: trial 40 is not in the plan",
    ),
    "a warm-up after a gap of an arm not in the plan": (
        lambda lines: [
            *lines,
            '{"index": 9, "case": "c", "phase": "warmup", "round": 0, "arm": "other", "role": "candidate", '
            '"status": "ok", "value": 1.0, "warmup_reason": "after a resume"}\n',
        ],
        "line 6: trial 9 is a warm-up outside the schedule of arm 'other'",
    ),
    "a row of another arm": (
        lambda lines: [lines[0].replace('"arm": "baseline"', '"arm": "other"'), *lines[1:]],
        "line 1: trial 0's arm is 'other', the plan says 'baseline'",
    ),
    "an ok row with no value": (
        lambda lines: [lines[0].replace('"value": 10.0', '"value": null'), *lines[1:]],
        "line 1: trial 0 is 'ok' with no value",
    ),
    "an unknown status": (
        lambda lines: [lines[0].replace('"status": "ok"', '"status": "fine"'), *lines[1:]],
        "line 1: trial 0 has status 'fine'",
    ),
    "not UTF-8": (lambda lines: [*lines[:1], "\udcff\n", *lines[1:]], "line 2: not UTF-8"),
    # Found by a hostile-input review: each was a traceback, a silently wrong figure or a doubled trial.
    "a trial logged twice": (
        lambda lines: [*lines, lines[1]],
        "line 6: trial 1 is logged twice (first on line 2)",
    ),
    "a start that is no time": (_row_field(2, "started", '"not a date"'), "line 2: trial 1's started is"),
    "a duration that is text": (
        _row_field(2, "trial_seconds", '"abc"'),
        "line 2: trial 1's trial_seconds is",
    ),
    "a negative duration": (
        _row_field(2, "trial_seconds", "-100.0"),
        "line 2: trial 1's trial_seconds is -100.0",
    ),
    "an endless duration": (_row_field(2, "trial_seconds", "1e308"), "line 2: trial 1's trial_seconds is"),
    "a telemetry share that is text": (_row_field(2, "cpu_busy_share", '"x"'), "trial 1's cpu_busy_share is"),
    "a start load that is text": (_row_field(2, "load1_start", '"high"'), "trial 1's load1_start is"),
    # Finite, yet past what the field can be: the flags and plots squared them into numpy overflow warnings.
    "a busy share past all time": (
        _row_field(2, "cpu_busy_share", "1e308"),
        "trial 1's cpu_busy_share is 1e+308, not a number from 0 to 1 or null",
    ),
    "a steal share negative": (_row_field(2, "cpu_steal_share", "-1e308"), "trial 1's cpu_steal_share is"),
    "a start load of 1e308": (_row_field(2, "load1_start", "1e308"), "trial 1's load1_start is 1e+308"),
    "no logical cores": (_row_field(2, "cpu_logical", "0"), "trial 1's cpu_logical is 0"),
    "telemetry longer than any trial": (_row_field(2, "telemetry_seconds", "1e308"), "telemetry_seconds"),
    "a value below any figure": (_row_field(2, "value", "1e-320"), "line 2: trial 1's value is 1e-320"),
    "a value of 400 digits": (_row_field(2, "value", "1" + "0" * 400), "line 2: trial 1's value is"),
    "a number past the parser's limit": (_row_field(2, "value", "1" + "0" * 5000), "line 2: not JSON"),
}


@pytest.mark.parametrize("case", list(CORRUPT_LOGS))
def test_a_corrupt_log_is_one_line_naming_the_line_for_report_and_resume(
    finished_run: RunFolder, tmp_path: Path, capsys, case: str
) -> None:
    from harness.tables import CorruptRunFolder

    edit, fragment = CORRUPT_LOGS[case]
    folder = _copy(finished_run, tmp_path / "run")
    path = folder.file("trials.jsonl")
    lines = path.read_text().splitlines(keepends=True)
    path.write_bytes("".join(edit(lines)).encode("utf-8", "surrogateescape"))
    before = path.read_bytes()
    _refused_in_one_line(
        ["report", str(folder.path), "-o", str(tmp_path / "r.md")], capsys, "trials.jsonl", fragment
    )
    _refused_in_one_line(["pair", "--resume", str(folder.path)], capsys, "trials.jsonl", fragment)
    with pytest.raises(CorruptRunFolder, match="trials.jsonl"):
        runner(tmp_path).resume(folder.path)
    assert path.read_bytes() == before


def test_a_torn_last_line_is_still_ignored_and_cut_by_the_next_append(
    finished_run: RunFolder, tmp_path: Path, capsys
) -> None:
    folder = _copy(finished_run, tmp_path / "run")
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


def test_every_committed_run_folder_still_validates() -> None:
    """Every committed run folder passes the validation and its own tier's check of its settings."""
    from experiments.tiers import TIERS
    from harness.tier import Run

    folders = sorted(p.parent for p in (ROOT / "reports").rglob("plan.json"))
    assert folders
    for path in folders:
        Run.load(RunFolder(path), tiers=TIERS)  # raises for anything the validation refuses


# --- fuzz: random bytes and random JSON give a run or one line and exit 2 -----------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
PLAN_KEYS = ("tier", "protocol", "cases", "schedule", "unit", "metric", "settings", "format")


def _report_or_one_line(folder: RunFolder, out: Path) -> None:
    """``bench report`` of the folder gives a report (exit 0) or one line on stderr and exit 2, nothing else."""

    stderr = io.StringIO()
    # The error console writes to whatever sys.stderr is at the time: redirect it, never pin the console's
    # file (reading Console.file returns this test's captured stream, and setting it back pinned every later
    # test's errors to it).
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        status = main(["report", str(folder.path), "-o", str(out)])
    text = stderr.getvalue().strip()
    assert status in (0, 2), text
    if status == 2:
        assert text.startswith("bench: error: ") and text.count("\n") == 0, text


FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@FUZZ
@given(content=st.binary(max_size=300) | JSON.map(lambda v: json.dumps(v).encode()))
def test_fuzz_plan_files_give_a_report_or_one_line(
    finished_run: RunFolder, tmp_path: Path, content: bytes
) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
        folder = _copy(finished_run, Path(scratch) / "run")
        folder.file("plan.json").write_bytes(content)
        _report_or_one_line(folder, Path(scratch) / "r.md")


@FUZZ
@given(key=st.sampled_from(PLAN_KEYS), value=JSON, drop=st.booleans())
def test_fuzz_one_plan_field_changed_gives_a_report_or_one_line(
    finished_run: RunFolder, tmp_path: Path, key: str, value, drop: bool
) -> None:
    plan = json.loads(finished_run.file("plan.json").read_text())
    plan.pop(key) if drop else plan.__setitem__(key, value)
    with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
        folder = _copy(finished_run, Path(scratch) / "run")
        folder.file("plan.json").write_text(json.dumps(plan))
        _report_or_one_line(folder, Path(scratch) / "r.md")


@FUZZ
@given(
    where=st.integers(0, 5),
    line=st.binary(max_size=120) | JSON.map(lambda v: json.dumps(v).encode()),
    torn=st.booleans(),
)
def test_fuzz_log_lines_give_a_report_or_one_line(
    finished_run: RunFolder, tmp_path: Path, where: int, line: bytes, torn: bool
) -> None:
    lines = finished_run.file("trials.jsonl").read_bytes().splitlines(keepends=True)
    lines.insert(where, line if torn and where == len(lines) else line.replace(b"\n", b" ") + b"\n")
    with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
        folder = _copy(finished_run, Path(scratch) / "run")
        folder.file("trials.jsonl").write_bytes(b"".join(lines))
        _report_or_one_line(folder, Path(scratch) / "r.md")


@FUZZ
@given(
    field=st.sampled_from(["index", "case", "phase", "round", "arm", "role", "status", "value", "message"]),
    value=JSON,
)
def test_fuzz_one_row_field_changed_gives_a_report_or_one_line(
    finished_run: RunFolder, tmp_path: Path, field: str, value
) -> None:
    rows = [json.loads(line) for line in finished_run.file("trials.jsonl").read_text().splitlines()]
    rows[2][field] = value
    with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
        folder = _copy(finished_run, Path(scratch) / "run")
        folder.file("trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        _report_or_one_line(folder, Path(scratch) / "r.md")


ENV_KEYS = (
    *("recorded", "boot_id", "gpus_start", "gpus_end", "resumes", "gpu_names", "gpu_memory_bytes"),
    *("git_revision", "git_dirty", "placement", "load1_start", "cpu_logical", "cudnn", "driver_version"),
    *("index", "name", "uuid", "sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w", "gpus"),
)


@settings(
    FUZZ, max_examples=25
)  # a field the report takes renders a whole report (about 1 s): fewer examples
@given(key=st.sampled_from(ENV_KEYS), value=JSON, inside=st.sampled_from(["", "resumes", "gpus_start"]))
def test_fuzz_one_environment_field_changed_gives_a_report_or_one_line(
    finished_run: RunFolder, tmp_path: Path, key: str, value, inside: str
) -> None:
    """env.json is read by every report (the machines, clocks and revisions of each slice): a field of the
    record, of a resume or of a GPU snapshot that is not what the recorder writes is one line, not a crash
    (a list of resumes that held a string raised AttributeError)."""
    record = json.loads(finished_run.file("env.json").read_text())
    if inside == "resumes":
        record["resumes"] = [{"recorded": "2026-12-01T16:00:00+00:00", "boot_id": "b", key: value}]
    elif inside == "gpus_start":
        record["gpus_start"] = [{"index": 0, "name": "NVIDIA H200", key: value}]
    else:
        record[key] = value
    with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
        folder = _copy(finished_run, Path(scratch) / "run")
        folder.file("env.json").write_text(json.dumps(record))
        _report_or_one_line(folder, Path(scratch) / "r.md")


def test_a_list_of_resumes_that_is_not_one_is_one_line(finished_run: RunFolder, tmp_path: Path) -> None:
    folder = _copy(finished_run, tmp_path / "run")
    record = json.loads(folder.file("env.json").read_text())
    folder.file("env.json").write_text(json.dumps({**record, "resumes": "oops"}))
    stderr = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        assert main(["report", str(folder.path), "-o", str(tmp_path / "r.md")]) == 2
    assert "env.json" in stderr.getvalue() and "resumes" in stderr.getvalue()


# --- bounds on every count, checked before anything starts ------------------------------------------------

EMBEDDED = ["pair", "--workload", "embedded"]
TOO_MANY = [
    ([*EMBEDDED, "--pairs", "10000000000"], "--pairs 10000000000 is more than 10000"),
    ([*EMBEDDED, "--warmup", "1000001"], "--warmup 1000001 is more than 1000"),
    ([*EMBEDDED, "--cooldown", "1e9"], "--cooldown 1000000000.0 is more than 3600"),
    (
        [*EMBEDDED, "--steps", "10000000000", "--images", "8", "--batch", "4"],
        "--steps 10000000000 is more than",
    ),
    ([*EMBEDDED, "--steps", "200000", "--images", "8", "--batch", "4"], "100000 epochs is more than 10000"),
    (
        [*EMBEDDED, "--images", "100000000", "--steps", "8", "--batch", "4"],
        "--images 100000000 is more",
    ),
    ([*EMBEDDED, "--images", "65536", "--steps", "16384", "--imgsz", "256"], "holds its whole synthetic set"),
    ([*EMBEDDED, "--imgsz", "100000"], "--imgsz 100000 is more than 4096"),
    ([*EMBEDDED, "--val-images", "100000000"], "--val-images 100000000 is more than"),
    ([*EMBEDDED, "--trial-timeout", "100000000000"], "--trial-timeout 100000000000 is more than"),
    ([*EMBEDDED, "--workers", "100000"], "--workers 100000 is more than"),
    ([*EMBEDDED, "--close-mosaic", "100000"], "--close-mosaic 100000 is more than"),
    (["screen", "--steps", "10000000000"], "--steps 10000000000 is more than"),
    (["screen", "--warmup-steps", "10000000000"], "--warmup-steps 10000000000 is more than"),
    (["screen", "--floor-replays", "10000000000"], "--floor-replays 10000000000 is more than"),
    (
        ["screen", "--scales", "n,s,m,l,x", "--guards", ",".join(map(str, range(64))), "--pairs", "10000"],
        "1000000",
    ),
    (["probe", "--tokens", "100000000000000000000"], "--tokens 100000000000000000000 is more than"),
    (["probe", "--head", "detect", "--batch", "10000000000"], "--batch 10000000000 is more than"),
    (["parity", "--steps", "10000000000"], "--steps 10000000000 is more than 10000"),
]


@pytest.mark.parametrize(("command", "message"), TOO_MANY)
def test_a_count_no_run_can_take_is_refused_before_anything_starts(
    tmp_path: Path, capsys, monkeypatch, command: list[str], message: str
) -> None:
    from harness.run import Runner

    monkeypatch.setattr(Runner, "start", lambda *a, **k: pytest.fail("a run started"))
    out = tmp_path / "runs"
    _refused_in_one_line([*command, "--device", "cpu", "--out", str(out)], capsys, message)
    assert not out.exists()


# --- values that would only fail inside every trial ------------------------------------------------------

ONE_TRIAL = ["--warmup", "0", "--pairs", "1", "--device", "cpu"]


@pytest.mark.parametrize(
    "command",
    [
        [*EMBEDDED, "--arms", "baseline,torch.optim:SGD(nosuch=1)"],
        ["screen", "--arms", "baseline,torch.optim:SGD(nosuch=1)"],
        ["probe", "--arms", "torch.optim:SGD(nosuch=1),baseline"],
    ],
)
def test_an_arm_whose_constructor_does_not_fit_is_one_line_before_the_schedule(
    tmp_path: Path, capsys, monkeypatch, command: list[str]
) -> None:
    from harness.run import Runner

    monkeypatch.setattr(Runner, "start", lambda *a, **k: pytest.fail("a run started"))
    out = tmp_path / "runs"
    _refused_in_one_line(
        [*command, *ONE_TRIAL, "--out", str(out)],
        capsys,
        "--arms: arm 'torch.optim:SGD(nosuch=1)' cannot be built",
        "unexpected keyword argument 'nosuch'",
    )
    assert not out.exists()


def test_parity_of_a_candidate_that_cannot_be_built_is_exit_2_not_a_broken_contract(
    tmp_path: Path, capsys
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
    _refused_in_one_line(command, capsys, "--candidate: arm 'torch.optim:SGD(nosuch=1)' cannot be built")
    assert not out.exists()


@pytest.mark.parametrize("command", [EMBEDDED, ["screen"], ["probe"], ["parity"]])
def test_a_seed_beyond_63_bits_is_refused_up_front(tmp_path: Path, capsys, command: list[str]) -> None:
    out = tmp_path / "runs"
    _refused_in_one_line(
        [*command, "--seed", "18446744073709551616", "--device", "cpu", "--out", str(out)],
        capsys,
        "--seed 18446744073709551616 is more than 9223372036854775807",
    )
    assert not out.exists()


def test_the_largest_seed_gives_trial_seeds_every_generator_takes(tmp_path: Path) -> None:
    folder = runner(tmp_path).start(plan_of("seeded", warmup=1, pairs=2, seed=2**63 - 1)).folder
    rows = folder.rows()
    assert all(r["status"] == "ok" for r in rows), [r["message"] for r in rows]
    assert len({r["seed_seen"] for r in rows}) == 3  # the warm-up and each round still have their own seed


def test_the_real_trainer_gets_a_seed_numpy_takes() -> None:
    """Upstream seeds numpy's legacy generator with seed + 1 + rank, which must stay below 2**32."""
    from experiments.fit.ultralytics_fit import upstream_seed

    assert upstream_seed(7) == 7 and upstream_seed(4_294_967_296 - 2048) == 4_294_967_296 - 2048
    for seed in (4_295_012_885, 2**63 - 1, 2**40 + 3):
        assert 0 <= upstream_seed(seed) + 1 + 8 < 2**32
    assert upstream_seed(2**40 + 3) != upstream_seed(2**40 + 4)


# --- console text is plain text ---------------------------------------------------------------------------


def test_user_text_in_errors_prints_verbatim(tmp_path: Path, capsys, monkeypatch) -> None:
    out = str(tmp_path / "runs")
    _refused_in_one_line(
        [*EMBEDDED[:1], "--workload", "[/]", "--out", out], capsys, "--workload '[/]' is not"
    )
    odd = tmp_path / "results[v2]" / "x:100:y [bold]"
    _refused_in_one_line(["pair", "--resume", str(odd)], capsys, f"'{odd}' is not a run folder")
    monkeypatch.setattr("experiments.fit.plan.ultralytics_importable", lambda: False)
    _refused_in_one_line(
        ["pair", "--workload", "ultralytics", "--device", "cpu", "--out", out],
        capsys,
        "install the extra (pip install -e '.[ultralytics]')",
    )


def test_paths_and_labels_print_verbatim_on_stdout_and_in_the_progress_bar(tmp_path: Path, capsys) -> None:
    from harness.plan import Plan
    from harness.protocol_options import ProtocolOptions
    from harness.schedule import Arm, Case

    arms = (Arm("base[red]", "baseline", "x"), Arm("cand[/]", "candidate", "y"))
    plan = Plan(
        tier="test",
        protocol=ProtocolOptions(arms, warmup=0, pairs=1),
        cases=[Case("[bold]case[/bold] :100:", {}, arms)],
        unit="ms",
        metric="test figure",
        settings={"behaviour": "sleepy"},
    )
    out = tmp_path / ("results[v2]" + "-long" * 12)  # longer than a line: the path line is never wrapped
    for quiet in (True, False):
        folder = runner(out, quiet=quiet).start(plan).folder
        printed = capsys.readouterr().out
        assert f"run folder: {folder.path}  (2 of 2 trials to run)" in printed, printed
        assert "cand[/]" in printed and "base[red]" in printed


# --- output locations checked up front ------------------------------------------------------------------


@pytest.fixture
def read_only_disk(tmp_path: Path):
    """A tmpfs holding a finished run folder, then remounted read-only (root and a kernel that allow it)."""
    mount = tmp_path / "ro"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        folder = runner(mount / "runs").start(plan_of("sleepy", warmup=0, pairs=1)).folder
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        yield mount, folder
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.parametrize("workload", ["embedded", "ultralytics"])
def test_out_on_a_file_is_one_line_before_anything_starts(tmp_path: Path, capsys, workload: str) -> None:
    """The real trainer's parent generates its synthetic set under --out before the first trial: checked first."""
    from experiments.fit.plan import ultralytics_importable

    if workload == "ultralytics" and not ultralytics_importable():
        pytest.skip("needs the ultralytics extra")
    occupied = tmp_path / "a-file"
    occupied.write_text("not a folder")
    command = ["pair", "--workload", workload, "--device", "cpu", "--images", "8", "--steps", "2", "--out"]
    _refused_in_one_line([*command, str(occupied)], capsys, f"--out '{occupied}'", "is a file")
    _refused_in_one_line([*command, str(occupied / "below")], capsys, "is a file")
    assert occupied.read_text() == "not a folder"


def test_out_on_a_read_only_mount_is_one_line(read_only_disk, capsys) -> None:
    mount, _ = read_only_disk
    _refused_in_one_line([*EMBEDDED, "--out", str(mount / "more")], capsys, "read-only")


def test_a_report_elsewhere_writes_nothing_in_a_read_only_run_folder(
    read_only_disk, tmp_path: Path, capsys
) -> None:
    mount, folder = read_only_disk
    assert main(["report", str(folder.path), "-o", str(tmp_path / "elsewhere" / "report.md")]) == 0
    assert (tmp_path / "elsewhere" / "report.md").is_file()
    assert _tmp_files(mount) == []
    _refused_in_one_line(["report", str(folder.path)], capsys, "read-only", "-o")
    _refused_in_one_line(["report", str(folder.path), "-o", str(mount / "x.md")], capsys, "read-only")


def test_a_report_whose_figures_folder_is_a_file_is_one_line(
    finished_run: RunFolder, tmp_path: Path, capsys
) -> None:
    """The report draws its figures beside it (``report-figures``, ``NAME-figures``): a file of that name is
    refused in one line before anything is drawn or written, not a FileExistsError traceback."""
    folder = _copy(finished_run, tmp_path / "run")
    (folder.path / "report.md").unlink(missing_ok=True)
    shutil.rmtree(folder.path / "report-figures", ignore_errors=True)
    (folder.path / "report-figures").write_text("a file")
    _refused_in_one_line(["report", str(folder.path)], capsys, "report-figures", "is a file")
    assert not (folder.path / "report.md").exists()
    (tmp_path / "mine-figures").write_text("a file")
    _refused_in_one_line(
        ["report", str(folder.path), "-o", str(tmp_path / "mine.md")], capsys, "mine-figures"
    )
    assert not (tmp_path / "mine.md").exists()


def test_a_report_where_no_folder_can_be_made_is_one_line(finished_run: RunFolder, capsys) -> None:
    """``-o /proc/r.md``: a folder that exists and takes no new entries (as root, it passes the access check)
    is one line naming what could not be made, not a FileNotFoundError traceback."""
    _refused_in_one_line(["report", str(finished_run.path), "-o", "/proc/r.md"], capsys, "/proc/r")


def _files(folder: Path) -> dict[Path, bytes]:
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_an_interrupted_report_leaves_no_figures_half_drawn(
    finished_run: RunFolder, tmp_path: Path, monkeypatch
) -> None:
    """Ctrl-C while a report draws (here: at its second figure) left a figures folder with the first figure
    of the new report beside the old report: now the figures are drawn aside and put in place with the
    markdown, so an interrupt leaves the old report and its figures, or nothing, as they were."""
    from harness import plots

    folder = _copy(finished_run, tmp_path / "run")
    assert main(["report", str(folder.path)]) == 0
    # The first figure drawn, made distinguishable from its redraw.
    (folder.path / "report-figures" / "telemetry.png").write_bytes(b"an older figure")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(plots, "plot_timeline", interrupted)
    before = _files(folder.path)
    assert main(["report", str(folder.path)]) == 130
    assert _files(folder.path) == before
    assert main(["report", str(folder.path), "-o", str(tmp_path / "new.md")]) == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.parametrize("where", ["the run folder itself", "a folder holding the run folder"])
def test_a_report_whose_figures_folder_holds_more_than_figures_is_refused(
    finished_run: RunFolder, tmp_path: Path, capsys, where: str
) -> None:
    """``bench report a-figures -o a.md``: the figures folder's name landed on the run folder (or a folder
    holding it), which the report then replaced whole, deleting the run's log. A figures folder holding
    anything but a report's PNGs is refused in one line, and nothing is touched."""
    if where == "the run folder itself":
        folder = _copy(finished_run, tmp_path / "a-figures")
    else:
        folder = _copy(finished_run, tmp_path / "a-figures" / "run1")
    before = _files(tmp_path)
    _refused_in_one_line(["report", str(folder.path), "-o", str(tmp_path / "a.md")], capsys, "a-figures")
    assert _files(tmp_path) == before


def test_a_report_replaces_its_figures_folder_whole(finished_run: RunFolder, tmp_path: Path) -> None:
    """A figure the new report does not draw does not linger beside it from an older one."""
    folder = _copy(finished_run, tmp_path / "run")
    (folder.path / "report-figures").mkdir()
    (folder.path / "report-figures" / "from-an-older-report.png").write_bytes(b"old")
    assert main(["report", str(folder.path)]) == 0
    drawn = sorted(p.name for p in (folder.path / "report-figures").iterdir())
    assert "from-an-older-report.png" not in drawn and "timeline.png" in drawn
    assert sorted(p.name for p in folder.path.iterdir() if "figures" in p.name) == ["report-figures"]


def test_a_report_elsewhere_leaves_the_run_folder_as_it_was(finished_run: RunFolder, tmp_path: Path) -> None:
    folder = _copy(finished_run, tmp_path / "run")
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in folder.path.rglob("*") if p.is_file()}
    assert main(["report", str(folder.path), "-o", str(tmp_path / "elsewhere.md")]) == 0
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in folder.path.rglob("*") if p.is_file()}
    assert after == before


# --- interrupts and closed pipes --------------------------------------------------------------------------

QUIET_FIT = [
    sys.executable,
    "-m",
    "harness.cli",
    "pair",
    *TINY_FIT,
    "--warmup",
    "0",
    "--pairs",
    "1",
    "--quiet",
]


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_an_interrupt_says_where_the_run_is_and_exits_130(tmp_path: Path, signal_name: str) -> None:
    import signal

    process = subprocess.Popen(
        [*QUIET_FIT, "--no-report", "--out", str(tmp_path)],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(lambda: any(tmp_path.glob("pair-*/trials/0.log")))
        process.send_signal(getattr(signal, signal_name))
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    folder = _only_folder(tmp_path)
    assert process.returncode == 130, err
    assert f"run folder: {folder.path}" in out  # --quiet prints the run folder too
    last = err.strip().splitlines()[-1]
    assert last.startswith("bench: interrupted") and f"--resume {folder.path}" in last, err
    assert main(["pair", "--resume", str(folder.path), "--quiet", "--no-report"]) == 0
    assert [r["index"] for r in folder.rows()] == [0, 1]


# Runs the ``bench`` console script's entry point (as pyproject.toml names it) with the import of typer, the
# first heavy import behind the command line, held until a signal comes: where a Ctrl-C or SIGTERM lands in
# the first seconds of every command.
HELD_IN_IMPORTS = """
import importlib, sys, time, tomllib
class Held:
    def find_spec(self, name, path=None, target=None):
        if name == "typer":
            print("importing", flush=True)
            time.sleep(60)
        return None
sys.meta_path.insert(0, Held())
target = tomllib.load(open("pyproject.toml", "rb"))["project"]["scripts"]["bench"]
module, _, function = target.partition(":")
sys.argv = ["bench", "env"]
getattr(importlib.import_module(module), function)()
"""


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_an_interrupt_during_the_imports_is_one_line_and_exits_130(signal_name: str) -> None:
    """Ctrl-C in the first seconds (the imports) was a KeyboardInterrupt traceback, SIGTERM a silent exit 143:
    the entry point takes both before it imports anything heavy."""
    import signal

    process = subprocess.Popen(
        [sys.executable, "-c", HELD_IN_IMPORTS],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline() == "importing\n"
        process.send_signal(getattr(signal, signal_name))
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    assert err == "bench: interrupted\n", err


@pytest.mark.slow
def test_a_closed_stdout_never_stops_a_run(tmp_path: Path) -> None:
    """`bench pair --quiet | head -2`: the reader goes after two lines; the run finishes all the same."""
    process = subprocess.Popen(
        [*QUIET_FIT, "--out", str(tmp_path)],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        head = [process.stdout.readline() for _ in range(2)]
        process.stdout.close()
        err = process.stderr.read().decode()
        process.wait(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    assert all(head) and process.returncode == 0, err
    assert "BrokenPipe" not in err and "Exception ignored" not in err, err
    folder = _only_folder(tmp_path)
    assert [r["index"] for r in folder.rows()] == [0, 1]
    assert folder.file("claim.txt").is_file() and folder.file("report.md").is_file()


# --- nothing given is silently ignored ----------------------------------------------------------------------

PAIR_COMMAND = [
    "pair",
    "--workload",
    "embedded",
    "--images",
    "8",
    "--batch",
    "4",
    "--steps",
    "4",
    "--pairs",
    "1",
]


def _stop_at_second(plan):
    def trial(ctx) -> dict:
        if ctx.trial.index == 1:
            raise KeyboardInterrupt
        return {"value": 1.0}

    return trial


@pytest.fixture
def half_run(tmp_path: Path) -> RunFolder:
    """A pair-tier run of `bench PAIR_COMMAND` with its first trial logged and its second not yet run."""
    from experiments.fit.plan import FitSettings, make_plan
    from experiments.tiers import TIERS
    from harness.options import protocol_options
    from harness.run import Runner, RunOptions

    settings = FitSettings(workload="embedded", images=8, batch=4, steps=4)
    plan = make_plan(
        protocol_options(pairs=1, warmup=2, device="cpu"), settings, "bench " + " ".join(PAIR_COMMAND)
    )
    with pytest.raises(KeyboardInterrupt):
        Runner(TIERS, RunOptions(out=tmp_path, quiet=True, report=False)).start(plan, _stop_at_second(plan))
    return _only_folder(tmp_path)


def test_options_given_with_resume_that_differ_from_the_plan_are_refused(
    half_run: RunFolder, capsys, monkeypatch
) -> None:
    from harness.run import Runner

    monkeypatch.setattr(Runner, "resume", lambda *a, **k: pytest.fail("the run was resumed"))
    before = half_run.file("trials.jsonl").read_bytes()
    resume = ["pair", "--resume", str(half_run.path)]
    _refused_in_one_line(
        [*resume, "--pairs", "9", "--arms", "foo"],
        capsys,
        "--pairs 9",
        "--arms foo",
        "--pairs 1",
        "no --arms",  # the run took the device default
    )
    _refused_in_one_line([*resume, "--steps", "8"], capsys, "--steps 8", "--steps 4")
    _refused_in_one_line([*resume, "--control"], capsys, "--control")
    assert half_run.file("trials.jsonl").read_bytes() == before  # nothing ran


def test_options_given_with_resume_that_match_the_plan_are_accepted(half_run: RunFolder, monkeypatch) -> None:
    from harness.run import Runner

    resumed = []
    monkeypatch.setattr(Runner, "resume", lambda self, path, trial_fn=None: resumed.append(Path(path)))
    given = [
        "--workload",
        "embedded",
        "--pairs",
        "1",
        "--warmup",
        "2",
        "--quiet",
        "--no-report",
        "--stop-after",
        "60",
    ]
    assert main(["pair", "--resume", str(half_run.path), *given]) == 0
    assert resumed == [half_run.path]


def test_a_resume_of_a_plan_with_no_command_refuses_any_option(tmp_path: Path, capsys, monkeypatch) -> None:
    from harness.run import Runner

    folder = _copy(RunFolder(TIER_FOLDERS["screen"]), tmp_path / "run")  # as if started from Python:
    _corrupt_plan(folder, _set("command", ""))  # no command recorded
    monkeypatch.setattr(Runner, "resume", lambda *a, **k: pytest.fail("the run was resumed"))
    command = ["screen", "--resume", str(folder.path), "--pairs", "1"]
    _refused_in_one_line(command, capsys, "--pairs 1", "no command")


def test_the_plan_records_the_command_main_was_given(tmp_path: Path, monkeypatch) -> None:
    from harness.run import Runner

    started = []
    monkeypatch.setattr(Runner, "start", lambda self, plan, trial_fn=None: started.append(plan))
    assert main([*PAIR_COMMAND, "--seed", "3", "--out", str(tmp_path / "my runs")]) == 0
    assert (
        started[0].command == "bench " + " ".join(PAIR_COMMAND) + f" --seed 3 --out '{tmp_path / 'my runs'}'"
    )


@pytest.mark.parametrize(
    ("option", "value"),
    [("--model", "foo.pt"), ("--workers", "8"), ("--cache", "disk"), ("--close-mosaic", "2")],
)
def test_real_trainer_options_with_the_embedded_workload_are_refused(
    tmp_path: Path, capsys, monkeypatch, option: str, value: str
) -> None:
    from harness.run import Runner

    monkeypatch.setattr(Runner, "start", lambda *a, **k: pytest.fail("a run started"))
    out = tmp_path / "runs"
    _refused_in_one_line(
        [*EMBEDDED, option, value, "--out", str(out)], capsys, f"{option} {value}", "real trainer"
    )
    assert not out.exists()


def test_a_data_cache_nothing_would_use_is_refused(tmp_path: Path, capsys, monkeypatch) -> None:
    """``--data-cache`` holds the real trainer's generated synthetic sets: with the embedded workload (its set
    lives in memory) or a user's ``--data`` it was accepted and ignored."""
    from harness.run import Runner

    monkeypatch.setattr(Runner, "start", lambda *a, **k: pytest.fail("a run started"))
    out = tmp_path / "runs"
    _refused_in_one_line(
        [*EMBEDDED, "--data-cache", str(tmp_path / "sets"), "--out", str(out)],
        capsys,
        "--data-cache",
        "embedded",
    )
    assert not out.exists()


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
    tmp_path: Path, capsys, monkeypatch, head: str, option: str, value: str
) -> None:
    """``probe --head lm --scale x`` probed the LM head and ignored the scale (and ``--head detect --tokens 5``
    the tokens): each head's own options are refused with the other head, in one line."""
    from harness.run import Runner

    monkeypatch.setattr(Runner, "start", lambda *a, **k: pytest.fail("a run started"))
    out = tmp_path / "runs"
    command = ["probe", "--device", "cpu", "--head", head, option, value, "--out", str(out)]
    _refused_in_one_line(command, capsys, f"{option} {value}", f"--head {head}")
    assert not out.exists()


# --- two promises no other test sees ----------------------------------------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
def test_the_log_is_fsynced_after_every_row(tmp_path: Path, monkeypatch) -> None:
    """Each row is on disk before the next trial starts: one fsync of the log per row, after its bytes."""
    from harness.folder_format import LOG

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


def test_the_timer_synchronizes_immediately_before_each_clock_read(monkeypatch) -> None:
    """A stand-in device records its synchronizations; the bracket is sync, clock, work, sync, clock."""
    from harness import timing

    calls: list = []
    ticks = iter(range(1_000, 10**9, 250))
    monkeypatch.setattr(timing, "synchronize", lambda device: calls.append(("synchronize", str(device))))
    monkeypatch.setattr(timing.time, "perf_counter_ns", lambda: calls.append("clock") or next(ticks))
    with timing.SyncTimer("cuda:1") as timer:
        calls.append("work")
    monkeypatch.undo()
    sync = ("synchronize", "cuda:1")
    assert calls == [sync, "clock", "work", sync, "clock"]
    assert timer.seconds == 250 / 1e9


# --- a trial's worker starts lean --------------------------------------------------------------------------

WORKER_TARGETS = [
    "experiments.fit.worker",
    "experiments.fit.ddp",
    "experiments.screen.ranks",
    "experiments.parity",
]


def test_a_trial_worker_imports_torch_and_its_trial_not_the_statistics_or_the_plots() -> None:
    """Every trial starts a process (or a rank) that imports `harness.isolation` and its target: pandas,
    scipy and matplotlib, which only the parent's tables and reports need, cost each worker about 3 s on two
    cores (of about 6 s; torch itself is the rest)."""
    code = (
        "import importlib, sys\n"
        "import harness.isolation\n"
        f"for name in {WORKER_TARGETS!r}: importlib.import_module(name)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'pandas', 'scipy', 'matplotlib'}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout


def test_paths_no_file_system_can_hold_are_one_line(finished_run: RunFolder, tmp_path: Path, capsys) -> None:
    """A name of 300 characters was an OSError traceback (ENAMETOOLONG) in --out, -o, --resume and report;
    an empty --out wrote the run into the current folder."""
    long = str(tmp_path / ("a" * 300))
    _refused_in_one_line(["report", long], capsys, "is not a run folder", "longer than")
    _refused_in_one_line(["pair", "--resume", long], capsys, "is not a run folder", "longer than")
    report_to = str(tmp_path / ("c" * 300 + ".md"))
    _refused_in_one_line(["report", str(finished_run.path), "-o", report_to], capsys, "-o", "longer than")
    tiny = [
        "pair",
        "--workload",
        "embedded",
        "--device",
        "cpu",
        "--steps",
        "2",
        "--images",
        "8",
        "--batch",
        "4",
    ]
    _refused_in_one_line([*tiny, "--out", long + "/x"], capsys, "--out", "longer than")
    _refused_in_one_line([*tiny, "--out", ""], capsys, "--out", "empty")
    assert not list(Path.cwd().glob("pair-*"))


def test_a_control_character_in_a_bad_value_stays_inside_the_one_line(capsys) -> None:
    """--order 'abba<newline>INJECTED LINE' was refused (exit 2) on two lines of stderr."""
    error = _refused_in_one_line(
        ["screen", "--order", "abba\nINJECTED LINE", "--device", "cpu"], capsys, "--order"
    )
    assert "abba\\nINJECTED LINE" in error


@pytest.mark.parametrize("kind", ["a directory", "a FIFO", "a link to /dev/zero"])
def test_a_log_that_is_not_a_regular_file_is_one_line(
    finished_run: RunFolder, tmp_path: Path, capsys, kind
) -> None:
    """A trials.jsonl replaced by a directory, a FIFO or a link to /dev/zero read as an empty log: the
    report said 'no measured trial in the log', and a resume would have run the whole schedule again."""
    import os

    folder = _copy(finished_run, tmp_path / "run")
    log = folder.file("trials.jsonl")
    log.unlink()
    {
        "a directory": log.mkdir,
        "a FIFO": lambda: os.mkfifo(log),
        "a link to /dev/zero": lambda: log.symlink_to("/dev/zero"),
    }[kind]()
    _refused_in_one_line(
        ["report", str(folder.path), "-o", str(tmp_path / "r.md")],
        capsys,
        "trials.jsonl",
        "not a regular file",
    )
    _refused_in_one_line(["pair", "--resume", str(folder.path)], capsys, "trials.jsonl", "not a regular file")
