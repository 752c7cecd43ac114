"""The runner: plan → run folder → schedule → log → tables → console (→ report), for any registered tier.

``Runner.start`` builds the trial function before touching the disk: a plan that cannot run leaves no folder.
``Runner.resume`` reopens a folder and runs only the trials with no row yet.
A run holds its folder's lock from start to end, so a second run of the same folder is refused.
The runner is the only writer of a run folder; the report only reads it.
"""

from __future__ import annotations

import datetime as _dt
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from harness import env
from harness.codepaths import arm_files, what_ran
from harness.console import ScheduleProgress, console, errors, print_flags, print_summary, shown_path
from harness.errors import InputError
from harness.estimate import OverBudget, StoppingRule, probe_first, refuse_by_estimate
from harness.folder_format import ENV, PLAN
from harness.options import check_devices_here, resolve_placement
from harness.placement import Placement, parent_pinned
from harness.plan import Plan, pending, scheduled_done
from harness.protocol import PlannedStop, concurrent_problem, run_schedule
from harness.schedule import ScheduledTrial
from harness.sentence import answers
from harness.tables import RunFolder, RunFolderWriteError, check_can_write
from harness.tier import Run, TierRegistry, load_checked_plan
from harness.timing import apply_budget, release_budget
from harness.trial import TrialContext, TrialFunction
from harness.validation import load_env

CLAIM_FILE = "claim.txt"
# Tables are rewritten before a schedule unit once the log grew and this long passed since the last write: a run
# killed outright keeps every round up to that write. Quick trials rewrite at most this often (a write: ~0.2 s).
TABLES_REFRESH_SECONDS = 30.0


def _machine_record(placement: Placement | None) -> dict[str, Any]:
    """The placement, the 1-minute load average (null where the platform has none) and the logical cores."""
    try:
        load: float | None = round(float(os.getloadavg()[0]), 3)
    except (AttributeError, OSError):
        load = None
    where = None if placement is None else placement.to_dict()
    return {"placement": where, "load1_start": load, "cpu_logical": os.cpu_count()}


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a run: the log keeps every finished trial; ``folder`` is where to resume."""

    def __init__(self, folder: Path) -> None:
        super().__init__(f"interrupted; the finished trials are in {folder}: continue with --resume {folder}")
        self.folder = folder


def _no_trial_left(ctx: TrialContext) -> dict[str, Any]:
    raise RuntimeError(f"trial {ctx.trial.index} ran in a run that had nothing left to run")


@contextmanager
def _interrupts_name(folder: RunFolder) -> Iterator[None]:
    """An interrupt inside the block leaves as ``RunInterrupted`` naming the folder (a planned stop as itself)."""
    try:
        yield
    except (PlannedStop, RunInterrupted):
        raise
    except KeyboardInterrupt as interrupt:
        raise RunInterrupted(folder.path) from interrupt


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
    try:
        path.mkdir(parents=True, exist_ok=False)
    except OSError as exc:
        raise RunFolderWriteError(
            f"could not create a run folder under {runs_root}: {exc.strerror or exc}"
        ) from None
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
        check_can_write(self.options.out, "--out")  # before the trials are set up (some write under it)
        refuse_by_estimate(plan, self.tiers.reader(plan.tier).trial_seconds(plan))
        trial_fn = trial_fn or self.tiers.get(plan.tier).trial_function(plan)
        placement = resolve_placement(plan.protocol.cpus)
        if problem := concurrent_problem(plan, placement):
            raise InputError(problem)
        with _device_budget(plan):  # a budget the device refuses fails here, before any folder exists
            folder = new_run_folder(self.options.out, plan.tier)
            try:
                with folder.lock(), _interrupts_name(folder):
                    folder.name_holder()
                    try:
                        folder.write_json(PLAN, plan.to_json())
                        record = env.collect(plan.in_process, arm_files(plan))
                        folder.write_json(ENV, {**record, **_machine_record(placement)})
                    except RunFolderWriteError as failure:
                        shutil.rmtree(folder.path, ignore_errors=True)
                        raise RunFolderWriteError(
                            f"{failure}; nothing was run and the new folder was removed"
                        ) from None
                    return self._carry_out(plan, trial_fn, folder, placement)
            except OverBudget:  # refused before any trial was logged: nothing stays
                shutil.rmtree(folder.path, ignore_errors=True)
                raise

    def resume(self, path: str | Path, trial_fn: TrialFunction | None = None) -> Run:
        """Continue an interrupted run exactly where it stopped: the saved schedule, minus the finished trials."""
        folder = RunFolder.open(path)
        # The lock is held until the run ends: a second run of this folder is refused at once.
        with folder.lock(), _interrupts_name(folder):
            # Every file validated before anything is written or run.
            plan = load_checked_plan(folder, self.tiers)
            record = load_env(folder)
            left = next(pending(plan, folder), None) is not None or (
                plan.protocol.auto and not StoppingRule(plan, folder).finished()
            )
            if left:  # trials to run need the plan's devices here (else each would fail, one by one)
                check_devices_here(plan.protocol.device, plan.protocol.gpus)
                problem = self.tiers.reader(plan.tier).resume_problem(plan)  # the start's checks of its code
                if problem:
                    raise InputError(f"{folder.file(PLAN)}: {problem}")
            if trial_fn is None:  # a finished run only rewrites its tables: no tier set-up (a fit's data set)
                trial_fn = self.tiers.get(plan.tier).trial_function(plan) if left else _no_trial_left
            try:  # the placement the plan's --cpus asks for on this machine (another, perhaps)
                placement = resolve_placement(plan.protocol.cpus)
            except ValueError as exc:
                raise InputError(
                    f"--cpus {plan.protocol.cpus} recorded in the plan: {str(exc).split(': ', 1)[-1]}; "
                    "resume it on a machine that has them"
                ) from None
            if left and (problem := concurrent_problem(plan, placement)):
                raise InputError(problem)
            resumed = {
                "recorded": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "boot_id": env.boot_id(),
                "gpus": env.gpu_snapshot(),
                **env.code_revision(arm_files(plan)),
            }
            record.setdefault("resumes", []).append({**resumed, **_machine_record(placement)})
            with _device_budget(plan):  # a budget this device refuses: nothing recorded
                folder.name_holder()
                try:
                    folder.write_json(ENV, record)
                except RunFolderWriteError as failure:
                    raise RunFolderWriteError(f"{failure}; nothing was run") from None
                return self._carry_out(plan, trial_fn, folder, placement, resumed=True)

    def finish(self, folder: RunFolder, run: Run | None = None) -> Run:
        """Write the tables, the tier's tables and its claim from the log (``run``: the folder, where already read)."""
        run = run or Run.load(folder, tiers=self.tiers)
        tier = self.tiers.reader(run.plan.tier)
        for name, frame in {**run.summaries.csv_tables(tier.paired), **tier.tables(run)}.items():
            folder.write_csv(name, frame)
        claim = tier.claim(run)
        said = answers(run.plan, run.summaries.claims) if tier.paired and not tier.diagnostic else []
        if claim is not None or said:
            folder.write_text(CLAIM_FILE, "".join(f"{line}\n" for line in said) + (claim or ""))
        return run

    def _carry_out(
        self,
        plan: Plan,
        trial_fn: TrialFunction,
        folder: RunFolder,
        placement: Placement | None,
        resumed: bool = False,
    ) -> Run:
        logged = folder.rows()
        remaining = sum(1 for _ in pending(plan, folder))
        console.print(  # never wrapped: the path is copied from here
            f"run folder: {shown_path(folder.path)}  ({remaining} of {len(plan.schedule)} trials to run)",
            soft_wrap=True,
        )
        if placement is not None:
            console.print(f"CPU placement: {placement.brief()}")
        tier = self.tiers.reader(plan.tier)
        try:
            done = scheduled_done(plan, logged)
            with (
                ScheduleProgress(plan, len(plan.schedule), done, self.options.quiet, logged) as progress,
                _placed(plan, placement),
            ):
                rule = StoppingRule(plan, folder, progress) if plan.protocol.auto else None
                written = [
                    len(logged),
                    time.monotonic(),
                ]  # the log's rows at the tables' last write, and when
                args = (plan, trial_fn, folder, placement, self.deadline, console.print, progress.start)
                held = [probe_first(*args, resumed=resumed)] if not logged and plan.schedule else []

                def before_unit(unit: list[ScheduledTrial]) -> bool:
                    row = held.pop() if held else None
                    if row is not None:  # the probe was the scheduled warm-up: logged, found next unit
                        folder.append_row(row)
                        progress.end(row)
                        return True
                    # The tables are rewritten between units, so they never hold half a round.
                    rows = len(folder.rows())
                    if rows != written[0] and time.monotonic() - written[1] >= TABLES_REFRESH_SECONDS:
                        self.finish(folder)
                        written[:] = [rows, time.monotonic()]
                    return rule(unit) if rule is not None else False

                run_schedule(
                    plan,
                    trial_fn,
                    folder,
                    progress.start,
                    progress.end,
                    deadline=self.deadline,
                    placement=placement,
                    before_unit=before_unit,
                    warm_after_gaps=tier.paired,
                )
        except RunFolderWriteError as failure:  # more writes would fail too: the resume writes the tables
            raise RunFolderWriteError(
                f"{failure}; the run stopped with every finished trial in the log: make room, then continue "
                f"with --resume {folder.path} (the trial that could not be recorded runs again)"
            ) from None
        except OverBudget:
            raise
        except BaseException as stop:
            if isinstance(stop, PlannedStop):
                errors.print(
                    f"bench: {stop}; continue with --resume {folder.path} "
                    "(with --stop-after again to slice the rest)"
                )
            self._wrap_up(folder, quietly=True)
            raise
        try:
            run = self._wrap_up(folder)
        except RunFolderWriteError as failure:
            raise RunFolderWriteError(
                f"{failure}; every trial is in the log: make room, then --resume {folder.path} writes the tables"
            ) from None
        if tier.paired:
            print_summary(run.plan, run.summaries)
            print_flags(run.summaries, run.env)
        claim = tier.claim(run) if not tier.paired or tier.diagnostic else None  # else: claim.txt, the report
        if claim:
            shown, headline = claim.rstrip(), what_ran(run.plan)
            if tier.paired and headline and shown.startswith(headline):
                shown = shown[len(headline) :].lstrip("\n")  # the summary above opened with it already
            console.print(shown)
        if self.options.report:
            from harness.report import write_report  # matplotlib: loaded by a run that writes a report only

            try:
                console.print(f"report: {shown_path(write_report([folder], self.tiers))}", soft_wrap=True)
            except (RunFolderWriteError, OSError) as failure:
                raise RunFolderWriteError(
                    f"could not write the report: {failure}; the run is complete: bench report {folder.path} "
                    "writes it"
                ) from None
        return run

    def _wrap_up(self, folder: RunFolder, quietly: bool = False) -> Run | None:
        """Record the GPUs at the end and write the tables.

        ``quietly``: the run is already stopping, so a failed write is dropped (a resume writes it again).
        """
        try:
            record = folder.read_json(ENV) or {}
            record["gpus_end"] = env.gpu_snapshot()
            folder.write_json(ENV, record)
            return self.finish(folder)
        except (RunFolderWriteError, KeyboardInterrupt):
            if not quietly:
                raise
            return None


@contextmanager
def _placed(plan: Plan, placement: Placement | None) -> Iterator[None]:
    """Pins the runner for the schedule: apart from its workers, or on their cores for in-process trials."""
    if placement is None:
        yield
        return
    threads = torch.get_num_threads()
    if plan.in_process:  # the trials run in this process: the workers' cores and threads
        placement = replace(placement, parent_cores=placement.worker_cores)
        torch.set_num_threads(placement.torch_threads)
    try:
        with parent_pinned(placement):
            yield
    finally:
        torch.set_num_threads(threads)


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


# An arm whose every measured trial failed: a run with nothing to compare must not look like a success.
EVERY_TRIAL_FAILED = 3  # bench's exit status when an arm has no ok measured trial (0 ok, 1 gate, 2 input)
SHOWN = 5  # distinct errors named per arm; the report lists every trial's


def failed_arms(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Arm label → its distinct error messages (first seen first), for arms whose every measured trial failed."""
    measured: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("phase") == "measured":
            measured.setdefault(str(row.get("arm")), []).append(row)
    out = {}
    for arm, ours in measured.items():
        if ours and all(row.get("status") != "ok" for row in ours):
            messages = [" ".join(str(row.get("message") or row.get("status")).split()) for row in ours]
            out[arm] = list(dict.fromkeys(messages))
    return out


def failure_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per arm whose every trial failed, then one per distinct error (at most ``SHOWN`` each)."""
    lines = []
    for arm, messages in failed_arms(rows).items():
        lines.append(f"every trial of arm '{arm}' failed ({len(messages)} distinct error(s)):")
        lines += [f"  {message[:300]}" for message in messages[:SHOWN]]
        if len(messages) > SHOWN:
            lines.append(f"  and {len(messages) - SHOWN} more: see the report")
    return lines
