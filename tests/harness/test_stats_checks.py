"""The checks beside the primary interval come from one registry, ``stats.CHECKS``: a new check is one entry."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness import folder_format, intervals, stats
from tests import ROOT
from tests.harness.test_stats import claim_of, paired

VALUES = [(100.0, 100.0 * math.exp(-0.2 + 0.02 * z)) for z in np.random.default_rng(4).standard_normal(12)]


def test_each_registered_check_fills_its_columns_with_its_own_interval() -> None:
    claim = claim_of(paired(VALUES), bar_percent=8)
    x = np.log([c / b for b, c in VALUES])
    for check in stats.CHECKS:
        found = check.interval(x, 0.95)
        assert (claim[f"{check.prefix}_low"], claim[f"{check.prefix}_high"]) == (found.low, found.high)
        assert claim[f"{check.prefix}_method"] == found.method
        assert claim[f"{check.prefix}_verdict"] == stats.judge(found, 0.08, False)


def test_a_new_check_is_one_entry_and_is_reported_where_it_disagrees(monkeypatch) -> None:
    def never(log_ratios, level):  # a check that always finds a 50% loss
        return intervals.Interval(
            "loss", "always a loss", -0.5, -0.6, -0.4, level, level, len(log_ratios), True
        )

    monkeypatch.setattr(
        stats, "CHECKS", (*stats.CHECKS, stats.Check("the pessimist", "pessimist", "pess", never))
    )
    claim = claim_of(paired(VALUES), bar_percent=8)
    assert claim["verdict"] == "clears" and claim["pess_verdict"] == "fails"
    assert (claim["pess_estimate"], claim["pess_low"], claim["pess_high"]) == pytest.approx(
        (-0.5, -0.6, -0.4)
    )
    assert ("the pessimist", "pess") in stats.disagreeing_checks(claim)
    # the run folder's tables: a row of its own in claim_intervals.csv, nothing in claim_diagnostics.csv
    frame = paired(VALUES)
    claims = stats.claim_table(stats.pair_table(frame), stats.ClaimSettings(bar_percent=8), trials=frame)
    tables = stats.claim_tables(claims)
    rows = tables[folder_format.INTERVALS_CSV].set_index("interval")
    assert (rows.loc["pessimist", "low"], rows.loc["pessimist", "verdict"]) == (-0.6, "fails")
    assert not tables[folder_format.DIAGNOSTICS_CSV]["name"].str.startswith("pess_").any()


def test_each_check_is_named_in_the_statistics_doc() -> None:
    doc = (ROOT / "docs" / "statistics.md").read_text()
    assert all(f"| `{check.label}` |" in doc for check in stats.CHECKS)
