"""The run folder's format: declared once in ``harness.folder_format``, written as declared, documented from it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness import folder_format, stats
from harness.folder_format import format_reference
from tests import ROOT

DOC = ROOT / "docs" / "run-folder.md"


def test_the_committed_run_folder_doc_is_the_generated_text() -> None:
    """Regenerate with: python -c "from harness.folder_format import format_reference as f; print(f(), end='')"
    > docs/run-folder.md"""
    assert DOC.read_text() == format_reference()


def test_the_declared_columns_are_the_columns_the_statistics_write() -> None:
    assert list(folder_format.PAIR_COLUMNS) == stats.PAIR_COLUMNS
    assert set(folder_format.CLAIM_COLUMNS) <= set(stats.CLAIM_COLUMNS)
    assert list(stats.arm_table(pd.DataFrame()).columns) == list(folder_format.ARM_COLUMNS)


def test_a_run_writes_a_narrow_claims_table_and_long_tables_for_the_rest(tmp_path: Path) -> None:
    from harness.api import compare

    def slow() -> None:
        sum(range(20_000))

    def fast() -> None:
        sum(range(10_000))

    result = compare({"slow": slow, "fast": fast}, pairs=3, warmup=0, bar=5, out=tmp_path, quiet=True)
    folder = result.run.folder
    claims = pd.read_csv(folder.file("claims.csv"))
    assert list(claims.columns) == list(folder_format.CLAIM_COLUMNS) and len(claims.columns) <= 15
    assert claims["verdict"].tolist() == result.claims["verdict"].tolist()
    intervals = pd.read_csv(folder.file("claim_intervals.csv"))
    primary = intervals[intervals["interval"] == "primary"].iloc[0]
    assert (primary["low"], primary["high"]) == (claims["ci_low"].iloc[0], claims["ci_high"].iloc[0])
    assert {"geometric mean", "sign", "Hodges-Lehmann"} <= set(intervals["interval"])
    diagnostics = pd.read_csv(folder.file("claim_diagnostics.csv"))
    # every column of the claims table is in one of the three files
    long_names = set(diagnostics["name"])
    for column in result.claims.columns:
        in_interval = any(column.startswith(p + "_") for _, p, _ in stats.interval_families())
        assert column in claims.columns or column in long_names or in_interval or column == "drift", column


def test_a_new_statistic_lands_in_a_long_table_with_no_edit_to_the_writer() -> None:
    claims = pd.DataFrame(
        [{"case": "c", "arm": "b", "estimate": 0.1, "ci_low": 0.0, "ci_high": 0.2, "verdict": "clears"}]
    ).assign(new_statistic=1.5, new_low=1.0, new_high=2.0)
    tables = stats.claim_tables(claims)
    long = tables[folder_format.DIAGNOSTICS_CSV].set_index("name")["value"]
    assert long["new_statistic"] == 1.5 and long["new_low"] == 1.0 and long["new_high"] == 2.0
    assert "new_statistic" not in tables[folder_format.CLAIMS_CSV].columns
    primary = tables[folder_format.INTERVALS_CSV].iloc[0]
    assert (primary["interval"], primary["low"], primary["high"], primary["verdict"]) == (
        "primary",
        0.0,
        0.2,
        "clears",
    )


def test_every_field_the_protocol_writes_in_a_log_row_is_documented() -> None:
    from harness.trial import PROTOCOL_FIELDS

    declared = set(folder_format.TRIAL_COLUMNS)
    head = ["index", "case", "phase", "round", "slot", "order", "arm", "role", "spec"]  # protocol.row_head
    missing = [f for f in [*head, *PROTOCOL_FIELDS, "value"] if f not in declared]
    assert not missing, missing
