"""The complete-fit tier's claim as plain text: what ``bench pair`` prints when it ends (``claim.txt``)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from experiments.fit.plan import FitSettings
from experiments.fit.report import stage_findings, stage_table, steady_claims
from harness.codepaths import same_code_arms, verdict_shown, what_ran
from harness.formatting import (
    format_interval,
    format_levels,
    format_limit,
    format_percent,
    is_missing,
    method_label,
)
from harness.plan import Plan
from harness.present.run_view import claim_sentence, pairs_words, warmup_words
from harness.tier import Run


def _verdict_words(claim: pd.Series, same: set[str]) -> str:
    """A claim row's verdict as the claim text states it (withheld for an arm that ran the baseline's code)."""
    control = claim["kind"] == "control"
    if str(claim["arm"]) in same:
        return f"verdict withheld: {claim['arm']} ran the baseline's code"
    if is_missing(claim["bar"]):
        return f"no {'tolerance (--tolerance)' if control else 'bar (--bar)'} set: {claim['verdict']}"
    limit = format_limit(100 * float(claim["bar"]), control)
    return f"{'A/A ' if control else ''}verdict against {limit}: {claim['verdict']}"


def _environment_line(env: dict[str, Any]) -> str:
    gpus = env.get("gpu_names") or []
    device = ", ".join(gpus) if gpus else f"CPU {env.get('cpu_model') or 'unknown'}"
    parts = [device]
    if env.get("driver_version"):
        parts.append(f"driver {env['driver_version']}")
    parts.append(
        f"torch {env.get('torch')}" + (f" (CUDA {env['cuda_runtime']})" if env.get("cuda_runtime") else "")
    )
    parts.append(f"Python {env.get('python')}")
    if env.get("ultralytics"):
        parts.append(f"ultralytics {env['ultralytics']}")
    if env.get("git_revision"):
        parts.append(
            f"revision {str(env['git_revision'])[:10]}" + (" (dirty)" if env.get("git_dirty") else "")
        )
    return "Environment: " + ", ".join(parts) + "."


def claim_text(run: Run) -> str:
    """The claim of a paired run (or the stage shares of a stages run), as plain text (``claim.txt``)."""
    plan, summaries, env = run.plan, run.summaries, run.env
    settings = FitSettings.from_dict(plan.settings)
    opening = what_ran(plan)
    lines: list[str] = [opening] if opening else []
    same = same_code_arms(plan)
    if settings.stages:
        table = stage_table(plan, summaries.trials)
        lines += ["Stages diagnostic (not a claim):"] + stage_findings(plan, table)
    elif summaries.claims.empty:
        lines.append("No complete pair: no claim.")
    for _, claim in summaries.claims.iterrows():
        case, arm = str(claim["case"]), str(claim["arm"])
        if settings.stages:
            continue
        control = claim["kind"] == "control"
        kind = (
            "A/A control (noise floor): "
            if control
            else "A/A in effect (noise, not a speed-up): "
            if arm in same
            else ""
        )
        verdict = _verdict_words(claim, set(same))
        lines.append(f"{kind}{claim_sentence(plan, summaries, case, arm)}")
        pairs = f"{int(claim['pairs'])} pairs" + (
            f", {int(claim['both_failed'])} more with both arms failed left out"
            if int(claim["both_failed"])
            else ""
        )
        lines.append(
            f"{100 * float(claim['ci_level']):.0f}% {method_label(claim)} interval of the median reduction "
            f"{format_interval(claim['ci_low'], claim['ci_high'])} ({format_levels(claim)}, {pairs}); "
            f"{verdict}." + (f" Insufficient: {claim['ci_reason']}." if not claim["ci_sufficient"] else "")
        )
        lines.append(
            f"Checks: geometric-mean t {format_percent(claim['gm_estimate'])}, interval "
            f"{format_interval(claim['gm_low'], claim['gm_high'])} ({verdict_shown(plan, arm, str(claim['gm_verdict']))}); "
            f"sign-test interval of the median {format_interval(claim['sign_low'], claim['sign_high'])} "
            f"({100 * float(claim['sign_attained']):.1f}% attained, {verdict_shown(plan, arm, str(claim['sign_verdict']))}); "
            "Hodges-Lehmann "
            f"{format_percent(claim['hl_estimate'])}, Wilcoxon interval "
            f"{format_interval(claim['hl_low'], claim['hl_high'])} "
            + (
                "(not computable)."
                if math.isnan(float(claim["hl_attained"]))
                else f"({100 * float(claim['hl_attained']):.1f}% attained, "
                f"{verdict_shown(plan, arm, str(claim['hl_verdict']))})."
            )
        )
    steady = steady_claims(run)
    for _, claim in steady.iterrows():
        lines.append(
            f"Secondary, not the claim: the steady-state figure (epochs 2 on, training only) of {claim['arm']} "
            f"vs {claim['baseline_arm']}: {format_percent(claim['estimate'])}, {100 * float(claim['ci_level']):.0f}% "
            f"{method_label(claim)} interval {format_interval(claim['ci_low'], claim['ci_high'])} "
            f"({int(claim['pairs'])} pairs); {_verdict_words(claim, set(same))}."
        )
    lines.append(
        f"Protocol: {warmup_words(plan, summaries.trials)}, then {pairs_words(plan, summaries.trials)} in {plan.protocol.order} order "
        f"({_orders(plan)}), {settings.steps} steps each ({settings.epochs} epochs × {settings.iterations_per_epoch}); "
        f"isolation: {plan.isolation}; timed region: {plan.timed_region}."
    )
    lines.append(_environment_line(env))
    return "\n".join(lines) + "\n"


def _orders(plan: Plan) -> str:
    """The first rounds' orders as scheduled: ``AB, BA, …``."""
    orders = list(dict.fromkeys((t.round, t.order) for t in plan.schedule if t.phase == "measured"))
    return ", ".join(order for _, order in orders[:2]) + (", …" if len(orders) > 2 else "")
