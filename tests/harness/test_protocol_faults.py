"""Trial values no figure can be: error rows, never a claim; seeds at the generators' bounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trialfns import plan_of, runner


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
    """A ratio needs two positive figures: a trial timed at 0 or less is a failed trial, not an infinitely
    faster arm.
    """
    figures = {"baseline": [10, 10], "candidate": [8, figure]}
    folder = runner(tmp_path).start(plan_of("scripted", warmup=0, pairs=2, figures=figures)).folder
    rows = {(r["arm"], r["round"]): r for r in folder.rows()}
    bad = rows[("candidate", 1)]
    assert bad["status"] == "error" and bad["value"] is None, bad
    assert bad["message"].startswith("non-positive value:") and "ratio" in bad["message"], bad["message"]
    assert folder.file("report.md").exists() or folder.file("claims.csv").exists()


@pytest.mark.parametrize("returned", [None, "8 ms", True, [8.0]])
def test_a_value_that_is_not_a_number_is_an_error_row(tmp_path: Path, returned) -> None:
    folder = runner(tmp_path).start(plan_of("returns", warmup=0, pairs=1, returned=returned)).folder
    for row in folder.rows():
        assert row["status"] == "error" and "value" in row["message"] and row["value"] is None, row


def test_the_largest_seed_gives_trial_seeds_every_generator_takes(tmp_path: Path) -> None:
    folder = runner(tmp_path).start(plan_of("seeded", warmup=1, pairs=2, seed=2**63 - 1)).folder
    rows = folder.rows()
    assert all(r["status"] == "ok" for r in rows), [r["message"] for r in rows]
    assert len({r["seed_seen"] for r in rows}) == 3  # the warm-up and each round still have their own seed
