"""One validation of a run folder's files: each corrupt plan, log or environment record is one line."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from experiments.tiers import TIERS
from harness.cli import main
from harness.tables import CorruptRunFolder, RunFolder
from harness.tier import Run
from tests import ROOT
from tests.runfolders import copy_run, corrupt_plan, dropped, set_field, untouched
from tests.trialfns import runner

CORRUPT_PLANS = {
    "not JSON": ('{"tier": "test", ', "plan.json: not JSON"),
    "not UTF-8": (b"\xff\xfe{}", "plan.json: not JSON"),
    "an empty object": ("{}", "plan.json: not a plan: missing key"),
    "a list": ("[1, 2]", "plan.json holds a list, not a plan (a JSON object)"),
    "a number": ("7", "plan.json holds a number, not a plan"),
    "no schedule": (dropped("schedule"), "plan.json: not a plan: missing key 'schedule'"),
    "no cases": (dropped("cases"), "missing key 'cases'"),
    "pairs a string": (
        set_field("protocol.pairs", "three"),
        "protocol.pairs is 'three', which no run can have",
    ),  # auto or ≥ 1
    "an index a string": (
        set_field("schedule.0.index", "abc"),
        "schedule[0].index is 'abc', not a whole number",
    ),
    "cases a string": (set_field("cases", "x"), "plan.json: not a plan"),
    "a trial of no case": (set_field("schedule.1.case", "elsewhere"), "schedule[1] names case 'elsewhere'"),
    # Unique, not dense: rounds --pairs auto adds take indices above a resume's extra warm-up.
    "an index repeated": (
        set_field("schedule.1.index", 0),
        "schedule[1].index is 0, which is negative or an earlier",
    ),
    "an index negative": (set_field("schedule.1.index", -1), "schedule[1].index is -1, which is negative"),
    "an unknown role": (set_field("protocol.arms.0.role", "referee"), "role 'referee'"),
    "an empty schedule": (set_field("schedule", []), "plan.json: the schedule is empty"),
    "no arms": (set_field("protocol.arms", []), "protocol.arms is empty"),
    "a number past the parser's limit": ('{"seed": 1' + "0" * 5000 + "}", "plan.json: not JSON"),
    # Each protocol value a resume or report acts on, held to the bound its option is checked against.
    "ranks past the most": (set_field("protocol.gpus", 2000), "protocol.gpus is 2000"),
    "no ranks": (set_field("protocol.gpus", 0), "protocol.gpus is 0"),
    "a cool-down of ages": (set_field("protocol.cooldown", 1e300), "protocol.cooldown is 1e+300"),
    "a tolerance not positive": (set_field("protocol.tolerance", -5.0), "protocol.tolerance is -5.0"),
    "a time budget negative": (set_field("protocol.time_budget", -1.0), "protocol.time_budget is -1.0"),
    "a device that is none": (set_field("protocol.device", "tpu"), "protocol.device is 'tpu'"),
    "cpus that are no core list": (set_field("protocol.cpus", "lots"), "protocol.cpus is 'lots'"),
    "a seed past the generators": (
        set_field("protocol.seed", 2**64),
        "protocol.seed is 18446744073709551616",
    ),
    "pairs past the most": (set_field("protocol.pairs", 20_000), "protocol.pairs is 20000"),
    "warm-ups past the most": (set_field("protocol.warmup", 5_000), "protocol.warmup is 5000"),
    "a precision of none": (set_field("protocol.precision", -2.0), "protocol.precision is -2.0"),
}


@pytest.mark.parametrize("case", list(CORRUPT_PLANS))
def test_a_corrupt_plan_is_one_line_naming_it_for_report_and_resume(
    finished_run: RunFolder, tmp_path: Path, bench, case: str
) -> None:
    how, fragment = CORRUPT_PLANS[case]
    folder = copy_run(finished_run, tmp_path / "run")
    corrupt_plan(folder, how)
    before = untouched(folder)
    bench.refused(["report", str(folder.path), "-o", str(tmp_path / "r.md")], fragment)
    bench.refused(["pair", "--resume", str(folder.path)], fragment)
    with pytest.raises(CorruptRunFolder, match="plan.json"):
        runner(tmp_path).resume(folder.path)
    assert untouched(folder) == before  # nothing written (run.lock neither), nothing run


@pytest.mark.parametrize("figure", [0, 0.0, -1.5])
def test_a_logged_time_of_zero_or_less_is_one_line_from_report(
    finished_run: RunFolder, tmp_path: Path, figure: float
) -> None:
    rows = [json.loads(line) for line in finished_run.file("trials.jsonl").read_text().splitlines()]
    measured = next(r for r in rows if r["phase"] == "measured" and r["status"] == "ok")
    measured["value"] = figure
    folder = copy_run(finished_run, tmp_path / "run")
    folder.file("trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    stderr = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        status = main(["report", str(folder.path), "-o", str(tmp_path / "r.md")])
    text = stderr.getvalue().strip()
    assert status == 2 and text.count("\n") == 0, text
    assert f"trial {measured['index']}'s value is {figure}" in text and "positive" in text, text


@pytest.mark.parametrize(
    ("field", "value"),
    [("gpu_memory_bytes", [10**400]), ("cpu_count", 10**400), ("gpus_start", [{"power_w": 10**400}])],
)
def test_an_env_record_with_a_number_past_floats_is_one_line(
    finished_run: RunFolder, tmp_path: Path, bench, field: str, value
) -> None:
    """An integer of 400 digits in env.json is one line, with no figures folder left behind."""
    folder = copy_run(finished_run, tmp_path / "run")
    record = json.loads(folder.file("env.json").read_text())
    record[field] = value
    folder.file("env.json").write_text(json.dumps(record))
    bench.refused(["report", str(folder.path), "-o", str(tmp_path / "r.md")], "env.json", field)
    assert not (tmp_path / "r.md").exists() and not (tmp_path / "r-figures").exists()


def _row_field(number: int, key: str, raw: str):
    """Line ``number`` (1-based) of the log with ``key`` set to the JSON text ``raw``, written as is."""

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
    finished_run: RunFolder, tmp_path: Path, bench, case: str
) -> None:
    edit, fragment = CORRUPT_LOGS[case]
    folder = copy_run(finished_run, tmp_path / "run")
    path = folder.file("trials.jsonl")
    lines = path.read_text().splitlines(keepends=True)
    path.write_bytes("".join(edit(lines)).encode("utf-8", "surrogateescape"))
    before = path.read_bytes()
    bench.refused(["report", str(folder.path), "-o", str(tmp_path / "r.md")], "trials.jsonl", fragment)
    bench.refused(["pair", "--resume", str(folder.path)], "trials.jsonl", fragment)
    with pytest.raises(CorruptRunFolder, match="trials.jsonl"):
        runner(tmp_path).resume(folder.path)
    assert path.read_bytes() == before


def test_every_committed_run_folder_still_validates() -> None:
    """Every committed run folder passes the validation and its own tier's check of its settings."""
    folders = sorted(p.parent for p in (ROOT / "reports").rglob("plan.json"))
    assert folders
    for path in folders:
        Run.load(RunFolder(path), tiers=TIERS)  # raises for anything the validation refuses


@pytest.mark.parametrize("kind", ["a directory", "a FIFO", "a link to /dev/zero"])
def test_a_log_that_is_not_a_regular_file_is_one_line(
    finished_run: RunFolder, tmp_path: Path, bench, kind
) -> None:
    """A trials.jsonl that is a directory, a FIFO or a link to /dev/zero is one line; it never reads as an
    empty log.
    """

    folder = copy_run(finished_run, tmp_path / "run")
    log = folder.file("trials.jsonl")
    log.unlink()
    {
        "a directory": log.mkdir,
        "a FIFO": lambda: os.mkfifo(log),
        "a link to /dev/zero": lambda: log.symlink_to("/dev/zero"),
    }[kind]()
    bench.refused(
        ["report", str(folder.path), "-o", str(tmp_path / "r.md")],
        "trials.jsonl",
        "not a regular file",
    )
    bench.refused(["pair", "--resume", str(folder.path)], "trials.jsonl", "not a regular file")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


PLAN_KEYS = ("tier", "protocol", "cases", "schedule", "unit", "metric", "settings", "format")


def _report_or_one_line(folder: RunFolder, out: Path) -> None:
    """`bench report` of the folder gives a report (exit 0), or one line on stderr and exit 2."""

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
        folder = copy_run(finished_run, Path(scratch) / "run")
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
        folder = copy_run(finished_run, Path(scratch) / "run")
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
        folder = copy_run(finished_run, Path(scratch) / "run")
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
        folder = copy_run(finished_run, Path(scratch) / "run")
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
    """Every report reads env.json. A field of the record, of a resume or of a GPU snapshot unlike the
    recorder's is one line, never a crash.
    """
    record = json.loads(finished_run.file("env.json").read_text())
    if inside == "resumes":
        record["resumes"] = [{"recorded": "2026-12-01T16:00:00+00:00", "boot_id": "b", key: value}]
    elif inside == "gpus_start":
        record["gpus_start"] = [{"index": 0, "name": "NVIDIA H200", key: value}]
    else:
        record[key] = value
    with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
        folder = copy_run(finished_run, Path(scratch) / "run")
        folder.file("env.json").write_text(json.dumps(record))
        _report_or_one_line(folder, Path(scratch) / "r.md")


def test_a_list_of_resumes_that_is_not_one_is_one_line(finished_run: RunFolder, tmp_path: Path) -> None:
    folder = copy_run(finished_run, tmp_path / "run")
    record = json.loads(folder.file("env.json").read_text())
    folder.file("env.json").write_text(json.dumps({**record, "resumes": "oops"}))
    stderr = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        assert main(["report", str(folder.path), "-o", str(tmp_path / "r.md")]) == 2
    assert "env.json" in stderr.getvalue() and "resumes" in stderr.getvalue()
