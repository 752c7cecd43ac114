"""Committed run folders, each hand-edited in one field the report reads: one line and exit 2, never a
traceback.

The edits: a look of `--pairs auto` with no fields, a start with no time zone, telemetry of the wrong type or
past its range. Also an out-of-memory figure that is text, and settings or case parameters no run could have.
Also a tier's row figures edited to text, removed, or to a non-positive time where the figure is a ratio's.
Each case copies a committed folder, edits it and asks for the report. The refusal is one line naming the file
(and the log's line) and the field; nothing is written.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cli import Bench
from tests.runfolders import TIER_FOLDERS, dropped, set_field

Edit = Callable[[dict[str, Any]], None]


def _plan(change: Edit) -> tuple[str, Edit]:
    return "plan", change


def _row(position: int, change: Edit) -> tuple[str, Edit, int]:
    """An edit of the log's row on line ``position`` (1-based)."""
    return "row", change, position


def _resource_failure(record: dict[str, Any]) -> None:
    record.update(status="resource_failure", value=None, oom_requested="x")


# case: (folder, edit, fragments the one line names)
HOSTILE: dict[str, tuple[str, tuple[Any, ...], tuple[str, ...]]] = {
    "a look with no fields": ("pair", _plan(set_field("looks.0", {})), ("plan.json", "looks[0]")),
    "a look of a case the plan has not": (
        "pair",
        _plan(set_field("looks.0.case", "nowhere")),
        ("plan.json", "looks[0].case"),
    ),
    "a look whose rounds are text": (
        "pair",
        _plan(set_field("looks.0.rounds", "6")),
        ("plan.json", "looks[0].rounds"),
    ),
    "a start with no time zone": (
        "screen",
        _row(3, set_field("started", "2026-12-02T02:01:27")),
        ("trials.jsonl", "line 3", "started", "time zone"),
    ),
    "a throttle mask that is text": (
        "pair",
        _row(2, set_field("gpu0_throttle_mask_start", "x")),
        ("trials.jsonl", "line 2", "gpu0_throttle_mask_start"),
    ),
    "a throttle mask that is a list": (
        "pair",
        _row(2, set_field("gpu0_throttle_mask_start", [1])),
        ("trials.jsonl", "line 2", "gpu0_throttle_mask_start"),
    ),
    "a throttle mask past 64 bits": (
        "pair",
        _row(2, set_field("gpu0_throttle_mask_end", 2**64)),
        ("trials.jsonl", "line 2", "gpu0_throttle_mask_end"),
    ),
    "a throttle mask of 400 digits": (
        "pair",
        _row(2, set_field("gpu0_throttle_mask_start", 10**400)),
        ("trials.jsonl", "line 2", "gpu0_throttle_mask_start"),
    ),
    "a power violation that is text": (
        "pair",
        _row(4, set_field("gpu0_power_violation_s", "x")),
        ("trials.jsonl", "line 4", "gpu0_power_violation_s"),
    ),
    "a temperature that is text": (
        "screen",
        _row(5, set_field("gpu0_temperature_c_end", "hot")),
        ("trials.jsonl", "line 5", "gpu0_temperature_c_end"),
    ),
    "a switch count that is negative": (
        "screen",
        _row(5, set_field("worker_voluntary_switches", -3)),
        ("trials.jsonl", "line 5", "worker_voluntary_switches"),
    ),
    "a throttle reason that is a number": (
        "screen",
        _row(5, set_field("gpu0_throttle_reasons_start", 7)),
        ("trials.jsonl", "line 5", "gpu0_throttle_reasons_start"),
    ),
    "an out-of-memory request that is text": (
        "screen",
        _row(6, _resource_failure),
        ("trials.jsonl", "line 6", "oom_requested"),
    ),
    "a screen with no arm specs": (
        "screen",
        _plan(set_field("settings.arm_specs", [])),
        ("plan.json", "arm_specs"),
    ),
    "a screen's guarded spec no arm has": (
        "screen",
        _plan(set_field("settings.guarded_specs", ["nowhere"])),
        ("plan.json", "guarded_specs"),
    ),
    "a screen's default guard that is no guard": (
        "screen",
        _plan(set_field("settings.default_guards", {"candidate": "wide"})),
        ("plan.json", "default_guards"),
    ),
    "a fit's trial timeout that is text": (
        "pair",
        _plan(set_field("settings.trial_timeout", "x")),
        ("plan.json", "trial_timeout"),
    ),
    "a fit's checkpoints kept that is text": (
        "pair",
        _plan(set_field("settings.keep_checkpoints", "yes")),
        ("plan.json", "keep_checkpoints"),
    ),
    "a probe case with no params": (
        "probe",
        _plan(set_field("cases.0.params", {})),
        ("plan.json", "cases[0]"),
    ),
    "a probe softcap that is text": (
        "probe",
        _plan(set_field("cases.0.params.cap", "x")),
        ("plan.json", "cap"),
    ),
    "a probe softcap that is negative": (
        "probe",
        _plan(set_field("cases.1.params.cap", -1.0)),
        ("plan.json", "--cap"),
    ),
    "a probe case of another head": (
        "probe",
        _plan(set_field("cases.0.params.head", "detect")),
        ("plan.json", "cases[0]"),
    ),
    "a parity ratio that is text": (
        "parity",
        _row(1, set_field("bound_worst_ratio", "y")),
        ("trials.jsonl", "line 1", "bound_worst_ratio"),
    ),
    "a parity difference that is text": (
        "parity",
        _row(1, set_field("max_abs_diff", "x")),
        ("trials.jsonl", "line 1", "max_abs_diff"),
    ),
    "a parity row with no step": ("parity", _row(1, dropped("step")), ("trials.jsonl", "line 1", "step")),
    "a parity row of another step": (
        "parity",
        _row(2, set_field("step", 7)),
        ("trials.jsonl", "line 2", "step"),
    ),
    "a parity buffer count that is text": (
        "parity",
        _row(2, set_field("buffers_equal", "all")),
        ("trials.jsonl", "line 2", "buffers_equal"),
    ),
    "a stage's seconds that are text": (
        "stages",
        _row(1, set_field("stage_optimizer_s", "x")),
        ("trials.jsonl", "line 1", "stage_optimizer_s"),
    ),
    "a rank's matrices that are text": (
        "stages",
        _row(2, set_field("rank_matrices_here", ["x"])),
        ("trials.jsonl", "line 2", "rank_matrices_here"),
    ),
}

# The candidate's steady-state figure at zero or below: the paired statistics divide by it.
STEADY = {"zero": 0, "negative": -1, "text": "fast"}


def _copy(name: str, where: Path) -> Path:
    copy = where / "run"
    shutil.copytree(TIER_FOLDERS[name], copy)
    return copy


def _edit(folder: Path, how: tuple[Any, ...]) -> None:
    if how[0] == "plan":
        plan = json.loads((folder / "plan.json").read_text())
        how[1](plan)
        (folder / "plan.json").write_text(json.dumps(plan))
        return
    _, change, position = how
    lines = (folder / "trials.jsonl").read_text().splitlines()
    row = json.loads(lines[position - 1])
    change(row)
    lines[position - 1] = json.dumps(row)
    (folder / "trials.jsonl").write_text("\n".join(lines) + "\n")


def _refused(folder: Path, out: Path, bench: Bench, fragments: tuple[str, ...]) -> None:
    """The report of ``folder`` is one line naming each fragment, exit 2, nothing written."""
    error = bench.refused(["report", str(folder), "-o", str(out / "r.md")], *fragments)
    assert error.startswith("bench: error: "), error
    assert not (out / "r.md").exists() and not (out / "r-figures").exists()


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hand_edited_field_the_report_reads_is_one_line(tmp_path: Path, bench, case: str) -> None:
    """Each edit is one line naming the file and the field, from the validation, before the report reads it."""
    name, how, fragments = HOSTILE[case]
    folder = _copy(name, tmp_path)
    _edit(folder, how)
    _refused(folder, tmp_path, bench, fragments)


@pytest.mark.parametrize("value", list(STEADY))
def test_a_candidate_steady_figure_that_is_no_time_is_one_line(tmp_path: Path, bench, value: str) -> None:
    """`steady_s` of 0, −1 or text on the candidate's rows is one line.

    It is a time compared by ratio, so a row holds a positive number or null.
    """
    folder = _copy("pair", tmp_path)
    lines = (folder / "trials.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    first = next(n for n, row in enumerate(rows, 1) if row["role"] == "candidate" and row["status"] == "ok")
    for row in rows:
        if row["role"] == "candidate":
            row["steady_s"] = STEADY[value]
    (folder / "trials.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    _refused(folder, tmp_path, bench, ("trials.jsonl", f"line {first}:", "steady_s"))


def test_a_look_with_no_fields_refuses_a_resume_too(tmp_path: Path, bench) -> None:
    """A resume read the looks (``estimate.StoppingRule._decided``: KeyError 'case'); it validates them first, and is
    refused in one line before anything runs, the folder left as it was."""
    folder = _copy("pair", tmp_path)
    _edit(folder, _plan(set_field("looks.0", {})))
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    bench.refused(["pair", "--resume", str(folder), "--quiet", "--no-report"], "plan.json", "looks[0]")
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before
