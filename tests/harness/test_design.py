"""The order a run takes when none is given: duet where the worker cores allow, else alternate."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import schedule
from harness.cli import main
from harness.tables import RunFolder


def plan(arms: int = 2, in_process: bool = False, gpus: int = 1) -> SimpleNamespace:
    case = SimpleNamespace(arms=tuple(range(arms)))
    return SimpleNamespace(
        cases=[case], in_process=in_process, tier="fit", protocol=SimpleNamespace(gpus=gpus)
    )


@pytest.mark.parametrize(
    ("made", "cores", "order"),
    [
        (plan(), 8, "duet"),
        (plan(), 7, "alternate"),
        (plan(arms=3), 8, "alternate"),  # a calibration arm makes three at once
        (plan(arms=3), 12, "duet"),
        (plan(in_process=True), 64, "alternate"),
        (plan(gpus=2), 64, "alternate"),
        (plan(), None, "alternate"),
    ],
)
def test_the_default_order_is_duet_where_the_cores_allow(
    made: SimpleNamespace, cores: int | None, order: str
) -> None:
    chosen = schedule.default_order(made, cores)
    assert chosen.order == order
    assert schedule.estimand(order) in chosen.text


def test_a_run_given_no_order_says_which_it_took_and_why(tmp_path: Path, capsys) -> None:
    argv = [
        "command",
        "--arms",
        "a,b",
        "--pairs",
        "1",
        "--warmup",
        "0",
        "--cpus",
        "0",
        "--out",
        str(tmp_path),
    ]
    assert main([*argv, "--quiet", "--no-report", "--", "true"]) == 0
    assert "order: alternate (1 worker core; a duet of 2 arms wants 8)" in capsys.readouterr().out
    (folder,) = tmp_path.iterdir()
    assert RunFolder.open(folder).read_json("plan.json")["protocol"]["order"] == "alternate"
