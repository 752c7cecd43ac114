"""The command tier's settings and plan: the command template, an optional figure regex, a timeout."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from harness.options import InputError
from harness.protocol import Case, Plan, ProtocolOptions

PLACEHOLDERS = ("{arm}", "{label}")


@dataclass
class CommandSettings:
    """The command as a list of words (``{arm}``: the arm's spec, ``{label}``: its label), the figure's regex."""

    argv: list[str] = field(default_factory=list)
    figure: str | None = None  # a regex whose first group is the trial's figure; None: the wall time
    unit: str = "s"
    timeout: float | None = None  # seconds a trial may take; past it the trial is an error row


def check_settings(s: CommandSettings) -> str | None:
    """What is wrong with the settings (one sentence), or None."""
    if not s.argv or not all(isinstance(word, str) and word for word in s.argv):
        return "give the command after --, e.g. bench command --arms a,b -- python train.py --opt {arm}"
    if not any(p in word for word in s.argv for p in PLACEHOLDERS):
        return f"the command names no arm: put {{arm}} or {{label}} in it (got {' '.join(s.argv)!r})"
    if s.figure is not None:
        try:
            pattern = re.compile(s.figure)
        except re.error as exc:
            return f"--figure {s.figure!r} is not a regular expression ({exc})"
        if pattern.groups < 1:
            return f"--figure {s.figure!r} has no group: put the number in parentheses, e.g. 'took ([0-9.]+)'"
    if s.timeout is not None and not s.timeout > 0:
        return f"--timeout must be a positive number of seconds (got {s.timeout})"
    return None


def make_plan(protocol: ProtocolOptions, settings: CommandSettings, command: str = "") -> Plan:
    """One case, every arm; nothing is written."""
    problem = check_settings(settings)
    if problem:
        raise InputError(problem)
    if protocol.gpus > 1:
        raise InputError(f"--gpus {protocol.gpus}: the command launches its own ranks; use --gpus 1")
    figure = f"the figure matched by {settings.figure!r}" if settings.figure else "the command's wall time"
    return Plan(
        tier="command",
        protocol=protocol,
        cases=[Case("command", {}, protocol.arms)],
        unit=settings.unit if settings.figure else "s",
        metric=figure,
        isolation="a fresh process per trial (your command)",
        timed_region="the command's process from its start to its exit"
        if not settings.figure
        else "what the command measured and printed",
        settings=asdict(settings),
        command=command,
        in_process=False,
    )


def recorded_settings_problem(plan: Plan) -> str | None:
    """What is wrong with a command plan's recorded settings (an edited plan.json), or None."""
    try:
        settings = CommandSettings(**plan.settings)
    except TypeError as exc:
        return f"settings: {exc}"
    return check_settings(settings)
