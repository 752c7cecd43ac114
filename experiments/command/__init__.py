"""Your own command as a tier (``bench command``): a fresh process per trial, the same protocol."""

from __future__ import annotations

import shlex
from dataclasses import replace
from typing import TYPE_CHECKING

from experiments.command.plan import CommandSettings, make_plan, recorded_settings_problem
from experiments.command.trial import trial_function
from harness.errors import InputError
from harness.tables import RunFolder
from harness.tier import BaseTier, Caveat, CommandSpec, Run, Start
from harness.validation import load_plan

if TYPE_CHECKING:  # the worker imports this package: the report's model loads with the report
    from harness.present.model import Section


def _section(run: Run) -> Section:
    from experiments.command.report import report_section

    return report_section(run)


def _claim(run: Run) -> str:
    from experiments.command.report import claim_text

    return claim_text(run)


TIER = BaseTier(
    "command",
    make_plan=make_plan,
    trial_function=trial_function,
    settings_problem=recorded_settings_problem,
    section=_section,
    claim=_claim,
    caveats=(
        Caveat(
            "your command, timed whole: what it measures is yours to name.",
            "The harness times the command from its start to its exit (or reads the figure it prints); "
            "what the command does in that time is not seen by the harness.",
        ),
    ),
)


def _prepare(start: Start) -> Start:
    """The command after -- as the settings' ``argv``; a resume runs only the run's own command."""
    start = replace(start, settings=replace(start.settings, argv=start.argv))
    if start.resume is None:
        if start.protocol["arms"] is None:
            raise InputError("bench command needs --arms, e.g. --arms slow,fast (each label fills {arm})")
        return start
    plan = load_plan(RunFolder.open(start.resume))
    if plan.tier != "command":
        return start  # the launch refuses another tier's run
    recorded = tuple(plan.settings.get("argv") or ())
    if not start.argv:
        raise InputError(
            f"--resume: give the command again after --: {shlex.join(recorded)}",
            hint="a run folder is data, and nothing in it is run",
        )
    if start.argv != recorded:
        raise InputError(
            "--resume: the command given is not the run's",
            hint=f"the run's: {shlex.join(recorded)}; given: {shlex.join(start.argv)}",
        )
    return start


COMMAND = CommandSpec(
    "command",
    "Your own command, timed per arm: bench command --arms a,b -- python train.py --opt {arm}.",
    tiers=(TIER,),
    settings=CommandSettings,
    argv="The command, after --; {arm} and {spec} become each arm's label and spec.",
    prepare=_prepare,
)
