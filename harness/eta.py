"""How long the rest of a run will take, by its log: what the progress display says is left."""

from __future__ import annotations

from typing import Any

from harness.protocol import CONCURRENT_ORDERS, Plan, estimated_seconds


def seconds_left(plan: Plan, rows: list[dict[str, Any]]) -> float | None:
    """The schedule's pending trials, each as long as ``--stop-after`` expects it (``estimated_seconds``).

    A concurrent order's measured round costs its longest trial, not their sum; each trial adds the
    cool-down. None while the log holds no timed trial to estimate from.
    """
    if not any(r.get("trial_seconds") is not None for r in rows):
        return None
    logged = {int(r["index"]) for r in rows}
    together = plan.protocol.order in CONCURRENT_ORDERS
    rounds: dict[tuple[str, int], float] = {}
    total = 0.0
    for trial in plan.schedule:
        if trial.index in logged:
            continue
        cost = plan.protocol.cooldown + estimated_seconds(trial, rows)
        if together and trial.phase == "measured":
            key = (trial.case, trial.round)
            rounds[key] = max(rounds.get(key, 0.0), cost)
        else:
            total += cost
    return total + sum(rounds.values())
