"""``scripts/reread_claims.py``: old and new figures of a committed claim, and its section replaced, not piled."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests import ROOT

FOLDER = "h200-decisive/upstream"  # one committed claim run: 6 pairs, read as 'insufficient' by the old t


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("reread_claims", ROOT / "scripts/reread_claims.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def test_a_committed_claim_reads_old_and_new(script, tmp_path: Path) -> None:
    """The committed folder with the claims table the t-primary statistics wrote: 11.14% [1.60%, 19.77%],
    insufficient at 6 pairs.
    """
    shutil.copytree(ROOT / "reports" / FOLDER, tmp_path / "upstream")
    for claims in (tmp_path / "upstream").rglob("claims.csv"):
        table = pd.read_csv(claims)
        old = table["arm"] == "candidate"
        table["verdict"] = table["verdict"].astype(object)
        table.loc[old, ["estimate", "ci_low", "ci_high", "verdict"]] = [
            0.1114,
            0.0160,
            0.1977,
            "insufficient",
        ]
        table.to_csv(claims, index=False)
    (row,) = [r for r in script.reread(tmp_path) if r.arm == "candidate"]
    assert row.old[3] == "insufficient" and row.new[3] in ("clears", "ambiguous", "fails")
    assert row.pairs == 6 and row.old[:3] != row.new[:3]


def test_the_section_opens_the_file_on_five_lines_and_replaces_an_earlier_one(script) -> None:
    rows = script.reread(ROOT / "reports" / FOLDER)
    once = script.insert("# report\n", script.render(rows))
    twice = script.insert(once, script.render(rows))
    assert twice == once and once.startswith(script.START)
    assert len(script.headline(rows)) == script.HEADLINE
    assert once.index(script.END) < once.index("# report")
