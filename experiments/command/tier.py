"""The command tier and its ``bench command`` command."""

from __future__ import annotations

import shlex
from dataclasses import replace

from experiments.command.plan import CommandSettings, make_plan, recorded_settings_problem
from experiments.command.trial import trial_function
from harness.codepaths import verdict_shown, what_ran
from harness.errors import InputError
from harness.formatting import format_interval, format_levels, method_label
from harness.present.model import Section, Table
from harness.present.run_view import claim_sentence, pairs_words, warmup_words
from harness.tier import BaseTier, Caveat, CommandSpec, Run, Start


def report_section(run: Run) -> Section:
    """The command as given, what each arm ran, and where the figure comes from."""
    plan = run.plan
    settings = CommandSettings.from_dict(plan.settings)
    rows = [[label, entry["runs"]] for label, entry in plan.arm_code.items()]
    figure = (
        f"The figure is the last number the command printed that `{settings.figure}` matched"
        f" ({plan.unit}); the wall time is kept as `command_seconds`."
        if settings.figure
        else "The figure is the command's wall time, from just before it starts to its exit."
    )
    timeout = f" A trial stops after {settings.timeout:g} s." if settings.timeout else ""
    return Section("Your command", depth=2).add(
        Table(["arm", "command line"], rows),
        figure + timeout + " Each trial's output is in `trials/<index>.log`.",
    )


def claim_text(run: Run) -> str:
    """The claim of a command run, as plain text."""
    plan, summaries = run.plan, run.summaries
    opening = what_ran(plan)
    lines = [opening] if opening else []
    if summaries.claims.empty:
        lines.append("No complete pair: no claim.")
    for _, claim in summaries.claims.iterrows():
        case, arm = str(claim["case"]), str(claim["arm"])
        lines.append(claim_sentence(plan, summaries, case, arm))
        verdict = verdict_shown(plan, arm, str(claim["verdict"]))
        lines.append(
            f"{100 * float(claim['ci_level']):.0f}% {method_label(claim)} interval "
            f"{format_interval(claim['ci_low'], claim['ci_high'])} ({format_levels(claim)}, "
            f"{int(claim['pairs'])} pairs): {verdict}."
        )
    lines.append(
        f"Protocol: {warmup_words(plan, summaries.trials)}, then {pairs_words(plan, summaries.trials)} "
        f"in {plan.protocol.order} order; {plan.metric}."
    )
    return "\n".join(lines) + "\n"


TIER = BaseTier(
    "command",
    make_plan=make_plan,
    trial_function=trial_function,
    settings_problem=recorded_settings_problem,
    section=report_section,
    claim=claim_text,
    caveats=(
        Caveat(
            "your command, timed whole: what it measures is yours to name.",
            "Timed from start to exit (or the figure it prints); the harness sees nothing inside it.",
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
    if start.plan.tier != "command":
        return start  # the launch refuses another tier's run
    recorded = tuple(start.plan.settings["argv"])
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
