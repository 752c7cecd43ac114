"""A trial's value past float's range is an error row that names the value, not an OverflowError."""

from __future__ import annotations

from pathlib import Path

from tests.trialfns import plan_of, runner


def test_a_whole_number_past_floats_range_is_an_error_row_naming_the_value(tmp_path: Path) -> None:
    folder = runner(tmp_path).start(plan_of("returns", warmup=0, pairs=1, returned=10**400)).folder
    for row in folder.rows():
        assert row["status"] == "error" and row["value"] is None, row
        assert "OverflowError" not in row["message"] and "beyond ±1e+30" in row["message"], row["message"]
        assert len(row["message"]) <= 100, row["message"]
