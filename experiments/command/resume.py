"""A command run resumes only with its command given again: a run folder is data, and nothing in it is run."""

from __future__ import annotations

import shlex
from pathlib import Path

from harness.errors import InputError
from harness.tables import RunFolder
from harness.validation import load_plan


def check_resumed_command(folder: Path, argv: tuple[str, ...]) -> None:
    """``InputError`` unless ``argv`` is the command the run at ``folder`` started with."""
    plan = load_plan(RunFolder.open(folder))
    if plan.tier != "command":
        return
    recorded = tuple(plan.settings.get("argv") or ())
    if not argv:
        raise InputError(
            f"--resume: give the command again after --: {shlex.join(recorded)}",
            hint="a run folder is data, and nothing in it is run",
        )
    if argv != recorded:
        raise InputError(
            "--resume: the command given is not the run's",
            hint=f"the run's: {shlex.join(recorded)}; given: {shlex.join(argv)}",
        )
