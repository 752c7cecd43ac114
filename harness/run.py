"""The runner: plan → run folder → schedule → log → tables → console (→ report), for any registered tier.

``Runner.start`` builds the trial function before anything touches the disk, so a plan that cannot run leaves
no half-written folder; ``Runner.resume`` reopens a folder and runs only the trials with no row yet. A run holds
its folder's lock from start to end, so a second run of the same folder is refused. The runner is the only
writer of a run folder: the log as each trial ends, then the tables (the harness's and the tier's) and the
tier's claim; the report only reads.
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

import pandas as pd
import torch

from harness import env
from harness.codepaths import arm_files, what_ran
from harness.console import ScheduleProgress, console, errors, print_flags, print_summary
from harness.delay_check import ROLE as CALIBRATION_ROLE
from harness.errors import InputError
from harness.estimate import OverBudget, probe_first, refuse_by_estimate
from harness.inference import CONFIDENCE
from harness.options import check_devices_here, resolve_placement
from harness.placement import Placement, parent_pinned, pin_parent, unpin_parent
from harness.plan import Plan, drop_rounds, estimated_seconds, grow_schedule, pending, scheduled_done
from harness.protocol import PlannedStop, concurrent_problem, run_schedule
from harness.schedule import ScheduledTrial
from harness.sentence import answers
from harness.sequential import looks, should_stop
from harness.stats import ClaimSettings, pair_table
from harness.tables import ENV, PLAN, RunFolder, RunFolderWriteError, check_can_write
from harness.tier import Run, TierRegistry, check_run_log, load_checked_plan
from harness.timing import apply_budget, release_budget
from harness.trial import TrialContext, TrialFunction
from harness.validation import load_env

CLAIM_FILE = "claim.txt"
# Tables are rewritten before a schedule unit once the log grew and this long passed since the last write: a run
# killed outright keeps every round up to that write. Quick trials rewrite at most this often (a write: ~0.2 s).
TABLES_REFRESH_SECONDS = 30.0


def machine_load() -> dict[str, float | int | None]:
    """The 1-minute load average and the logical cores now (null where the platform has no load average)."""
    try:
        load: float | None = round(float(os.getloadavg()[0]), 3)
    except (AttributeError, OSError):
        load = None
    return {"load1_start": load, "cpu_logical": os.cpu_count()}


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a run: the log keeps every finished trial; ``folder`` is where to resume."""

    def __init__(self, folder: Path) -> None:
        super().__init__(f"interrupted; the finished trials are in {folder}: continue with --resume {folder}")
        self.folder = folder


def _nothing_left(plan: Plan, folder: RunFolder) -> bool:
    """Whether a resume has no trial to run: every scheduled trial is logged and, with ``--pairs auto``, the
    stopping rule has decided to stop every case at its last scheduled round (so it grows nothing)."""
    if next(pending(plan, folder), None) is not None:
        return False
    return not plan.protocol.auto or StoppingRule(plan, folder).finished()


def _no_trial_left(ctx: TrialContext) -> dict[str, Any]:
    raise RuntimeError(f"trial {ctx.trial.index} ran in a run that had nothing left to run")


def _recorded_placement(cpus: str) -> Placement | None:
    """The placement a plan's ``--cpus`` asks for on the machine resuming it (another, perhaps): ``InputError``
    naming the recorded value where this machine lacks its cores."""
    try:
        return resolve_placement(cpus)
    except ValueError as exc:
        reason = str(exc).split(": ", 1)[-1]
        raise InputError(
            f"--cpus {cpus} recorded in the plan: {reason}; resume it on a machine that has them"
        ) from None


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
        problem = concurrent_problem(plan, placement)
        if problem:
            raise InputError(problem)
        with _device_budget(plan):  # a budget the device refuses fails here, before any folder exists
            folder = new_run_folder(self.options.out, plan.tier)
            try:
                with folder.lock(), _interrupts_name(folder):
                    folder.name_holder()
                    try:
                        folder.write_json(PLAN, plan.to_json())
                        files = arm_files(plan)
                        record = {**env.collect(plan.in_process, files), **machine_load()}
                        record["placement"] = None if placement is None else placement.to_dict()
                        folder.write_json(ENV, record)
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
            check_run_log(plan, folder, self.tiers)
            record = load_env(folder)
            left = not _nothing_left(plan, folder)
            if left:  # trials to run need the plan's devices here (else each would fail, one by one)
                check_devices_here(plan.protocol.device, plan.protocol.gpus)
                problem = self.tiers.reader(plan.tier).resume_problem(plan)  # the start's checks of its code
                if problem:
                    raise InputError(f"{folder.file(PLAN)}: {problem}")
            if trial_fn is None:  # a finished run only rewrites its tables: no tier set-up (a fit's data set)
                trial_fn = self.tiers.get(plan.tier).trial_function(plan) if left else _no_trial_left
            placement = _recorded_placement(plan.protocol.cpus)  # this machine's, for the plan's --cpus
            problem = concurrent_problem(plan, placement) if left else None
            if problem:
                raise InputError(problem)
            record.setdefault("resumes", []).append(
                {
                    "recorded": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    "boot_id": env.boot_id(),
                    "gpus": env.gpu_snapshot(),
                    **env.code_revision(arm_files(plan)),
                    "placement": None if placement is None else placement.to_dict(),
                    **machine_load(),
                }
            )
            with _device_budget(plan):  # a budget this device refuses: nothing recorded
                folder.name_holder()
                try:
                    folder.write_json(ENV, record)
                except RunFolderWriteError as failure:
                    raise RunFolderWriteError(f"{failure}; nothing was run") from None
                return self._carry_out(plan, trial_fn, folder, placement, resumed=True)

    def finish(self, folder: RunFolder, run: Run | None = None) -> Run:
        """Write what a run folder derives from its log: the tables, the tier's tables and its claim
        (``run``: the folder already read, where the caller has it)."""
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
        remaining = sum(1 for _ in pending(plan, folder))
        logged = folder.rows()
        done = scheduled_done(plan, logged)
        console.print(  # never wrapped: the path is copied from here
            f"run folder: {folder.path}  ({remaining} of {len(plan.schedule)} trials to run)", soft_wrap=True
        )
        if placement is not None:
            console.print(f"CPU placement: {placement.describe()}")
        try:
            with (
                ScheduleProgress(plan, len(plan.schedule), done, self.options.quiet, logged) as progress,
                _placed(plan, placement),
            ):
                rule = StoppingRule(plan, folder, progress) if plan.protocol.auto else None
                refresh = TableRefresh(self, folder)
                fresh = not logged and plan.schedule
                args = (plan, trial_fn, folder, placement, self.deadline, console.print, progress.start)
                held = [probe_first(*args, resumed=resumed)] if fresh else []

                def before_unit(unit: list[ScheduledTrial]) -> bool:
                    row = held.pop() if held else None
                    if row is not None:  # the probe was the scheduled warm-up: logged, found next unit
                        folder.append_row(row)
                        progress.end(row)
                        return True
                    refresh()
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
                    warm_after_gaps=self.tiers.reader(plan.tier).paired,
                )
        except RunFolderWriteError as failure:  # more writes would fail too: the resume writes the tables
            raise RunFolderWriteError(
                f"{failure}; the run stopped with every finished trial in the log: make room, then continue "
                f"with --resume {folder.path} (the trial that could not be recorded runs again)"
            ) from None
        except OverBudget:
            raise
        except PlannedStop as stop:
            errors.print(
                f"bench: {stop}; continue with --resume {folder.path} (with --stop-after again to slice the rest)"
            )
            self._wrap_up(folder, quietly=True)
            raise
        except BaseException:
            self._wrap_up(folder, quietly=True)
            raise
        try:
            run = self._wrap_up(folder)
        except RunFolderWriteError as failure:
            raise RunFolderWriteError(
                f"{failure}; every trial is in the log: make room, then --resume {folder.path} writes the tables"
            ) from None
        tier = self.tiers.reader(plan.tier)
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
            from harness.report import write_report

            try:
                console.print(f"report: {write_report([folder], self.tiers)}", soft_wrap=True)
            except (RunFolderWriteError, OSError) as failure:
                raise RunFolderWriteError(
                    f"could not write the report: {failure}; the run is complete: bench report {folder.path} "
                    "writes it"
                ) from None
        return run

    def _wrap_up(self, folder: RunFolder, quietly: bool = False) -> Run | None:
        """Record the GPUs at the end and write the tables. ``quietly`` (a run already stopping for another
        reason): a failure to write is dropped, since a resume writes them again, and the first reason stands."""
        try:
            record = folder.read_json(ENV) or {}
            record["gpus_end"] = env.gpu_snapshot()
            folder.write_json(ENV, record)
            return self.finish(folder)
        except (RunFolderWriteError, KeyboardInterrupt):
            if not quietly:
                raise
            return None


class TableRefresh:
    """Rewrites a live run's tables (``Runner.finish``) when its log has grown and ``TABLES_REFRESH_SECONDS``
    have passed since the last write: called before each unit, so the tables never hold half a round."""

    def __init__(self, runner: Runner, folder: RunFolder) -> None:
        self.runner, self.folder = runner, folder
        self.rows = len(folder.rows())
        self.written = time.monotonic()

    def __call__(self) -> None:
        rows = len(self.folder.rows())
        if rows == self.rows or time.monotonic() - self.written < TABLES_REFRESH_SECONDS:
            return
        self.runner.finish(self.folder)
        self.rows, self.written = rows, time.monotonic()


class StoppingRule:
    """``--pairs auto``: before each unit of the schedule, for every case whose scheduled rounds have all run,
    ask ``sequential.should_stop`` of each claim's log ratios; unless every claim stops, grow the case's
    schedule to the next look. Before a round that would take the log past ``--time-budget`` seconds of
    trials, end that case there (budget spent). Each decision is recorded in ``plan.looks`` and the plan
    saved, so a resume continues the same sequence."""

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

    def _decide(self, case: str, rows: list[dict], rounds: int, budget_spent: bool) -> dict:
        p = self.plan.protocol
        trials = pd.DataFrame(rows)
        pairs = pair_table(trials[trials["case"] == case]) if not trials.empty else pd.DataFrame()
        decisions = {}
        for arm, group in pairs.groupby("arm", sort=False) if not pairs.empty else ():
            x = group.loc[~group["both_failed"].astype(bool), "log_ratio"].to_numpy(dtype=float)
            if x.size == 0:
                decisions[str(arm)] = (False, "no usable pair yet", None)
                continue
            last = budget_spent or rounds >= p.max_pairs
            decision = should_stop(x, p.precision, CONFIDENCE, p.first_look, p.max_pairs, budget_spent=last)
            half = (
                decision.interval.half_width if decision.interval and decision.interval.computable else None
            )
            decisions[str(arm)] = (decision.stop, decision.reason, half)
        settings = ClaimSettings.from_protocol(p)
        baseline = str(pairs["baseline_arm"].iloc[0]) if not pairs.empty else ""
        calibration = (
            set(trials.loc[trials["role"] == CALIBRATION_ROLE, "arm"]) if "role" in trials else set()
        )
        mine = {a: d for a, d in decisions.items() if a not in calibration}  # recovered/known, no claim
        claims = {a: d for a, d in mine.items() if not settings.is_control(a, baseline)} or mine
        stop = (  # an A/A control's or a calibration arm's target does not hold a claim's stop
            budget_spent or rounds >= p.max_pairs or (bool(claims) and all(d[0] for d in claims.values()))
        )
        reason = (
            "time budget spent"
            if budget_spent
            else "last look (max pairs)"
            if rounds >= p.max_pairs
            else "every claim's precision reached"
            if stop
            else "precision not reached by every claim"
        )
        reach = [f"{a}:{d[1].split(';', 1)[1]}" for a, d in claims.items() if "pairs reach about" in d[1]]
        reason += "".join(f"; {text}" for text in reach)  # a target out of reach, said at the first look
        return {
            "case": case,
            "rounds": rounds,
            "stop": stop,
            "reason": reason,
            "claims": {
                arm: {"stop": d[0], "reason": d[1], "half_width": d[2]} for arm, d in decisions.items()
            },
        }

    def __call__(self, unit: list[ScheduledTrial]) -> bool:
        plan = self.plan
        protocol = plan.protocol
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
        if (
            not changed
            and budget is not None
            and unit
            and unit[0].phase == "measured"
            and not any(r.get("case") == unit[0].case and r.get("round") == unit[0].round for r in rows)
        ):
            spent = sum(float(r.get("trial_seconds") or 0.0) for r in rows)
            needed = sum(protocol.cooldown + estimated_seconds(t, rows) for t in unit)
            if spent + needed > budget:
                rounds = unit[0].round
                decision = self._decide(unit[0].case, rows, rounds, budget_spent=True)
                decision["reason"] = (
                    f"time budget spent: {spent:.0f} s of trials logged, the next round needs about "
                    f"{needed:.0f} s more than the {budget:g} s allowed"
                )
                plan.looks.append(decision)
                drop_rounds(plan, unit[0].case, done)
                changed = True
        if changed:
            self.folder.write_json(PLAN, plan.to_json())
            if self.progress is not None:
                self.progress.retotal(len(plan.schedule))
        return changed


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
