"""The head-memory probe tier (``bench probe``): a head's time and memory together under a device budget."""

from __future__ import annotations

from experiments.probe.plan import ProbeSettings, make_plan, recorded_settings_problem
from experiments.probe.section import report_section, tables
from experiments.probe.trial import trial_function
from experiments.resume_check import arms_resume_problem
from harness.tier import BaseTier, Caveat

TIER = BaseTier(
    "probe",
    make_plan=make_plan,
    trial_function=trial_function,
    settings_problem=recorded_settings_problem,
    resume_problem=arms_resume_problem,
    tables=tables,
    section=report_section,
    caveats=(
        Caveat(
            "head-only: not a training claim.",
            "A head workload under a memory budget; the whole learner may behave differently (it may not even "
            "fit).",
        ),
    ),
)

__all__ = ["TIER", "ProbeSettings", "make_plan", "trial_function"]
