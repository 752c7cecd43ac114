"""The optimizer-only crossover screen (``bench screen``): ``optimizer.step()`` alone, with its launch floor."""

from __future__ import annotations

from typing import Any

from experiments.resume_check import arms_resume_problem
from experiments.screen.plan import ScreenSettings, make_plan, recorded_settings_problem
from experiments.screen.ranks import trial_in_ranks
from experiments.screen.trial import trial_function
from harness.plan import Plan
from harness.tier import BaseTier, Caveat, Run


# The report's parts load when a report asks for them: a rank of the distributed screen imports this package
# and needs neither the statistics nor the plots.
def _tables(run: Run) -> dict[str, Any]:
    from experiments.screen.summary import SUMMARY_CSV, summary_table

    return {SUMMARY_CSV: summary_table(run.plan, run.summaries)}


def _section(run: Run) -> str:
    from experiments.screen.section import report_section

    return report_section(run)


def _trial_function(plan: Plan) -> Any:
    """Each trial in ``--gpus N`` fresh ranks, or in this process on one device."""
    return trial_in_ranks(plan) if plan.protocol.gpus > 1 else trial_function(plan)


TIER = BaseTier(
    "screen",
    make_plan=make_plan,
    trial_function=_trial_function,
    settings_problem=recorded_settings_problem,
    resume_problem=arms_resume_problem,
    tables=_tables,
    section=_section,
    caveats=(
        Caveat(
            "optimizer-only: not a training claim.",
            "`optimizer.step()` alone, on synthetic gradients; a stage's share of a whole fit bounds what it can "
            "save there.",
        ),
    ),
)

__all__ = ["TIER", "ScreenSettings", "make_plan", "trial_function"]
