"""``compare`` checks its keywords with the one check of the options, naming each by its keyword."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from harness.api import compare
from harness.protocol_options import ProtocolOptions, check_protocol
from harness.schedule import Arm
from harness.schema import OptionError

ARMS = (Arm("slow", "baseline", "slow"), Arm("fast", "candidate", "fast"))


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"cooldown": 4000.0}, "cooldown"),
        ({"order": "zigzag"}, "order"),
        ({"seed": -1}, "seed"),
        ({"bar": 200}, "bar"),
        ({"pairs": 2.5}, "pairs"),
        ({"device": "tpu"}, "device"),
    ],
)
def test_compare_refuses_a_bad_keyword_by_the_one_check_naming_it(tmp_path: Path, given, field) -> None:
    with pytest.raises(OptionError) as expected:
        check_protocol(replace(ProtocolOptions(ARMS, pairs=2, warmup=0), **given), prefix="")
    with pytest.raises(OptionError) as raised:
        compare(
            {"slow": lambda: None, "fast": lambda: None}, out=tmp_path, **{"pairs": 2, "warmup": 0, **given}
        )
    assert (str(raised.value), raised.value.field) == (str(expected.value), field)
    assert str(raised.value).startswith(f"{field} ") and "--" not in str(raised.value)
    assert not tmp_path.exists() or not list(tmp_path.iterdir())
