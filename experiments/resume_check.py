"""What a resume checks of a plan's arms: the start's own check, and the code fingerprint it recorded."""

from __future__ import annotations

from typing import Any

from experiments.arms import checked_optimizer
from harness.codepaths import class_fingerprint
from harness.errors import InputError
from harness.plan import Plan


def plan_specs(plan: Plan) -> dict[str, str]:
    """Every arm spec a plan names, by the option that gives it (an arm label, or a parity setting)."""
    specs = {arm.label: arm.spec for arm in plan.protocol.arms}
    specs.update({arm.label: arm.spec for case in plan.cases for arm in case.arms})
    for option in ("baseline", "candidate"):
        if isinstance(plan.settings.get(option), str):
            specs[f"--{option}"] = plan.settings[option]
    return specs


def arms_resume_problem(plan: Plan) -> str | None:
    """Why a resume cannot run a plan's arms (None where it can)."""
    for label, spec in plan_specs(plan).items():
        try:
            found = checked_optimizer(spec, option="its arms", import_upstream=False)
        except InputError as exc:
            return str(exc)
        recorded = (plan.arm_code.get(label) or {}).get("code")
        now = class_fingerprint(found)
        if recorded is not None and recorded != now:
            return (
                f"arm '{label}' ({spec}): its code changed since the run started ({_difference(recorded, now)}); "
                "a resume runs the code its rows came from: start a new run"
            )
    return None


def _difference(recorded: Any, now: dict[str, Any] | None) -> str:
    if not isinstance(recorded, dict) or now is None:
        return "the plan's record is not a fingerprint"
    if recorded.get("class") != now["class"]:
        return f"the class was {recorded.get('class')}, now {now['class']}"
    return f"{now['class']}'s source file differs"
