"""A run's length: estimated before its first trial, said, held to its budget; ``--pairs auto`` grows it.

A tier's own estimate refuses a plan at once; else one untimed first trial is the probe (docs/cli.md).
"""

from __future__ import annotations

import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pandas as pd

from harness.errors import InputError
from harness.folder_format import PLAN
from harness.injected import ROLE as CALIBRATION_ROLE
from harness.intervals import CONFIDENCE
from harness.placement import Placement
from harness.plan import Plan, drop_rounds, estimated_seconds, grow_schedule
from harness.protocol import PlannedStop, run_trial
from harness.schedule import CONCURRENT_ORDERS, ScheduledTrial
from harness.sequential import looks, should_stop
from harness.stats import ClaimSettings, pair_table
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


class StoppingRule:
    """Before each unit, looks at each case whose scheduled rounds have run; grows it unless every claim stops.

    A round that would take the log past ``--time-budget`` seconds ends its case there. Each decision is
    saved in ``plan.looks``, so a resume continues the same sequence.
    """

    def __init__(self, plan: Plan, folder: RunFolder, progress: Any = None) -> None:
        # progress: a console.ScheduleProgress (typed Any: the console imports this module)
        self.plan, self.folder, self.progress = plan, folder, progress

    def finished(self) -> bool:
        """Every case's last scheduled round has a decision to stop: the rule will grow no schedule."""
        for case in self.plan.cases:
            rounds = [t.round for t in self.plan.schedule if t.case == case.label and t.phase == "measured"]
            decision = self._decided(case.label, 1 + max(rounds)) if rounds else None
            if decision is None or not decision["stop"]:
                return False
        return True

    def _decided(self, case: str, rounds: int) -> dict | None:
        return next((d for d in self.plan.looks if d["case"] == case and d["rounds"] == rounds), None)

    def _decide(self, case: str, rows: list[dict], rounds: int, spent: str = "") -> dict[str, Any]:
        """The look's decision; ``spent``: why the time budget ends the case here."""
        p = self.plan.protocol
        trials = pd.DataFrame(rows)
        pairs = pair_table(trials[trials["case"] == case]) if not trials.empty else pd.DataFrame()
        last = bool(spent) or rounds >= p.max_pairs
        decisions = {}
        for arm, group in pairs.groupby("arm", sort=False) if not pairs.empty else ():
            x = group.loc[~group["both_failed"].astype(bool), "log_ratio"].to_numpy(dtype=float)
            if x.size == 0:
                decisions[str(arm)] = {"stop": False, "reason": "no usable pair yet", "half_width": None}
                continue
            decision = should_stop(x, p.precision, CONFIDENCE, p.first_look, p.max_pairs, budget_spent=last)
            interval = decision.interval
            half = interval.half_width if interval and interval.computable else None
            decisions[str(arm)] = {"stop": decision.stop, "reason": decision.reason, "half_width": half}
        baseline = str(pairs["baseline_arm"].iloc[0]) if not pairs.empty else ""
        calibration = (
            set(trials.loc[trials["role"] == CALIBRATION_ROLE, "arm"]) if "role" in trials else set()
        )
        mine = {a: d for a, d in decisions.items() if a not in calibration}  # recovered/known, no claim
        settings = ClaimSettings.from_protocol(p)
        claims = {a: d for a, d in mine.items() if not settings.is_control(a, baseline)} or mine
        # An A/A control's or a calibration arm's target does not hold a claim's stop.
        stop = last or (bool(claims) and all(d["stop"] for d in claims.values()))
        reason = spent or (
            "last look (max pairs)"
            if rounds >= p.max_pairs
            else "every claim's precision reached"
            if stop
            else "precision not reached by every claim"
        )
        if not spent:  # a target out of reach, said at the first look
            reach = [
                f"{a}:{d['reason'].split(';', 1)[1]}"
                for a, d in claims.items()
                if "pairs reach about" in d["reason"]
            ]
            reason += "".join(f"; {text}" for text in reach)
        return {"case": case, "rounds": rounds, "stop": stop, "reason": reason, "claims": decisions}

    def __call__(self, unit: list[ScheduledTrial]) -> bool:
        plan, protocol = self.plan, self.plan.protocol
        rows = self.folder.rows()
        done = {int(r["index"]) for r in rows}
        changed = False
        for case in plan.cases:
            scheduled = [t for t in plan.schedule if t.case == case.label and t.phase == "measured"]
            if not scheduled or any(t.index not in done for t in scheduled):
                continue
            rounds = 1 + max(t.round for t in scheduled)
            if self._decided(case.label, rounds) is not None:
                continue
            decision = self._decide(case.label, rows, rounds)
            plan.looks.append(decision)
            if not decision["stop"]:
                later = [n for n in looks(protocol.first_look, protocol.max_pairs) if n > rounds]
                grow_schedule(plan, case.label, later[0], max(done | {t.index for t in plan.schedule}) + 1)
            changed = True
        budget, first = protocol.time_budget, unit[0] if unit else None
        fresh = first is not None and first.phase == "measured"
        fresh = fresh and not any(r.get("case") == first.case and r.get("round") == first.round for r in rows)
        if not changed and budget is not None and fresh:
            spent = sum(float(r.get("trial_seconds") or 0.0) for r in rows)
            needed = sum(protocol.cooldown + estimated_seconds(t, rows) for t in unit)
            if spent + needed > budget:
                why = f"time budget spent: {spent:.0f} s of trials logged, the next round needs about "
                why += f"{needed:.0f} s more than the {budget:g} s allowed"
                plan.looks.append(self._decide(first.case, rows, first.round, why))
                drop_rounds(plan, first.case, done)
                changed = True
        if changed:
            self.folder.write_json(PLAN, plan.to_json())
            if self.progress is not None:
                self.progress.retotal(len(plan.schedule))
        return changed
