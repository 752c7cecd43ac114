"""The probe tier and its ``bench probe`` command."""

from __future__ import annotations

from dataclasses import replace

from experiments import cpu_defaults
from experiments.arms import arms_resume_problem
from experiments.probe.plan import ProbeSettings, make_plan, recorded_settings_problem
from experiments.probe.section import report_section, tables
from experiments.probe.trial import trial_function
from harness.tier import BaseTier, Caveat, CommandSpec, Start

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
            "A head under a memory budget; the whole learner may behave differently, or not fit.",
        ),
    ),
)

# An lm head 256 times smaller, still 4 chunks (the GPU default's one trial took over 2 min on a CPU).
CPU_DEFAULTS = {"lm": {"tokens": 4096, "vocab": 2048, "chunk": 1024}, "detect": {"imgsz": 320, "batch": 2}}


def _prepare(start: Start) -> Start:
    defaults = CPU_DEFAULTS.get(start.settings.head)
    if start.resume is not None or defaults is None:
        return start
    return replace(start, settings=cpu_defaults.on_cpu(start.settings, defaults, start))


COMMAND = CommandSpec(
    "probe",
    "Head-memory probes under a device budget; out-of-memory is a recorded result.",
    tiers=(TIER,),
    settings=ProbeSettings,
    prepare=_prepare,
)
