"""Your own command as a tier (``bench command``): a fresh process per trial, the same protocol."""

from __future__ import annotations

from typing import TYPE_CHECKING

from experiments.command.plan import CommandSettings, make_plan, recorded_settings_problem
from experiments.command.trial import trial_function
from harness.tier import BaseTier, Caveat, Run

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

__all__ = ["TIER", "CommandSettings", "make_plan", "trial_function"]
