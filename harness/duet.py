"""A duet round a crash left half done: its missing trials run again beside partners, never alone.

A duet pair compares two fits that shared the machine. Its missing trial, run alone on every worker core,
would be compared with a contended partner. So the round's logged trials run again beside it, as untimed
warm-ups outside the schedule (``warmup_reason`` ``duet partner``): the missing trial is contended as its
partner was, and the log keeps one measured row per slot.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the protocol imports this module
    from harness.protocol import Plan, ScheduledTrial

PARTNER_REASON = "duet partner"


def duet_partners(plan: Plan, unit: list[ScheduledTrial], rows: list[dict[str, Any]]) -> list[ScheduledTrial]:
    """Warm-ups of the arms of ``unit``'s round the log already holds (empty where the round is not started,
    or not a measured round); their indices lie above every index of the schedule and the log."""
    if not unit or unit[0].phase != "measured":
        return []
    first = unit[0]
    pending = {t.index for t in unit}
    logged = [
        t
        for t in plan.schedule
        if t.case == first.case
        and t.round == first.round
        and t.phase == "measured"
        and t.index not in pending
    ]
    used = {int(r["index"]) for r in rows} | {t.index for t in plan.schedule}
    start = max(used, default=-1) + 1
    return [replace(t, index=start + n, phase="warmup") for n, t in enumerate(logged)]
