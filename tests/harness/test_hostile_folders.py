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
from pathlib import Path
from typing import Any

import pytest

from tests.runfolders import copy_tier_run, dropped, edit_folder, refused_report, set_field


def _resource_failure(record: dict[str, Any]) -> None:
    record.update(status="resource_failure", value=None, oom_requested="x")


# case: (folder, where: "plan" or the log's line, dotted field, value, what the line names besides the file:
# by default the field's last part). A callable value is an edit of the whole record. A row's line is named too.
HOSTILE: dict[str, tuple[Any, ...]] = {
    "a look with no fields": ("pair", "plan", "looks.0", {}, "looks[0]"),
    "a look of a case the plan has not": ("pair", "plan", "looks.0.case", "nowhere", "looks[0].case"),
    "a look whose rounds are text": ("pair", "plan", "looks.0.rounds", "6", "looks[0].rounds"),
    "a start with no time zone": ("screen", 3, "started", "2026-12-02T02:01:27", "started", "time zone"),
    "a throttle mask that is text": ("pair", 2, "gpu0_throttle_mask_start", "x"),
    "a throttle mask that is a list": ("pair", 2, "gpu0_throttle_mask_start", [1]),
    "a throttle mask past 64 bits": ("pair", 2, "gpu0_throttle_mask_end", 2**64),
    "a throttle mask of 400 digits": ("pair", 2, "gpu0_throttle_mask_start", 10**400),
    "a power violation that is text": ("pair", 4, "gpu0_power_violation_s", "x"),
    "a temperature that is text": ("screen", 5, "gpu0_temperature_c_end", "hot"),
    "a switch count that is negative": ("screen", 5, "worker_voluntary_switches", -3),
    "a throttle reason that is a number": ("screen", 5, "gpu0_throttle_reasons_start", 7),
    "an out-of-memory request that is text": ("screen", 6, "oom_requested", _resource_failure),
    "a screen with no arm specs": ("screen", "plan", "settings.arm_specs", []),
    "a screen's guarded spec no arm has": ("screen", "plan", "settings.guarded_specs", ["nowhere"]),
    "a screen's default guard that is no guard": (
        "screen",
        "plan",
        "settings.default_guards",
        {"candidate": "wide"},
    ),
    "a fit's trial timeout that is text": ("pair", "plan", "settings.trial_timeout", "x"),
    "a fit's checkpoints kept that is text": ("pair", "plan", "settings.keep_checkpoints", "yes"),
    "a probe case with no params": ("probe", "plan", "cases.0.params", {}, "cases[0]"),
    "a probe softcap that is text": ("probe", "plan", "cases.0.params.cap", "x"),
    "a probe softcap that is negative": ("probe", "plan", "cases.1.params.cap", -1.0, "--cap"),
    "a probe case of another head": ("probe", "plan", "cases.0.params.head", "detect", "cases[0]"),
    "a parity ratio that is text": ("parity", 1, "bound_worst_ratio", "y"),
    "a parity difference that is text": ("parity", 1, "max_abs_diff", "x"),
    "a parity row with no step": ("parity", 1, "step", dropped("step")),
    "a parity row of another step": ("parity", 2, "step", 7),
    "a parity buffer count that is text": ("parity", 2, "buffers_equal", "all"),
    "a stage's seconds that are text": ("stages", 1, "stage_optimizer_s", "x"),
    "a rank's matrices that are text": ("stages", 2, "rank_matrices_here", ["x"]),
}

# The candidate's steady-state figure at zero or below: the paired statistics divide by it.
STEADY = {"zero": 0, "negative": -1, "text": "fast"}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hand_edited_field_the_report_reads_is_one_line(tmp_path: Path, bench, case: str) -> None:
    """Each edit is one line naming the file and the field, from the validation, before the report reads it."""
    name, where, path, value, *names = HOSTILE[case]
    folder = copy_tier_run(name, tmp_path)
    edit_folder(folder, where, value if callable(value) else set_field(path, value))
    names = names or [path.split(".")[-1]]
    fragments = ("plan.json", *names) if where == "plan" else ("trials.jsonl", f"line {where}", *names)
    refused_report(bench, folder, tmp_path, fragments)


@pytest.mark.parametrize("value", list(STEADY))
def test_a_candidate_steady_figure_that_is_no_time_is_one_line(tmp_path: Path, bench, value: str) -> None:
    """`steady_s` of 0, −1 or text on the candidate's rows is one line.

    It is a time compared by ratio, so a row holds a positive number or null.
    """
    folder = copy_tier_run("pair", tmp_path)
    lines = (folder / "trials.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    first = next(n for n, row in enumerate(rows, 1) if row["role"] == "candidate" and row["status"] == "ok")
    for row in rows:
        if row["role"] == "candidate":
            row["steady_s"] = STEADY[value]
    (folder / "trials.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    refused_report(bench, folder, tmp_path, ("trials.jsonl", f"line {first}:", "steady_s"))


def test_a_look_with_no_fields_refuses_a_resume_too(tmp_path: Path, bench) -> None:
    """A resume read the looks (``estimate.StoppingRule._decided``: KeyError 'case'); it validates them first, and is
    refused in one line before anything runs, the folder left as it was."""
    folder = copy_tier_run("pair", tmp_path)
    edit_folder(folder, "plan", set_field("looks.0", {}))
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    bench.refused(["pair", "--resume", str(folder), "--quiet", "--no-report"], "plan.json", "looks[0]")
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before
