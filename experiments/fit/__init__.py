"""The complete-fit tiers: ``pair`` (whole short training runs, the arms alternating: the decisive claim) and
``stages`` (the same fits with synchronized stage marks: a diagnostic of where the time goes, never a claim).

``plan`` checks the options and builds the plan, and starts each trial in a fresh worker process
(``worker``) on the real Ultralytics trainer (``ultralytics_fit``) or the embedded workload (``embedded``);
``report`` gives the section, the tables and the claim.
"""

from __future__ import annotations

from functools import partial

from experiments.fit.plan import FitSettings, make_plan, trial_function
from experiments.fit.report import claim_text, report_section, tables
from harness.console import console
from harness.tier import BaseTier, Caveat

HOOKS = {
    "make_plan": partial(make_plan, announce=console.print),
    "trial_function": trial_function,
    "tables": tables,
    "section": report_section,
    "claim": claim_text,
}
PAIR = BaseTier(
    "pair",
    **HOOKS,
    caveats=(
        Caveat(
            "short fit: no accuracy claim.",
            "A short training run measures speed and memory; it is too short to say anything about final accuracy.",
        ),
    ),
)
STAGES = BaseTier(
    "stages",
    **HOOKS,
    diagnostic=True,
    caveats=(
        Caveat(
            "diagnostic, not a claim: synchronized at every stage boundary inside the timed region.",
            "A stage-attribution run adds synchronizations inside each fit; its figures bound and explain a claim "
            "(stage shares, the ceiling), they are never one, so it carries no verdict.",
        ),
    ),
)

__all__ = ["PAIR", "STAGES", "FitSettings", "make_plan", "trial_function"]
