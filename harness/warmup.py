"""``--warmup auto``: warm-up sequences that run until two of one arm agree, read back from the log."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from harness.plan import Plan
from harness.protocol_options import ProtocolOptions
from harness.schedule import ScheduledTrial, letters


def warmup_agreement(previous: float | None, current: float | None) -> float | None:
    """ln(current / previous) of two warm-ups of one arm; None where either failed."""
    if previous is None or current is None or not (0 < previous < math.inf and 0 < current < math.inf):
        return None
    return math.log(current / previous)


def _figure(row: dict[str, Any]) -> float | None:
    """A warm-up row's figure; None where it failed."""
    return row.get("value") if row.get("status") == "ok" else None


def settles(change: float | None, tolerance: float) -> bool:
    """The settling rule: a warm-up no more than ``tolerance`` percent faster than its arm's previous one."""
    return change is not None and change >= -tolerance / 100


def settled_at(values: list[float | None], arms: list[str], tolerance: float) -> int | None:
    """The warm-up (counted from 1) at which a sequence settled; None if none did."""
    last: dict[str, float | None] = {}
    for count, (value, arm) in enumerate(zip(values, arms, strict=True), start=1):
        if arm in last and settles(warmup_agreement(last[arm], value), tolerance):
            return count
        last[arm] = value
    return None


@dataclass(frozen=True)
class WarmupSequence:
    """One ``--warmup auto`` sequence as its rows tell it."""

    number: int
    case: str
    reason: str
    rows: tuple[dict[str, Any], ...]
    tolerance: float
    cap: int

    @property
    def warmups(self) -> int:
        return len(self.rows)

    @property
    def settled(self) -> bool:
        arms = [str(r["arm"]) for r in self.rows]
        return settled_at([_figure(r) for r in self.rows], arms, self.tolerance) is not None

    @property
    def capped(self) -> bool:
        """It reached the cap without settling (the run went on unsettled)."""
        return not self.settled and self.warmups >= self.cap

    @property
    def done(self) -> bool:
        return self.settled or self.warmups >= self.cap


def warmup_sequences(rows: list[dict[str, Any]], protocol: ProtocolOptions) -> list[WarmupSequence]:
    """The run's ``--warmup auto`` sequences from its log (rows with a ``warmup_sequence``), in order."""
    grouped: dict[int, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: int(r["index"])):
        number = row.get("warmup_sequence")  # a float where a table of every row held it (NaN elsewhere)
        if row.get("phase") == "warmup" and isinstance(number, numbers.Real) and math.isfinite(number):
            grouped.setdefault(int(number), []).append(row)
    limits = (float(protocol.warmup_tolerance), int(protocol.max_warmup))
    return [
        WarmupSequence(
            number, str(mine[0]["case"]), str(mine[0].get("warmup_reason", "")), tuple(mine), *limits
        )
        for number, mine in sorted(grouped.items())
    ]


def next_auto_warmup(
    plan: Plan, rows: list[dict[str, Any]], unit: list[ScheduledTrial], reason: str
) -> tuple[ScheduledTrial, dict[str, Any]] | None:
    """The next ``--warmup auto`` warm-up before ``unit`` and its row's fields; None when ``unit`` may run."""
    sequences = warmup_sequences(rows, plan.protocol)
    open_ = [s for s in sequences if not s.done]
    if open_:
        number, why, done_rows = open_[-1].number, open_[-1].reason, list(open_[-1].rows)
        case = plan.case(open_[-1].case)
    else:
        case = plan.case(unit[0].case)
        started = any(s.case == case.label and s.reason == "start" for s in sequences)
        why = reason if started else "start"
        if not why:
            return None
        number, done_rows = 1 + max((s.number for s in sequences), default=-1), []
    labels = [a.label for a in case.arms]
    if done_rows:
        first = labels.index(str(done_rows[0]["arm"]))
    else:
        first = 0 if why == "start" else labels.index(unit[0].arm)
    step = len(done_rows)
    position = (first + step) % len(labels)
    arm = case.arms[position]
    used = {int(r["index"]) for r in rows} | {t.index for t in plan.schedule}
    slot = (step // len(labels), position, letters(len(labels))[position])
    trial = ScheduledTrial(max(used) + 1, case.label, "warmup", *slot, arm.label, arm.role)
    fields = {"warmup_reason": why, "warmup_sequence": number, "warmup_step": step + 1}
    return trial, fields


def warmup_row_fields(
    plan: Plan, rows: list[dict[str, Any]], row: dict[str, Any], number: int
) -> dict[str, Any]:
    """A finished ``--warmup auto`` row's agreement with its arm's previous warm-up, and if it settled."""
    mine = {"phase": "warmup", "warmup_sequence": number, "arm": row["arm"]}
    previous = [r for r in rows if all(r.get(key) == value for key, value in mine.items())]
    last = max(previous, key=lambda r: int(r["index"])) if previous else None
    agreement = None if last is None else warmup_agreement(_figure(last), _figure(row))
    settled = settles(agreement, plan.protocol.warmup_tolerance)
    return {"warmup_agreement": agreement, "warmup_settled": settled}
