"""The optimizer-only crossover screen (``bench screen``): ``optimizer.step()`` alone on the YOLO26 parameter
sets, each arm once per padding guard where it has one, with the step's CUDA-graph launch floor.

``plan`` (settings, cases), ``trial`` (one timed window and its floor), ``summary`` (the per scale × arm
table), ``section`` (the report's analysis), ``plots``.
"""

from __future__ import annotations

from experiments.screen.plan import ScreenSettings, make_plan
from experiments.screen.section import report_section
from experiments.screen.summary import SUMMARY_CSV, summary_table
from experiments.screen.trial import trial_function
from harness.tier import BaseTier, Caveat

TIER = BaseTier(
    "screen",
    make_plan=make_plan,
    trial_function=trial_function,
    tables=lambda run: {SUMMARY_CSV: summary_table(run.plan, run.summaries)},
    section=report_section,
    caveats=(
        Caveat(
            "optimizer-only: not a training claim.",
            "`optimizer.step()` alone, on synthetic gradients; a stage's share of a whole fit bounds what it can "
            "save there.",
        ),
    ),
)

__all__ = ["TIER", "ScreenSettings", "make_plan", "summary_table", "trial_function"]
