"""The paired protocol's trial loop: each trial run and its row appended the moment it ends.

Words (arm, case, trial, warm-up, round, pair): docs/concepts.md."""

from __future__ import annotations

import datetime as _dt
import gc
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from harness import telemetry
from harness.errors import is_disk_full
from harness.placement import Placement, split_placement
from harness.plan import Plan, estimated_seconds, next_unit
from harness.schedule import (
    CONCURRENT_ORDERS,
    PARTNER_REASON,
    ScheduledTrial,
    duet_partners,
    fill_until_partners_end,
)
from harness.tables import RunFolder, RunFolderWriteError, encode_row
from harness.timing import TrialFailure
from harness.trial import (
    TrialContext,
    TrialFunction,
    UnusableValue,
    check_figure_names,
    check_value,
    row_head,
)
from harness.warmup import next_auto_warmup, warmup_row_fields


def _release_device_memory() -> None:
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def run_trial(
    plan: Plan,
    trial: ScheduledTrial,
    trial_fn: TrialFunction,
    run_dir: Path,
    placement: Placement | None = None,
) -> dict[str, Any]:
    """Run one scheduled trial and return its log row, whatever happens inside it."""
    case = plan.case(trial.case)
    arm = case.arm(trial.arm)
    row = row_head(plan, trial)
    row["started"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")
    process = "self" if plan.in_process else None  # a worker's usage comes back with its result
    cores = placement.worker_cores if placement is not None else None
    before = telemetry.snapshot(process, cores)
    started = time.perf_counter()
    failure: TrialFailure | None = None
    figures: dict[str, Any] = {}
    try:
        figures = dict(trial_fn(TrialContext(plan, trial, case, arm, run_dir, placement)))
        if "value" not in figures:
            raise ValueError("trial function returned no 'value'")
        check_figure_names(figures, row)
        check_value(figures["value"], plan.compared_by_ratio(case.label))
        try:
            encode_row(figures)
        except (TypeError, ValueError) as exc:  # the row cannot be logged: the trial's failure, not the run's
            raise UnusableValue(f"the trial returned a figure the log cannot hold ({exc})") from None
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM: the run stops; an arm's sys.exit is its trial's error below
        raise
    except UnusableValue as exc:
        failure = TrialFailure("error", str(exc), {})
    except BaseException as exc:  # noqa: BLE001 - every failure is a recorded result
        if is_disk_full(exc):  # not the arm's failure: the run stops and a resume runs this trial again
            where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
            raise RunFolderWriteError(
                f"trial {trial.index + 1} could not write: {getattr(exc, 'strerror', None) or exc}{where}"
            ) from None
        failure = TrialFailure.from_exception(exc, plan.protocol.budget)
        del exc
    finally:
        _release_device_memory()
    row["trial_seconds"] = round(time.perf_counter() - started, 6)
    usage = figures.pop(telemetry.USAGE_KEY, None)
    row.update(
        telemetry.trial_fields(before, telemetry.snapshot(process, cores), telemetry.usage_from(usage))
    )
    if failure is None and set(figures) & set(row):  # a figure never shadows what the harness measured
        taken = ", ".join(sorted(set(figures) & set(row)))
        failure = TrialFailure("error", f"the trial returned {taken}, which the harness measures itself", {})
    if failure is None:
        row.update(status="ok", message="", **figures)
    else:
        row.update(status=failure.status, message=failure.message, value=None)
        row.update({f"oom_{k}": v for k, v in failure.oom.items()})
    return row


class PlannedStop(KeyboardInterrupt):
    """A clean stop between trials (``--stop-after``): it passes through like Ctrl-C, the log keeps every
    finished trial, and a resume continues with the next one."""


# An idle gap after which the next measured trial is preceded by one untimed warm-up. Measured on the
# committed H200 logs (each trial's start stamp and duration against the next one's start): between the
# trials of one command the gap was at most 0.01 s (every fit, probe and screen run), while the slices of a
# run cut by --stop-after and resumed left gaps of 18.7-25.5 s, and the fit after such a gap was the A/A's
# worst pair (65.3 s against 54.5 s). 10 s lies a thousand times above the first and below half the
# shortest of the second; the deliberate --cooldown pause is not counted. A resume always gets the warm-up,
# whatever its gap.
IDLE_GAP_SECONDS = 10.0


def _log_end(rows: list[dict[str, Any]]) -> float | None:
    """Wall-clock seconds (epoch) when the log's last trial ended, from its start stamp and duration."""
    ends = []
    for r in rows:
        try:
            start = _dt.datetime.fromisoformat(str(r["started"])).timestamp()
            ends.append(start + float(r["trial_seconds"]))
        except (KeyError, TypeError, ValueError):
            continue
    return max(ends) if ends else None


def run_schedule(
    plan: Plan,
    trial_fn: TrialFunction,
    folder: RunFolder,
    on_trial_start: Callable[[ScheduledTrial], None] | None = None,
    on_trial_end: Callable[[dict[str, Any]], None] | None = None,
    deadline: float | None = None,
    placement: Placement | None = None,
    before_unit: Callable[[list[ScheduledTrial]], bool] | None = None,
    warm_after_gaps: bool = True,
) -> None:
    """Run every pending trial, appending each row to the log (fsynced) as soon as the trial ends."""
    cooldown = plan.protocol.cooldown
    together = plan.protocol.order in CONCURRENT_ORDERS
    runs = _Trials(plan, trial_fn, folder, on_trial_start, on_trial_end, placement)
    rows = folder.rows()
    resumed = bool(rows)
    wall_end = _log_end(rows)
    last_end: float | None = None if wall_end is None else time.monotonic() - max(time.time() - wall_end, 0.0)
    while True:
        unit = next_unit(plan, folder)
        if before_unit is not None and before_unit(unit):
            continue
        if not unit:
            return
        rows = folder.rows()
        started_round = unit[0].phase == "measured" and any(
            r.get("case") == unit[0].case and r.get("round") == unit[0].round and r.get("phase") == "measured"
            for r in rows
        )
        partners = duet_partners(plan, unit, rows) if together and started_round else []
        concurrent = together and unit[0].phase == "measured" and len(unit) + len(partners) > 1

        def late(needed: float, started: bool = started_round) -> bool:
            """Whether ``--stop-after`` ends before ``needed`` seconds more (a started round always ends)."""
            return (
                deadline is not None and not started and needed > 0 and time.monotonic() + needed > deadline
            )

        reason = ""
        if unit[0].phase == "measured" and warm_after_gaps:
            gap = None if last_end is None else time.monotonic() - last_end
            if resumed:
                reason = "resume"
            elif gap is not None and gap > IDLE_GAP_SECONDS:
                reason = f"idle gap of {gap:.0f} s"
        estimates = [estimated_seconds(t, rows) for t in unit]
        needed = cooldown + max(estimates) if concurrent else sum(cooldown + e for e in estimates)
        if plan.protocol.auto_warmup and unit[0].phase == "measured":
            warm = next_auto_warmup(plan, rows, unit, reason)
            if warm is not None:
                trial, fields = warm
                # Before a sequence's first warm-ups, time for the fewest that can settle it (each arm once,
                # then the first again); before a later one, for itself: either way with the unit after it.
                arms = len(plan.case(trial.case).arms)
                fewest = max(1, arms + 1 - (fields["warmup_step"] - 1))
                needed += fewest * (cooldown + estimated_seconds(trial, rows))
                if late(needed):
                    what = f"warm-up {fields['warmup_step']} of the {fields['warmup_reason']} sequence"
                    raise _planned_stop(
                        what, f"{trial.arm}; with the warm-ups and the trials after it", needed, deadline
                    )

                def annotate(row: dict[str, Any], number: int = fields["warmup_sequence"]) -> None:
                    row.update(warmup_row_fields(plan, folder.rows(), row, number))

                extra = {k: v for k, v in fields.items() if k != "warmup_reason"}
                last_end = runs.one(trial, fields["warmup_reason"], extra, annotate)
                resumed = False
                continue
            reason = ""  # with --warmup auto a sequence, not one warm-up, follows a resume or a gap
        if reason:
            needed += cooldown + estimated_seconds(unit[0], rows)
        # A unit with nothing to estimate from (no finished trial yet) runs: only the log can say it would not fit.
        if late(needed):
            raise _planned_stop(
                _unit_text(plan, unit), ", ".join(t.arm for t in unit) + ",", needed, deadline
            )
        if reason:
            # An untimed warm-up of the unit's first arm, outside the saved schedule: numbered above every index.
            used = {int(r["index"]) for r in rows} | {t.index for t in plan.schedule}
            runs.one(replace(unit[0], index=max(used) + 1, phase="warmup"), reason)
        if concurrent:
            if cooldown:
                time.sleep(cooldown)
            if partners:  # a half-done round runs again whole (harness.schedule), numbered after any warm-up
                partners = duet_partners(plan, unit, folder.rows())
            runs.together([*unit, *partners])
            last_end = time.monotonic()
        else:
            for trial in unit:
                last_end = runs.one(trial)
        resumed = False  # any trial run since the resume has warmed the machine


def _unit_text(plan: Plan, unit: list[ScheduledTrial]) -> str:
    """A unit as ``--stop-after`` names it: a warm-up, a pair or a round, by its trials in the schedule."""
    first, last = unit[0], unit[-1]
    position = [t.index for t in plan.schedule]
    trials = f"trial {position.index(first.index) + 1}" + (
        f"–{position.index(last.index) + 1}" if len(unit) > 1 else ""
    )
    if first.phase != "measured":
        return f"warm-up {trials} of {len(plan.schedule)}"
    return f"{'pair' if len(unit) == 2 else 'round'} {first.round + 1} ({trials} of {len(plan.schedule)})"


def _planned_stop(what: str, detail: str, needed: float, deadline: float) -> PlannedStop:
    """The stop before ``what``: ``detail`` (its arms), its seconds by the log and those left."""
    left = max(deadline - time.monotonic(), 0)
    return PlannedStop(
        f"stopping before {what} ({detail} about {needed:.0f} s by the log; {left:.0f} s left of --stop-after)"
    )


@dataclass(frozen=True)
class _Trials:
    """How one schedule's trials run: each alone after the cool-down, or a duet round's at once."""

    plan: Plan
    trial_fn: TrialFunction
    folder: RunFolder
    on_trial_start: Callable[[ScheduledTrial], None] | None
    on_trial_end: Callable[[dict[str, Any]], None] | None
    placement: Placement | None

    def one(
        self,
        trial: ScheduledTrial,
        warmup_reason: str = "",
        fields: dict[str, Any] | None = None,
        annotate: Callable[[dict[str, Any]], None] | None = None,
    ) -> float:
        """Run one trial after the cool-down, log its row (with ``fields``, then ``annotate``'s, for a warm-up
        outside the schedule), and return when it ended (``time.monotonic()``)."""
        if self.plan.protocol.cooldown:
            time.sleep(self.plan.protocol.cooldown)
        if self.on_trial_start:
            self.on_trial_start(trial)
        row = run_trial(self.plan, trial, self.trial_fn, self.folder.path, self.placement)
        ended = time.monotonic()
        if warmup_reason:
            row["warmup_reason"] = warmup_reason
        row.update(fields or {})
        if annotate is not None:
            annotate(row)
        self.folder.append_row(row)
        if self.on_trial_end:
            self.on_trial_end(row)
        return ended

    def together(self, batch: list[ScheduledTrial]) -> None:
        """The trials of one duet round at once (worker tiers only), each row appended as its trial ends.

        A half whose trial has ended runs fillers until its partners end (``harness.schedule``)."""
        plan, folder = self.plan, self.folder
        if plan.in_process:
            raise ValueError("a concurrent order needs a tier whose trials run in worker processes")
        lock = threading.Lock()
        rows: list[dict[str, Any]] = []
        failures: list[BaseException] = []
        ended = {trial.index: threading.Event() for trial in batch}

        def one(trial: ScheduledTrial, where: Placement | None) -> None:
            try:
                row = run_trial(plan, trial, self.trial_fn, folder.path, where)
                row["concurrent_with"] = [t.index for t in batch if t.index != trial.index]
                if trial.phase == "warmup":  # a partner of a half-done round's missing trial
                    row["warmup_reason"] = PARTNER_REASON
                with lock:
                    folder.append_row(row)
                    rows.append(row)
            except BaseException as exc:  # noqa: BLE001 - raised again below: a failed write stops the run
                failures.append(exc)
            finally:
                ended[trial.index].set()
            if not failures:
                case = plan.case(trial.case)
                fill_until_partners_end(
                    lambda filler, stop: TrialContext(
                        plan, filler, case, case.arm(trial.arm), folder.path, where, cancel=stop
                    ),
                    trial,
                    self.trial_fn,
                    folder.path,
                    [event for index, event in ended.items() if index != trial.index],
                )

        for trial in batch:
            if self.on_trial_start:
                self.on_trial_start(trial)
        threads = [
            threading.Thread(target=one, args=(trial, where), daemon=True)
            for trial, where in zip(batch, duet_placements(self.placement, batch), strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for row in sorted(rows, key=lambda r: r["index"]):
            if self.on_trial_end:
                self.on_trial_end(row)
        if failures:
            raise failures[0]


def duet_placements(placement: Placement | None, trials: list[ScheduledTrial]) -> list[Placement | None]:
    """One share of the worker cores per slot of a duet round: slot k runs on the k-th share.

    The arms' order alternates from round to round (AB, BA, …), so each arm takes each share in turn."""
    if placement is None:
        return [None] * len(trials)
    shares = split_placement(placement, len(trials))
    return [shares[t.slot] for t in trials]


def concurrent_problem(plan: Plan, placement: Placement | None) -> str | None:
    """Why the plan's concurrent order cannot run here (None where it can, or the order is not concurrent).

    A round's arms run at once, each in its own worker process on its own share of the worker cores."""
    order = plan.protocol.order
    if order not in CONCURRENT_ORDERS:
        return None
    if plan.in_process:
        return (
            f"--order {order} runs a round's arms at once, each in its own worker process, and the {plan.tier} "
            "tier's trials run in this process; use --order alternate"
        )
    at_once = max(len(case.arms) for case in plan.cases)
    if placement is not None and len(placement.worker_cores) < at_once:
        return (
            f"--order {order} runs {at_once} arms at once, one per share of the worker cores, so it needs "
            f"{at_once} worker cores, and --cpus {plan.protocol.cpus} leaves {len(placement.worker_cores)}; "
            "give more cores, or use --order alternate"
        )
    return None
