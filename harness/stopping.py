"""``--pairs auto``: the stopping rule that grows a case's schedule look by look, or ends it."""

from __future__ import annotations

from typing import Any

import pandas as pd

from harness.console import ScheduleProgress
from harness.folder_format import PLAN
from harness.injected import ROLE as CALIBRATION_ROLE
from harness.intervals import CONFIDENCE
from harness.plan import Plan, drop_rounds, estimated_seconds, grow_schedule
from harness.schedule import ScheduledTrial
from harness.sequential import looks, should_stop
from harness.stats import ClaimSettings, pair_table
from harness.tables import RunFolder


class StoppingRule:
    """Before each unit, looks at each case whose scheduled rounds have run; grows it unless every claim stops.

    A round that would take the log past ``--time-budget`` seconds ends its case there. Each decision is
    saved in ``plan.looks``, so a resume continues the same sequence.
    """

    def __init__(self, plan: Plan, folder: RunFolder, progress: ScheduleProgress | None = None) -> None:
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

    def _decide(self, case: str, rows: list[dict], rounds: int, budget_spent: bool) -> dict[str, Any]:
        p = self.plan.protocol
        trials = pd.DataFrame(rows)
        pairs = pair_table(trials[trials["case"] == case]) if not trials.empty else pd.DataFrame()
        last = budget_spent or rounds >= p.max_pairs
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
        if budget_spent:
            reason = "time budget spent"
        elif rounds >= p.max_pairs:
            reason = "last look (max pairs)"
        else:
            reason = "every claim's precision reached" if stop else "precision not reached by every claim"
        reach = [
            f"{a}:{d['reason'].split(';', 1)[1]}"
            for a, d in claims.items()
            if "pairs reach about" in d["reason"]
        ]
        reason += "".join(f"; {text}" for text in reach)  # a target out of reach, said at the first look
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
            decision = self._decide(case.label, rows, rounds, budget_spent=False)
            plan.looks.append(decision)
            if not decision["stop"]:
                later = [n for n in looks(protocol.first_look, protocol.max_pairs) if n > rounds]
                used = done | {t.index for t in plan.schedule}
                grow_schedule(plan, case.label, later[0], max(used) + 1)
            changed = True
        budget = protocol.time_budget
        first = unit[0] if unit else None
        if (
            not changed
            and budget is not None
            and first is not None
            and first.phase == "measured"
            and not any(r.get("case") == first.case and r.get("round") == first.round for r in rows)
        ):
            spent = sum(float(r.get("trial_seconds") or 0.0) for r in rows)
            needed = sum(protocol.cooldown + estimated_seconds(t, rows) for t in unit)
            if spent + needed > budget:
                decision = self._decide(first.case, rows, first.round, budget_spent=True)
                decision["reason"] = (
                    f"time budget spent: {spent:.0f} s of trials logged, the next round needs about "
                    f"{needed:.0f} s more than the {budget:g} s allowed"
                )
                plan.looks.append(decision)
                drop_rounds(plan, first.case, done)
                changed = True
        if changed:
            self.folder.write_json(PLAN, plan.to_json())
            if self.progress is not None:
                self.progress.retotal(len(plan.schedule))
        return changed
