"""No surprise durations: a run's time is estimated before its first trial, said, and held to its budget.

A tier's own estimate refuses a plan at once; else one untimed first trial is the probe.
See docs/cli.md (--time-budget).
"""

from __future__ import annotations

import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from harness.errors import InputError
from harness.placement import Placement
from harness.plan import Plan, estimated_seconds
from harness.protocol import PlannedStop, run_trial
from harness.schedule import CONCURRENT_ORDERS, ScheduledTrial
from harness.tables import RunFolder

DEFAULT_CPU_BUDGET_S = 3600.0  # one hour: a CPU run longer than this must be asked for (--time-budget)


class OverBudget(InputError):
    """A plan whose estimated duration is over its time budget (exit 2, one line)."""


class TimeLimit(KeyboardInterrupt):
    """The probe ran past its limit (``time_limit``)."""


def budget_of(plan: Plan) -> float | None:
    """The seconds a plan may take (None: no cap): ``--time-budget``, else one hour on the CPU."""
    protocol = plan.protocol
    if protocol.pairs == "auto":
        return None
    if protocol.time_budget is not None:
        return float(protocol.time_budget)
    return DEFAULT_CPU_BUDGET_S if protocol.device == "cpu" else None


def seconds_left(plan: Plan, rows: list[dict[str, Any]]) -> float | None:
    """The unlogged trials' time with cool-downs (a concurrent round costs its longest); None: none timed."""
    if not any(r.get("trial_seconds") is not None for r in rows):
        return None
    logged = {int(r["index"]) for r in rows if r.get("index") is not None}
    together = plan.protocol.order in CONCURRENT_ORDERS
    rounds: dict[tuple[str, int], float] = {}
    total = 0.0
    for trial in plan.schedule:
        if trial.index in logged:
            continue
        cost = plan.protocol.cooldown + estimated_seconds(trial, rows)
        if together and trial.phase == "measured":
            rounds[(trial.case, trial.round)] = max(rounds.get((trial.case, trial.round), 0.0), cost)
        else:
            total += cost
    return total + sum(rounds.values())


def duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3.5 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise ``TimeLimit`` after ``seconds`` (SIGALRM); no limit off the main thread or without a figure."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def ring(signum: int, frame: Any) -> None:
        raise TimeLimit

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-4))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _over(plan: Plan, how_long: str, budget: float, advice: str) -> OverBudget:
    """``how_long``: ``about 2 h, over`` or ``over``, then the budget; the ways to shorten it."""
    return OverBudget(
        f"{len(plan.schedule)} trials would take {how_long} the time budget of {duration(budget)}: "
        f"shorten it (fewer --pairs, --steps or cases) or give {advice}"
    )


def refuse_by_estimate(plan: Plan, per_trial: float | None) -> None:
    """``OverBudget`` at once where a tier's own estimate of one trial puts the plan over its budget."""
    budget = budget_of(plan)
    seconds = seconds_left(plan, [{"index": -1, "trial_seconds": per_trial}]) if per_trial else None
    if budget is not None and seconds is not None and seconds > budget:
        how_long = f"about {duration(seconds)} (estimated before any trial), over"
        raise _over(plan, how_long, budget, f"--time-budget {seconds * 1.2:.0f}")


def probe_first(
    plan: Plan,
    trial_fn: Any,
    folder: RunFolder,
    placement: Placement | None,
    deadline: float | None,
    say: Callable[[str], None],
    on_start: Callable[[ScheduledTrial], None],
    resumed: bool = False,
) -> dict[str, Any] | None:
    """Run the first trial untimed and say the run's estimate; return the row to log (a warm-up's).

    Over budget raises ``OverBudget``, except for a ``resumed`` plan; past the deadline, ``PlannedStop``.
    The caller logs the row once the schedule runs, so the run does not count as resumed.
    """
    first = plan.schedule[0]
    keep = first.phase == "warmup"
    base = plan.protocol.cooldown * len(plan.schedule)
    per_trial = (seconds_left(plan, [{"index": -1, "trial_seconds": 1.0}]) or 0.0) - base
    budget = None if resumed else budget_of(plan)
    by_budget = None if budget is None or per_trial <= 0 else max(budget - base, 0.0) / per_trial
    by_deadline = None if deadline is None else max(deadline - time.monotonic(), 0.0)
    limits = [x for x in (by_budget, by_deadline) if x is not None]
    run_dir = folder.path if keep else folder.path / "probe"
    run_dir.mkdir(exist_ok=True)
    time.sleep(plan.protocol.cooldown)
    on_start(first)
    try:
        with time_limit(min(limits) if limits else None):
            row = run_trial(plan, first, trial_fn, run_dir, placement)
    except TimeLimit:
        if by_deadline is not None and min(limits) == by_deadline:
            raise PlannedStop(
                f"stopping before the first trial: it alone runs past --stop-after ({by_deadline:.1f} s were left)"
            ) from None
        advice = f"a larger --time-budget (the first trial alone ran past {min(limits):.1f} s)"
        raise _over(plan, "over", budget or 0.0, advice) from None
    finally:
        if not keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    seconds = seconds_left(plan, [{**row, "index": -1}])
    if seconds is None:
        return row if keep else None
    say(f"estimated: about {duration(seconds)} for {len(plan.schedule)} trials (from an untimed first trial)")
    if budget is not None and seconds > budget:
        raise _over(plan, f"about {duration(seconds)}, over", budget, f"--time-budget {seconds * 1.2:.0f}")
    first_unit = plan.protocol.cooldown + float(row["trial_seconds"])
    if deadline is not None and not keep and time.monotonic() + first_unit > deadline:
        raise PlannedStop(
            f"stopping before the first trial: it takes about {first_unit:.0f} s, more than is left of "
            "--stop-after"
        )
    return row if keep else None
