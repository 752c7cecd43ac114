"""A run folder is data: an edited folder never runs code, follows no link, and claims nothing it did not
measure.

Each case does what a user, or whoever handed them a folder, can do. It edits a stopped run's plan or puts a
file or a link in it. Then it resumes the run or asks for its report. Every refusal is one line and exit
status 2; nothing runs.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from harness import tables
from harness.cli import main
from harness.folder_format import LOG, PLAN
from harness.tables import temporary_path
from tests.argv import ONE_PAIR, TINY_SCREEN, overridden
from tests.runfolders import (
    TIER_FOLDERS,
    copy_tier_run,
    dropped,
    edit_folder,
    only_run,
    refused_report,
    set_field,
)

SCREEN = list(TINY_SCREEN)
SCREEN += ["--warmup", "0", "--pairs", "2", "--arms", "baseline,candidate-cpu"]


def _stopped_screen(root: Path) -> Path:
    """A finished two-pair screen cut back to its first row: a run stopped after one trial."""
    assert main([*SCREEN, "--out", str(root)]) == 0
    folder = only_run(root).path
    log = folder / LOG
    log.write_text(log.read_text().splitlines(keepends=True)[0])
    return folder


PAYLOAD = """
import pathlib
pathlib.Path({marker!r}).write_text("ran")
from optimizers import MuSGD as Opt
"""


def test_a_plan_naming_code_in_its_own_folder_is_refused_before_it_runs(tmp_path, monkeypatch, bench) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(
        str(tmp_path)
    )  # `runs` in the working directory imports as a namespace package
    folder = _stopped_screen(tmp_path / "runs")
    marker = tmp_path / "payload-ran"
    (folder / "payload.py").write_text(PAYLOAD.format(marker=str(marker)))
    spec = f"runs.{folder.name}.payload:Opt"

    for name in (PLAN, LOG):  # every place the folder names the spec, labels too, consistently
        (folder / name).write_text((folder / name).read_text().replace("candidate-cpu", spec))
    rows_before = (folder / LOG).read_text()
    bench.refused(["screen", "--resume", str(folder)], "run folder", "data, not code")
    assert not marker.exists()
    assert (folder / LOG).read_text() == rows_before
    sys.modules.pop("runs", None)


def test_a_resume_refuses_an_arm_whose_code_changed_since_the_start(tmp_path, monkeypatch, bench) -> None:
    """A spec naming code outside any folder is resolved as at the start, and its recorded fingerprint must
    match.

    So rows logged under one label never come from two codes.
    """
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "mine_a43.py").write_text("from optimizers import MuSGD as Opt\n")
    root = tmp_path / "runs"
    argv = [*SCREEN[:-1], "baseline,mine_a43:Opt", "--out", str(root)]
    assert main(argv) == 0
    folder = only_run(root).path
    log = folder / LOG
    log.write_text(log.read_text().splitlines(keepends=True)[0])
    (tmp_path / "mine_a43.py").write_text("from optimizers import BatchedMuSGD as Opt\n")
    sys.modules.pop("mine_a43", None)
    rows_before = log.read_text()
    bench.refused(["screen", "--resume", str(folder)], "mine_a43:Opt", "changed")
    assert log.read_text() == rows_before


def test_a_resume_checks_the_torchrun_options_as_the_start_does(tmp_path, bench) -> None:
    """settings.torchrun edited to name a script: the start refuses it, so a resume (and a report) does too."""
    root = tmp_path / "runs"
    tiny = ["--workload", "embedded", "--images", "8", "--batch", "4", "--steps", "2", "--val-images", "4"]
    argv = ["pair", *tiny, "--gpus", "2", "--device", "cpu", *ONE_PAIR, "--quiet"]
    assert main([*argv, "--out", str(root)]) == 0
    folder = only_run(root).path
    (folder / LOG).write_text("")  # stopped before its first trial
    marker = tmp_path / "script-ran"
    (folder / "script.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    plan = json.loads((folder / PLAN).read_text())
    plan["settings"]["torchrun"] = str(folder / "script.py")
    (folder / PLAN).write_text(json.dumps(plan))
    bench.refused(["pair", "--resume", str(folder)], "settings", "torchrun")
    assert not marker.exists() and (folder / LOG).read_text() == ""
    bench.refused(["report", str(folder), "-o", str(tmp_path / "report.md")], "torchrun")


# --- 3: links in a run folder are never followed -------------------------------------------------------------


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    return victim


@pytest.fixture(scope="module")
def duet_pair(tmp_path_factory) -> Path:
    """A finished one-pair duet fit of the embedded workload (each test copies it and cuts its log)."""
    root = tmp_path_factory.mktemp("duet") / "runs"
    tiny = ["--workload", "embedded", "--images", "8", "--batch", "4", "--steps", "2", "--val-images", "4"]
    argv = ["pair", *tiny, "--device", "cpu", *ONE_PAIR, "--order", "duet", "--quiet"]
    assert main([*argv, "--no-report", "--out", str(root)]) == 0
    return only_run(root).path


def _killed_after_first_row(duet_pair: Path, tmp_path: Path) -> tuple[Path, dict]:
    """A copy of the duet run as a kill -9 after the round's first row leaves it, and that row."""
    folder = tmp_path / "run"
    shutil.copytree(duet_pair, folder)
    log = folder / LOG
    first = json.loads(log.read_text().splitlines()[0])
    log.write_text(log.read_text().splitlines(keepends=True)[0])
    return folder, first


def test_a_link_at_the_next_trials_folder_never_empties_its_target(duet_pair, tmp_path, bench) -> None:
    folder, first = _killed_after_first_row(duet_pair, tmp_path)
    victim = _victim(tmp_path)
    (folder / "trials").mkdir(exist_ok=True)
    (folder / "trials" / f"{1 - first['index']:03d}").symlink_to(victim)  # the trial the resume runs
    assert bench(["pair", "--resume", str(folder), "--no-report"]).status == 0
    assert (victim / "keep.txt").read_text() == "precious"


def test_a_lock_link_and_a_temporary_file_link_never_overwrite_their_targets(tmp_path, bench) -> None:
    root = tmp_path / "runs"
    folder = _stopped_screen(root)
    target = tmp_path / "target.txt"
    target.write_text("precious")
    (folder / "report.md.tmp").symlink_to(target)
    temporary_path(folder / "report.md").symlink_to(target)  # where this process writes the report first
    assert bench(["report", str(folder)]).status == 0
    assert target.read_text() == "precious" and (folder / "report.md").is_file()
    (folder / "run.lock").unlink(missing_ok=True)
    (folder / "run.lock").symlink_to(target)
    bench.refused(["screen", "--resume", str(folder)], "run.lock", "symbolic link")
    assert target.read_text() == "precious"


def test_the_run_folder_path_is_absolute_so_an_arm_that_changes_directory_keeps_its_row(
    tmp_path, monkeypatch, capsys
) -> None:
    arms = tmp_path / "arms"
    arms.mkdir()
    (arms / "chdir_a43.py").write_text(
        "import os\nfrom optimizers import MuSGD\n\n\nclass Chdir(MuSGD):\n"
        "    def step(self, closure=None):\n        os.chdir('/')\n        return super().step(closure)\n"
    )
    monkeypatch.syspath_prepend(str(arms))
    monkeypatch.chdir(tmp_path)
    argv = ["screen", *overridden(SCREEN[1:], ["--arms", "baseline,chdir_a43:Chdir", "--pairs", "1"])]
    argv += ["--out", "runs"]
    assert main(argv) == 0, capsys.readouterr().err
    assert len((only_run(tmp_path / "runs").path / LOG).read_text().splitlines()) == 2


# --- 4: every tier judges the finiteness of what it measured -------------------------------------------------

HOSTILE = """
import os
import sys

import torch

from optimizers import MuSGD


class NaNEverything(MuSGD):
    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                p.fill_(float("nan"))


class NaNFromThirdStep(MuSGD):
    steps = 0

    @torch.no_grad()
    def step(self, closure=None):
        self.steps += 1
        if self.steps < 3:  # the probe primes, attributes, then times a step
            return super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                p.fill_(float("nan"))


class ExitZero(MuSGD):
    def step(self, closure=None):
        sys.exit(0)
"""


@pytest.fixture
def hostile(tmp_path, monkeypatch) -> str:
    """A module of hostile MuSGD subclasses on the import path (its name, for ``module:Class`` specs)."""
    folder = tmp_path / "hostile-arms"
    folder.mkdir()
    (folder / "hostile_a43.py").write_text(HOSTILE)
    monkeypatch.syspath_prepend(str(folder))
    return "hostile_a43"


def test_the_screen_fails_a_window_that_left_nan_parameters(tmp_path, hostile, capsys) -> None:
    root = tmp_path / "runs"
    argv = [
        "screen",
        *overridden(SCREEN[1:], ["--arms", f"baseline,{hostile}:NaNEverything", "--steps", "2"]),
    ]
    code = main([*argv, "--bar", "5", "--gate", "--out", str(root)])
    assert code != 0
    rows = [json.loads(line) for line in (only_run(root).path / LOG).read_text().splitlines()]
    nan_rows = [row for row in rows if row["arm"].startswith(hostile)]
    assert nan_rows and all(row["status"] == "error" for row in nan_rows), nan_rows
    assert all("non-finite" in row["message"] for row in nan_rows)
    assert all(row["status"] == "ok" for row in rows if row["arm"] == "baseline")


# --- 5: an exit inside a trial is that trial's error ---------------------------------------------------------


def test_an_arm_that_calls_sys_exit_gets_error_rows_and_the_command_goes_on(
    tmp_path, hostile, capsys
) -> None:
    root = tmp_path / "runs"
    argv = ["parity", "--steps", "2", "--candidate", f"{hostile}:ExitZero", "--device", "cpu", "--quiet"]
    code = main([*argv, "--out", str(root)])
    assert code == 3, capsys.readouterr().err  # every trial of the arm failed: never a silent exit 0
    rows = [json.loads(line) for line in (only_run(root).path / LOG).read_text().splitlines()]
    assert rows and any(row["status"] == "error" and "SystemExit" in row["message"] for row in rows), rows


# --- 12: a trial's figures never shadow what the harness measured --------------------------------------------


def test_a_figure_named_as_telemetry_is_an_error_row_and_the_folder_stays_readable(tmp_path) -> None:
    from harness.api import compare

    result = compare(
        {"a": lambda: {"value": 1.0}, "b": lambda: {"value": 1.0, "cpu_busy_share": 5.0}},
        pairs=2,
        warmup=0,
        out=str(tmp_path),
    )
    rows = [json.loads(line) for line in (result.folder / LOG).read_text().splitlines()]
    shadowing = [row for row in rows if row["arm"] == "b"]
    assert all(row["status"] == "error" and "cpu_busy_share" in row["message"] for row in shadowing), rows
    assert all(0 <= row["cpu_busy_share"] <= 1 for row in rows if row.get("cpu_busy_share") is not None)
    assert main(["report", str(result.folder), "-o", str(tmp_path / "again.md")]) == 0


# --- 6: a duet round a crash left half done runs again whole ----------------------------------------------------


def test_a_half_done_duet_round_runs_its_missing_trial_beside_a_partner(duet_pair, tmp_path, bench) -> None:
    folder, first = _killed_after_first_row(duet_pair, tmp_path)
    assert bench(["pair", "--resume", str(folder), "--no-report"]).status == 0
    rows = [json.loads(line) for line in (folder / LOG).read_text().splitlines()]
    missing = next(r for r in rows if r["phase"] == "measured" and r["index"] != first["index"])
    partner = [r for r in rows if r["index"] in missing["concurrent_with"]]
    assert partner and partner[0]["arm"] == first["arm"] and partner[0]["phase"] == "warmup", rows
    assert partner[0]["warmup_reason"] == "duet partner"
    assert main(["report", str(folder), "-o", str(tmp_path / "r.md")]) == 0


# --- 8: folders that pass validation never crash a report -----------------------------------------------------


@pytest.mark.parametrize(
    ("how", "fragments"),
    [
        (("plan", set_field("protocol.pairs", "auto")), ("plan.json", "--pairs auto needs --precision")),
        ((3, dropped("slot")), ("trials.jsonl", "line 3", "slot")),
    ],
    ids=["pairs auto with no precision", "an ok row with no slot"],
)
def test_an_edit_that_passed_validation_and_crashed_the_report_is_one_line(tmp_path, bench, how, fragments):
    folder = copy_tier_run("screen", tmp_path)
    edit_folder(folder, *how)
    refused_report(bench, folder, tmp_path, fragments)


def test_figures_1e58_apart_in_one_pair_give_a_report(tmp_path) -> None:
    """Each figure is within the log's ±1e30, so the folder is valid; their ratio overflowed the order effect."""
    folder = copy_tier_run("screen", tmp_path)
    rows = [json.loads(line) for line in (folder / LOG).read_text().splitlines()]
    first = next(r for r in rows if r["phase"] == "measured" and r["status"] == "ok")
    partner = next(
        r
        for r in rows
        if (r["round"], r["case"], r["phase"]) == (first["round"], first["case"], "measured")
        and r["arm"] != first["arm"]
    )
    first["value"], partner["value"] = 1e29, 1e-29
    (folder / LOG).write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["report", str(folder), "-o", str(tmp_path / "r.md")]) == 0


# --- 15: escapes and newlines never reach a report or split a line ---------------------------------------------


def test_an_arms_escape_sequences_never_reach_the_report(tmp_path) -> None:
    from harness.api import compare

    def red() -> None:
        raise RuntimeError("\x1b[31mred\x1b[0m\nsecond line")

    result = compare({"a": lambda: None, "b": red}, pairs=2, warmup=0, out=str(tmp_path), report=True)
    text = (result.folder / "report.md").read_text()
    assert "red second line" in text and "\x1b" not in text


def test_a_newline_in_out_is_refused_in_one_line(tmp_path, bench) -> None:
    out = str(tmp_path / "a\nb")
    bench.refused([*SCREEN, "--out", out], "--out", "control character")
    assert list(tmp_path.iterdir()) == []


# --- 16: the API refuses what the CLI refuses, as InputError -----------------------------------------------------


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"out": ""}, "empty"),
        ({"out": None}, "not a folder path"),
        ({"cooldown": "1"}, "cooldown"),
    ],
    ids=["empty out", "out None", "cooldown text"],
)
def test_the_api_refuses_bad_options_as_input_errors(tmp_path, monkeypatch, options, says) -> None:
    from harness.api import compare
    from harness.errors import InputError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=says):
        compare({"a": lambda: None, "b": lambda: None}, pairs=2, warmup=0, **options)
    assert list(tmp_path.iterdir()) == []


def test_the_api_refuses_no_functions_and_another_tiers_folder(tmp_path) -> None:
    from harness.api import compare
    from harness.errors import InputError

    with pytest.raises(InputError, match="two or more functions"):
        compare({})
    folder = copy_tier_run("screen", tmp_path)
    log_before = (folder / LOG).read_bytes()
    with pytest.raises(InputError, match="'screen' run"):
        compare({"baseline": lambda: None, "candidate-cpu": lambda: None}, resume=folder)
    assert (folder / LOG).read_bytes() == log_before


# --- 17: bench plan never advises more pairs than --pairs accepts ----------------------------------------------


def test_bench_plan_advises_no_more_pairs_than_the_option_accepts(capsys) -> None:
    import re

    from harness.limits import MAX_PAIRS

    assert main(["plan", str(TIER_FOLDERS["screen"]), "--effect", "0.3%"]) == 0
    out = capsys.readouterr().out
    advised = [int(n.replace(",", "")) for n in re.findall(r"run ([\d,]+) pairs", " ".join(out.split()))]
    assert all(n <= MAX_PAIRS for n in advised), advised
    assert f"needs more than {MAX_PAIRS} pairs, the most --pairs accepts" in " ".join(out.split())


# --- 13: a second writer is detected; a doubled row has a documented repair ------------------------------------


def test_a_lock_removed_under_a_run_stops_it_before_its_next_row(tmp_path) -> None:
    from harness.api import compare
    from harness.errors import RunFolderError
    from harness.folder_format import LOCK

    calls = []

    def remove_the_lock() -> None:
        calls.append(1)
        # Call 1 is the untimed first trial (the estimate), 2 the first logged: 3 is a's second logged trial,
        # as if a user deleted run.lock to start a second run.
        if len(calls) == 3:
            for lock in tmp_path.glob(f"*/{LOCK}"):
                lock.unlink()

    with pytest.raises(RunFolderError, match="run.lock"):
        compare({"a": remove_the_lock, "b": lambda: None}, pairs=2, warmup=0, out=str(tmp_path))
    folder = only_run(tmp_path).path
    rows = [json.loads(line) for line in (folder / LOG).read_text().splitlines()]
    assert [row["arm"] for row in rows].count("a") == 1  # the trial that ran unlocked is not logged


def test_a_doubled_row_is_refused_with_its_repair_and_the_repair_works(tmp_path, bench) -> None:
    from harness.repair_log import DOUBLED
    from harness.repair_log import main as repair

    folder = copy_tier_run("screen", tmp_path)
    lines = (folder / LOG).read_text().splitlines(keepends=True)
    (folder / LOG).write_text("".join([*lines, lines[2]]))
    refused_report(bench, folder, tmp_path, ("logged twice", "python -m harness.repair_log"))
    assert repair([str(folder)]) == 0
    assert (folder / LOG).read_text() == "".join(lines) and (folder / DOUBLED).read_text() == lines[2]
    assert main(["report", str(folder), "-o", str(tmp_path / "r.md")]) == 0


# --- 10: two reports of one folder at once never share their staging folder ------------------------------------


def test_two_reports_of_one_folder_at_once_both_succeed(tmp_path) -> None:
    """They shared one staging folder: in 4 of 5 tries one failed (one try here: two processes)."""
    import re
    import subprocess

    folder = copy_tier_run("screen", tmp_path)
    command = [sys.executable, "-m", "harness.cli", "report", str(folder)]
    for _ in range(2):
        reports = [
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)
        ]
        results = [(p.wait(timeout=300), p.stderr.read().decode()) for p in reports]
        assert [code for code, _ in results] == [0, 0], results
        text = (folder / "report.md").read_text()
        for figure in re.findall(r"\]\(([^)]+\.png)\)", text):
            assert (folder / figure).is_file(), figure


# --- 9: a report on a full disk is one line ----------------------------------------------------------------------


@pytest.fixture
def full_disk(tmpfs):
    """A 200 KiB file system, filled."""
    where = tmpfs("200k")
    (where / "fill").write_bytes(b"\0" * 190 * 1024)
    return where


def test_a_report_on_a_full_disk_is_one_line(tmp_path, full_disk, capsys) -> None:
    folder = TIER_FOLDERS["screen"]
    code = main(["report", str(folder), "-o", str(full_disk / "r.md")])
    err = capsys.readouterr().err.strip()
    assert code != 0 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "No space left" in err and not (full_disk / "r.md").exists()


# --- the readers' fuzz, extended to plans edited within their schema --------------------------------------------


def _leaves(node, path=()):
    """(path, value) of every scalar of a JSON value."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _leaves(value, (*path, i))
    else:
        yield path, node


def _same_type(value):
    """A strategy of values of ``value``'s JSON type, edges included: what a hand edit within the schema gives."""
    from hypothesis import strategies as st

    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers(-(2**70), 2**70) | st.sampled_from([0, -1, 1, 2**63])
    if isinstance(value, float):
        return st.floats(allow_nan=False) | st.sampled_from([0.0, -0.0, 1e-300, 1e300])
    if isinstance(value, str):
        return st.text(max_size=12) | st.sampled_from(["", "auto", "baseline", "candidate", "none"])
    return st.none() | st.integers(-3, 3) | st.text(max_size=4)


PLANS = {name: json.loads((TIER_FOLDERS[name] / PLAN).read_text()) for name in ("screen", "pair", "parity")}
LEAVES = {name: [path for path, _ in _leaves(plan)] for name, plan in PLANS.items()}


def _within_schema():
    from hypothesis import strategies as st

    return st.sampled_from(sorted(PLANS)).flatmap(
        lambda name: st.sampled_from(LEAVES[name]).flatmap(
            lambda path: st.tuples(st.just(name), st.just(path), _same_type(_at(PLANS[name], path)))
        )
    )


def _at(node, path):
    for part in path:
        node = node[part]
    return node


def _fuzz_settings():
    from hypothesis import HealthCheck, settings

    return settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def plan_copies(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("plans")
    return {name: copy_tier_run(name, root / name) for name in PLANS}


def test_fuzz_a_plan_edited_within_its_schema_gives_a_report_or_one_line(plan_copies) -> None:
    import contextlib
    import copy
    import io

    from hypothesis import given

    @_fuzz_settings()
    @given(edit=_within_schema())
    def check(edit) -> None:
        name, path, value = edit
        plan = copy.deepcopy(PLANS[name])
        *parents, last = path
        _at(plan, parents)[last] = value
        folder = plan_copies[name]
        (folder / PLAN).write_text(json.dumps(plan))
        stderr = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
            status = main(["report", str(folder), "-o", str(folder.parent / "r.md")])
        text = stderr.getvalue().strip()
        assert status in (0, 2), (path, value, text)
        if status == 2:
            assert text.startswith("bench: error: ") and text.count("\n") == 0, (path, value, text)

    check()


def test_the_probe_fails_a_step_that_left_nan_parameters(tmp_path, hostile) -> None:
    """The probe checked the loss, computed before its timed step: a step that fills NaN there looked fast."""
    root = tmp_path / "runs"
    tiny_lm = ["--tokens", "64", "--vocab", "32", "--dim", "8", "--chunk", "24", "--variants", "chunked"]
    argv = ["probe", *tiny_lm, "--device", "cpu", "--arms", f"baseline,{hostile}:NaNFromThirdStep"]
    code = main([*argv, "--pairs", "1", "--warmup", "0", "--quiet", "--no-report", "--out", str(root)])
    assert code == 3  # every trial of the NaN arm failed
    rows = [json.loads(line) for line in (only_run(root).path / LOG).read_text().splitlines()]
    nan_rows = [row for row in rows if row["arm"].startswith(hostile)]
    assert nan_rows and all(r["status"] == "error" and "non-finite" in r["message"] for r in nan_rows), rows


def test_a_file_written_twice_at_once_is_whole_and_neither_writer_fails(tmp_path, monkeypatch) -> None:
    """Two reports of one folder shared ``report.md.tmp``: the second writer's took the first's away."""
    path = tmp_path / "report.md"
    real_write_all, real_pid, nested = tables._write_all, os.getpid(), []

    def write_all(fd: int, data: bytes) -> None:
        if not nested:  # another process writes the file whole while this one is half way
            nested.append(1)
            with monkeypatch.context() as other:
                other.setattr(os, "getpid", lambda: real_pid + 1)
                tables.write_atomic(path, "second")
        real_write_all(fd, data)

    monkeypatch.setattr(tables, "_write_all", write_all)
    tables.write_atomic(path, "first")
    assert path.read_text() == "first"
    assert not [p.name for p in tmp_path.iterdir() if p.name != "report.md"]
