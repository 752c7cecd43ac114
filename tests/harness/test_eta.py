"""The time left that the progress display shows: the log's trial times over the pending schedule."""

from __future__ import annotations

import pytest

from harness.estimate import seconds_left
from tests.trialfns import plan_of


def logged(plan, seconds: dict[str, float], count: int) -> list[dict]:
    """The first ``count`` scheduled trials as log rows, each arm's trials taking ``seconds[arm]``."""
    return [{"index": t.index, "arm": t.arm, "trial_seconds": seconds[t.arm]} for t in plan.schedule[:count]]


def test_nothing_is_estimated_before_a_trial_has_ended() -> None:
    plan = plan_of("scripted", warmup=0, pairs=2)
    assert seconds_left(plan, []) is None


def test_each_pending_trial_costs_its_arms_time_and_the_cool_down() -> None:
    plan = plan_of("scripted", warmup=0, pairs=3, cooldown=0.5)
    rows = logged(plan, {"baseline": 10.0, "candidate": 4.0}, 2)
    pending = plan.schedule[2:]
    expected = sum((10.0 if t.arm == "baseline" else 4.0) + 0.5 for t in pending)
    assert seconds_left(plan, rows) == pytest.approx(expected)


def test_a_concurrent_round_costs_its_longest_trial() -> None:
    plan = plan_of("scripted", warmup=0, pairs=3, order="duet")
    rows = logged(plan, {"baseline": 10.0, "candidate": 4.0}, 2)
    assert seconds_left(plan, rows) == pytest.approx(
        2 * 10.0
    )  # two rounds left, each as long as its baseline
