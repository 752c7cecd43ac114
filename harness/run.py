"""One run, start to end: plan → run folder → schedule → log → summaries → console (→ report).

``start_run`` builds the trial function before anything touches the disk, so a plan that cannot run leaves
no half-written folder; ``resume_run`` reopens a folder and runs only the trials with no row yet.
"""

from __future__ import annotations

import datetime as _dt
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from harness import env
from harness.console import ScheduleProgress, console, print_summary
from harness.options import InputError
from harness.protocol import Plan, TrialFunction, load_factory, pending, run_schedule
from harness.tables import ENV, PLAN, RunFolder, Summaries, write_summaries
from harness.timing import apply_budget, release_budget

ReportWriter = Callable[[RunFolder], Path]


def new_run_folder(runs_root: str | Path, tier: str) -> RunFolder:
    """A fresh, uniquely named folder ``<root>/<tier>-<UTC time>-<random>``."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = Path(runs_root) / f"{tier}-{stamp}-{secrets.token_hex(2)}"
    path.mkdir(parents=True, exist_ok=False)
    return RunFolder(path)


def summarize(folder: RunFolder) -> tuple[Plan, Summaries]:
    """The plan and the summaries of a run folder, recomputed from its log (and written as CSV)."""
    plan = Plan.from_json(folder.read_json(PLAN))
    return plan, write_summaries(folder, plan.bar, plan.seed, plan.pairs, plan.control)


def start_run(
    plan: Plan,
    runs_root: str | Path,
    quiet: bool = False,
    trial_fn: TrialFunction | None = None,
    report: ReportWriter | None = None,
) -> RunFolder:
    """Start a new run of ``plan`` under ``runs_root`` and carry it to the end."""
    trial_fn = trial_fn or load_factory(plan)
    with _device_budget(plan):  # a budget the device refuses fails here, before any folder exists
        folder = new_run_folder(runs_root, plan.tier)
        folder.write_json(PLAN, plan.to_json())
        folder.write_json(ENV, env.collect(touch_device=plan.in_process))
        return _carry_out(plan, trial_fn, folder, quiet, report)


def resume_run(
    path: str | Path,
    quiet: bool = False,
    trial_fn: TrialFunction | None = None,
    report: ReportWriter | None = None,
) -> RunFolder:
    """Continue an interrupted run exactly where it stopped: the saved schedule, minus the finished trials."""
    folder = RunFolder.open(path)
    plan = Plan.from_json(folder.read_json(PLAN))
    trial_fn = trial_fn or load_factory(plan)
    record = folder.read_json(ENV) or {}
    record.setdefault("resumes", []).append(
        {
            "recorded": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "gpus": env.gpu_snapshot(),
        }
    )
    folder.write_json(ENV, record)
    with _device_budget(plan):
        return _carry_out(plan, trial_fn, folder, quiet, report)


@contextmanager
def _device_budget(plan: Plan) -> Iterator[None]:
    """Hold the plan's device-memory budget for an in-process run (workers apply their own)."""
    if plan.budget is None or not plan.in_process:
        yield
        return
    try:
        apply_budget(plan.budget, plan.device)
    except ValueError as exc:
        raise InputError(f"--budget: {exc}") from None
    try:
        yield
    finally:
        release_budget(plan.device)


def _carry_out(
    plan: Plan, trial_fn: TrialFunction, folder: RunFolder, quiet: bool, report: ReportWriter | None
) -> RunFolder:
    remaining = sum(1 for _ in pending(plan, folder))
    done = len(plan.schedule) - remaining
    if not quiet:
        console.print(f"run folder: {folder.path}  ({remaining} of {len(plan.schedule)} trials to run)")
    try:
        with ScheduleProgress(plan, len(plan.schedule), done, quiet) as progress:
            run_schedule(plan, trial_fn, folder, progress.start, progress.end)
    finally:
        record = folder.read_json(ENV) or {}
        record["gpus_end"] = env.gpu_snapshot()
        folder.write_json(ENV, record)
        plan, summaries = summarize(folder)
    print_summary(plan, summaries)
    if report is not None:
        path = report(folder)
        console.print(f"report: {path}")
    return folder
