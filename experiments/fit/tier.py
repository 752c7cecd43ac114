"""The fit tiers, ``pair`` and ``stages``, and their ``bench pair`` command."""

from __future__ import annotations

from dataclasses import replace

from experiments.arms import arms_resume_problem
from experiments.fit.plan import FitSettings, check_data_cache_used, make_plan, trial_seconds
from experiments.fit.recorded import recorded_row_problem, recorded_settings_problem
from experiments.fit.report import claim_bounds, claim_text, report_section, tables
from experiments.fit.trial import trial_function
from harness.console import console
from harness.plan import Plan
from harness.protocol_options import ProtocolOptions
from harness.tier import BaseTier, Caveat, CommandSpec, Start


def _make_plan(protocol: ProtocolOptions, settings: FitSettings, command: str = "") -> Plan:
    return make_plan(protocol, settings, command, announce=console.print)


_HOOKS = {  # the hooks both fit tiers share
    "make_plan": _make_plan,
    "trial_function": trial_function,
    "trial_seconds": trial_seconds,
    "settings_problem": recorded_settings_problem,
    "resume_problem": arms_resume_problem,
    "row_problem": recorded_row_problem,
    "tables": tables,
    "section": report_section,
    "claim": claim_text,
    "bounds": claim_bounds,
}
PAIR = BaseTier(
    "pair",
    **_HOOKS,
    caveats=(
        Caveat(
            "short fit: no accuracy claim.",
            "A short training run measures speed and memory; it is too short to say anything about final accuracy.",
        ),
    ),
)
STAGES = BaseTier(
    "stages",
    **_HOOKS,
    diagnostic=True,
    caveats=(
        Caveat(
            "diagnostic, not a claim: synchronized at every stage boundary inside the timed region.",
            "A stage-attribution run adds synchronizations inside each fit; its figures bound and explain a claim "
            "(stage shares, the ceiling), they are never one, so it carries no verdict.",
        ),
    ),
)


def _prepare(start: Start) -> Start:
    settings = start.settings
    if settings.data_cache is not None:
        check_data_cache_used(settings.workload, settings.data)
    settings = replace(settings, data_cache=settings.data_cache or str(start.out / "datasets"))
    return replace(start, tier="stages" if settings.stages else "pair", settings=settings)


COMMAND = CommandSpec(
    "pair",
    "Complete paired fits (the decisive tier): `bench pair --steps 384`.",
    tiers=(PAIR, STAGES),
    settings=FitSettings,
    prepare=_prepare,
)
