"""``bench command``: your own command timed per arm; a resume needs the command given again."""

from __future__ import annotations

import shlex
from dataclasses import replace

from experiments.command import TIER
from experiments.command.plan import CommandSettings
from harness.errors import InputError
from harness.tables import RunFolder
from harness.tier import CommandSpec, Start
from harness.validation import load_plan


def _prepare(start: Start) -> Start:
    """The command after -- as the settings' ``argv``; a resume runs only the run's own command (a folder is data)."""
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
            f"--resume {start.resume}: give the command again after -- ({shlex.join(recorded)}); "
            "a run folder is data, and nothing in it is run"
        )
    if start.argv != recorded:
        raise InputError(
            f"--resume {start.resume}: the command given ({shlex.join(start.argv)}) is not the run's "
            f"({shlex.join(recorded)})"
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
