"""The runner: plan → run folder → schedule → log → tables → console (→ report), for any registered tier.

``Runner.start`` builds the trial function before anything touches the disk, so a plan that cannot run leaves
no half-written folder; ``Runner.resume`` reopens a folder and runs only the trials with no row yet. The runner
is the only writer of a run folder: the log as each trial ends, then the tables (the harness's and the tier's)
and the tier's claim; the report only reads.
"""

from __future__ import annotations

import datetime as _dt
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from harness import env
from harness.codepaths import what_ran
from harness.console import ScheduleProgress, console, errors, print_summary
from harness.options import InputError, resolve_placement
from harness.placement import Placement, parent_pinned, pin_parent, unpin_parent
from harness.protocol import Plan, PlannedStop, TrialFunction, pending, run_schedule
from harness.tables import ENV, PLAN, RunFolder
from harness.tier import Run, TierRegistry
from harness.timing import apply_budget, release_budget

CLAIM_FILE = "claim.txt"


@dataclass(frozen=True)
class RunOptions:
    """How a command runs (not part of the plan): where, how loudly, with a report, and until when."""

    out: Path = Path("runs")
    quiet: bool = False
    report: bool = True
    stop_after: float | None = None  # seconds from the runner's creation; see ``run_schedule``


def new_run_folder(runs_root: str | Path, tier: str) -> RunFolder:
    """A fresh, uniquely named folder ``<root>/<tier>-<UTC time>-<random>``."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = Path(runs_root) / f"{tier}-{stamp}-{secrets.token_hex(2)}"
    path.mkdir(parents=True, exist_ok=False)
    return RunFolder(path)


class Runner:
    """Carries runs of registered tiers from plan to tables (the one way every command and the API run)."""

    def __init__(self, tiers: TierRegistry, options: RunOptions | None = None) -> None:
        self.tiers = tiers
        self.options = options or RunOptions()
        stop_after = self.options.stop_after
        self.deadline = None if stop_after is None else time.monotonic() + stop_after

    def start(self, plan: Plan, trial_fn: TrialFunction | None = None) -> Run:
        """Start a new run of ``plan`` under ``options.out`` and carry it to the end."""
        trial_fn = trial_fn or self.tiers.get(plan.tier).trial_function(plan)
        placement = resolve_placement(plan.protocol.cpus)
        with _device_budget(plan):  # a budget the device refuses fails here, before any folder exists
            folder = new_run_folder(self.options.out, plan.tier)
            folder.write_json(PLAN, plan.to_json())
            record = env.collect(touch_device=plan.in_process)
            record["placement"] = None if placement is None else placement.to_dict()
            folder.write_json(ENV, record)
            return self._carry_out(plan, trial_fn, folder, placement)

    def resume(self, path: str | Path, trial_fn: TrialFunction | None = None) -> Run:
        """Continue an interrupted run exactly where it stopped: the saved schedule, minus the finished trials."""
        folder = RunFolder.open(path)
        plan = Plan.from_json(folder.read_json(PLAN))
        trial_fn = trial_fn or self.tiers.get(plan.tier).trial_function(plan)
        placement = resolve_placement(plan.protocol.cpus)  # this machine's, for the plan's --cpus
        record = folder.read_json(ENV) or {}
        record.setdefault("resumes", []).append(
            {
                "recorded": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "gpus": env.gpu_snapshot(),
                "placement": None if placement is None else placement.to_dict(),
            }
        )
        folder.write_json(ENV, record)
        with _device_budget(plan):
            return self._carry_out(plan, trial_fn, folder, placement)

    def finish(self, folder: RunFolder) -> Run:
        """Write what a run folder derives from its log: the tables, the tier's tables and its claim."""
        run = Run.load(folder)
        tier = self.tiers.reader(run.plan.tier)
        for name, frame in {**run.summaries.csv_tables(tier.paired), **tier.tables(run)}.items():
            folder.write_csv(name, frame)
        claim = tier.claim(run)
        if claim is not None:
            folder.write_text(CLAIM_FILE, claim)
        return run

    def _carry_out(
        self, plan: Plan, trial_fn: TrialFunction, folder: RunFolder, placement: Placement | None
    ) -> Run:
        remaining = sum(1 for _ in pending(plan, folder))
        done = len(plan.schedule) - remaining
        console.print(f"run folder: {folder.path}  ({remaining} of {len(plan.schedule)} trials to run)")
        if placement is not None:
            console.print(f"CPU placement: {placement.describe()}")
        try:
            with (
                ScheduleProgress(plan, len(plan.schedule), done, self.options.quiet) as progress,
                _placed(plan, placement),
            ):
                run_schedule(
                    plan,
                    trial_fn,
                    folder,
                    progress.start,
                    progress.end,
                    deadline=self.deadline,
                    placement=placement,
                )
        except PlannedStop as stop:
            errors.print(
                f"bench: {stop}; continue with --resume {folder.path} (with --stop-after again to slice the rest)"
            )
            raise
        finally:
            record = folder.read_json(ENV) or {}
            record["gpus_end"] = env.gpu_snapshot()
            folder.write_json(ENV, record)
            run = self.finish(folder)
        tier = self.tiers.reader(plan.tier)
        if tier.paired:
            print_summary(run.plan, run.summaries)
        claim = tier.claim(run)
        if claim:
            shown, headline = claim.rstrip(), what_ran(run.plan)
            if tier.paired and headline and shown.startswith(headline):
                shown = shown[len(headline) :].lstrip("\n")  # the summary above opened with it already
            console.print(shown)
        if self.options.report:
            from harness.report import write_report

            console.print(f"report: {write_report([folder], self.tiers)}")
        return run


@contextmanager
def _placed(plan: Plan, placement: Placement | None) -> Iterator[None]:
    """Where the runner's own process runs for the schedule: apart from the workers it starts (worker tiers),
    or, for in-process tiers (whose trials run in this process), on the worker cores with their threads."""
    if placement is None:
        yield
    elif plan.in_process:
        previous = pin_parent(replace(placement, parent_cores=placement.worker_cores))
        threads = torch.get_num_threads()
        torch.set_num_threads(placement.torch_threads)
        try:
            yield
        finally:
            torch.set_num_threads(threads)
            unpin_parent(previous)
    else:
        with parent_pinned(placement):
            yield


@contextmanager
def _device_budget(plan: Plan) -> Iterator[None]:
    """Hold the plan's device-memory budget for an in-process run (workers apply their own)."""
    budget, device = plan.protocol.budget, plan.protocol.device
    if budget is None or not plan.in_process:
        yield
        return
    try:
        apply_budget(budget, device)
    except ValueError as exc:
        raise InputError(f"--budget: {exc}") from None
    try:
        yield
    finally:
        release_budget(device)
