"""``scripts/reread_claims.py``: old and new figures of a committed claim, and its section replaced, not piled."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDER = "h200-decisive/upstream"  # one committed claim run: 6 pairs, read as 'insufficient' by the old t


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("reread_claims", ROOT / "scripts/reread_claims.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def test_a_committed_claim_reads_old_and_new(script) -> None:
    (row,) = [r for r in script.reread(ROOT / "reports" / FOLDER) if r.arm == "candidate"]
    assert row.old[3] == "insufficient" and row.new[3] in ("clears", "ambiguous", "fails")
    assert row.pairs == 6 and row.old[:3] != row.new[:3]


def test_the_section_opens_the_file_on_five_lines_and_replaces_an_earlier_one(script) -> None:
    rows = script.reread(ROOT / "reports" / FOLDER)
    once = script.insert("# report\n", script.render(rows))
    twice = script.insert(once, script.render(rows))
    assert twice == once and once.startswith(script.START)
    assert len(script.headline(rows)) == script.HEADLINE
    assert once.index(script.END) < once.index("# report")
