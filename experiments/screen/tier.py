"""The screen tier and its ``bench screen`` command."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from experiments import cpu_defaults
from experiments.arms import arms_resume_problem
from experiments.screen.plan import ScreenSettings, make_plan, recorded_settings_problem
from experiments.screen.ranks import trial_in_ranks
from experiments.screen.section import SUMMARY_CSV, report_section, summary_table
from experiments.screen.trial import trial_function
from harness.plan import Plan
from harness.tier import BaseTier, Caveat, CommandSpec, Run, Start


def _tables(run: Run) -> dict[str, Any]:
    return {SUMMARY_CSV: summary_table(run.plan, run.summaries)}


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
    section=report_section,
    caveats=(
        Caveat(
            "optimizer-only: not a training claim.",
            "`optimizer.step()` alone, on synthetic gradients; its share of a whole fit bounds any saving there.",
        ),
    ),
)

# Scale n at the default guard, a window of 2 steps (the GPU defaults: every scale and guard, 10 steps).
CPU_DEFAULTS = {"scales": "n", "guards": "256", "steps": 2, "warmup_steps": 1}


def _prepare(start: Start) -> Start:
    if start.resume is not None:
        return start
    settings = cpu_defaults.on_cpu(start.settings, CPU_DEFAULTS, start)
    return replace(start, settings=settings)


COMMAND = CommandSpec(
    "screen",
    "Optimizer-only crossover screen over YOLO26 scales and padding guards.",
    tiers=(TIER,),
    settings=ScreenSettings,
    prepare=_prepare,
)
