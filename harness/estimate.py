"""No surprise durations: once the first trial has run (an untimed warm-up where the plan has one), the run's
remaining time is estimated from the log and said; a plan over its time budget stops there, with one line.

The budget is ``--time-budget`` seconds, else ``DEFAULT_CPU_BUDGET_S`` on the CPU (none on a GPU). With
``--pairs auto`` the stopping rule spends the budget instead. A resume is never refused: its plan was accepted.
"""

from __future__ import annotations

from typing import Any

from harness.errors import InputError
from harness.protocol import CONCURRENT_ORDERS, Plan, ScheduledTrial, estimated_seconds, pending
from harness.tables import RunFolder

DEFAULT_CPU_BUDGET_S = 3600.0  # one hour: a CPU run longer than this must be asked for (--time-budget)


class OverBudget(InputError):
    """A plan whose estimated duration is over its time budget (exit 2, one line)."""


def budget_of(plan: Plan) -> float | None:
    """The seconds a plan may take (None: no cap): ``--time-budget``, else one hour on the CPU."""
    protocol = plan.protocol
    if protocol.pairs == "auto":
        return None
    if protocol.time_budget is not None:
        return float(protocol.time_budget)
    return DEFAULT_CPU_BUDGET_S if protocol.device == "cpu" else None


def remaining_seconds(plan: Plan, todo: list[ScheduledTrial], rows: list[dict[str, Any]]) -> float:
    """The pending trials' time by the log (each arm's longest trial), with cool-downs; a duet round once."""
    cooldown = plan.protocol.cooldown
    rounds: dict[tuple[str, int, str], float] = {}
    total = 0.0
    for trial in todo:
        seconds = cooldown + estimated_seconds(trial, rows)
        if trial.phase == "measured" and plan.protocol.order in CONCURRENT_ORDERS:
            key = (trial.case, trial.round, trial.phase)
            rounds[key] = max(rounds.get(key, 0.0), seconds)
        else:
            total += seconds
    return total + sum(rounds.values())


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


class Estimate:
    """Said once, before the second trial: the remaining time; ``OverBudget`` where it is over the budget."""

    def __init__(self, plan: Plan, say: Any, fresh: bool) -> None:
        self.plan, self.say, self.fresh, self.said = plan, say, fresh, False

    def __call__(self, folder: RunFolder) -> None:
        if self.said:
            return
        todo, rows = list(pending(self.plan, folder)), folder.rows()
        if not todo or not any(r.get("trial_seconds") is not None for r in rows):
            return
        self.said = True
        seconds = remaining_seconds(self.plan, todo, rows)
        trials = f"{len(todo)} trial" + ("" if len(todo) == 1 else "s")
        self.say(f"estimated: about {_duration(seconds)} more for {trials} (from the log's first)")
        budget = budget_of(self.plan)
        if self.fresh and budget is not None and seconds > budget:
            raise OverBudget(
                f"the plan would take about {_duration(seconds)}, over the time budget of {_duration(budget)}: "
                f"shorten it (fewer --pairs, --steps or cases) or give --time-budget {seconds * 1.2:.0f}; "
                f"{folder.path} holds the first trial (--resume it to run the rest anyway)"
            )
