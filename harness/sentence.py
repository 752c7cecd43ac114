"""The answer of a paired run in one sentence per claim, from the claim row alone (docs/run-folder.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from harness.codepaths import same_code_arms, verdict_shown
from harness.formatting import UNBOUNDED_REASON, claim_limit, is_bounded, is_missing

VERDICT_WORDS = {
    "clears": "clears {limit}",
    "fails": "fails {limit}",
    "ambiguous": "ambiguous: the interval straddles {limit}",
    "within": "within {limit}",
    "outside": "outside {limit}",
}


def _span(low: float, high: float) -> str:
    """``9.4–11.5%`` for an interval of one sign (shown as magnitudes), ``-1.2% to 3.4%`` across zero."""
    if low > 0 or high < 0:
        a, b = sorted((abs(low), abs(high)))
        return f"{100 * a:.1f}–{100 * b:.1f}%"
    return f"{100 * low:.1f}% to {100 * high:.1f}%"


def _verdict(claim: Mapping[str, Any], verdict: str, withheld: str | None) -> str:
    if withheld:
        return f"verdict withheld: {withheld}"
    bar, reason = not is_missing(claim.get("bar")), claim.get("ci_reason")
    if verdict == "insufficient":
        against = f" against {claim_limit(claim)}" if bar else ""
        return f"insufficient for a verdict{against}" + (
            f" ({reason})" if reason and not is_missing(reason) else ""
        )
    return VERDICT_WORDS[verdict].format(limit=claim_limit(claim)) if bar and verdict in VERDICT_WORDS else ""


def answer(
    claim: Mapping[str, Any], order: str = "", verdict: str | None = None, withheld: str | None = None
) -> str:
    """One claim row in one sentence (see the module docstring)."""
    arm, base, pairs = str(claim["arm"]), str(claim["baseline_arm"]), int(claim["pairs"])
    count = f"{pairs} {'duet pair' if order == 'duet' else 'pair'}{'' if pairs == 1 else 's'}"
    level = f"{100 * float(claim['ci_level']):.0f}% CI"
    attained = claim.get("ci_attained")
    if not is_missing(attained) and abs(float(attained) - float(claim["ci_level"])) >= 0.0005:
        count = f"{100 * float(attained):.1f}% attained, {count}"
    low, high, estimate = float(claim["ci_low"]), float(claim["ci_high"]), float(claim["estimate"])
    shown = verdict if verdict is not None else str(claim["verdict"])
    interval = f"({level} {_span(low, high)}, {count})"
    if not is_bounded(low, high):
        reason = claim.get("ci_reason")
        why = reason if reason and not is_missing(reason) else UNBOUNDED_REASON
        text = f"{arm} against {base}: unbounded ({why}; {count})"
    elif low <= 0 <= high and shown == "insufficient":  # too few pairs to say that no difference is there
        text = f"{arm} vs {base}: {100 * estimate:.1f}% {interval}"
    elif low <= 0 <= high or not math.isfinite(estimate):
        text = f"{arm} vs {base}: no difference detected {interval}"
    else:
        text = (
            f"{arm} is {100 * abs(estimate):.1f}% {'faster' if low > 0 else 'slower'} than {base} {interval}"
        )
    said = _verdict(claim, shown, withheld)
    return f"{text}: {said}" if said else text


def answers(plan: Any, claims: Any) -> list[str]:
    """The answer of every claim of a run (``claims``: its claims table), with the verdict it shows."""
    if claims is None or len(claims) == 0:
        return []
    same = same_code_arms(plan)
    out = []
    for _, claim in claims.iterrows():
        arm = str(claim["arm"])
        shown = verdict_shown(plan, arm, str(claim["verdict"]))
        withheld = same.get(arm) if shown != str(claim["verdict"]) else None
        where = f"{claim['case']}: " if claims["case"].nunique() > 1 else ""
        out.append(where + answer(claim, plan.protocol.order, shown, withheld))
    return out
