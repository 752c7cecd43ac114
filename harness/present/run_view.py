"""A run as a report reads it: plan order, arms' and claims' rows, and the run's facts in words."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from harness.formatting import (
    format_bytes,
    format_percent,
    format_percent_range,
    format_range,
    format_value,
    is_missing,
    method_label,
)
from harness.plan import Plan, scheduled_done
from harness.stats import ClaimSettings, finished, numeric_column
from harness.tables import Summaries
from harness.tier import Run, TierRegistry
from harness.warmup import warmup_sequences


@dataclass
class LoadedRun(Run):
    """A run as one report shows it: numbered among the report's runs, read by its tier."""

    number: int = 1
    several: bool = False
    tiers: TierRegistry | None = None

    @property
    def tier(self):
        return (self.tiers or TierRegistry()).reader(self.plan.tier)

    @property
    def name(self) -> str:
        return self.folder.path.name

    @property
    def kind(self) -> str:
        """'claim', 'A/A control' or 'claim + A/A control' (``--control`` beside other arms)."""
        if not self.plan.protocol.control:
            return "claim"
        settings = ClaimSettings.from_protocol(self.plan.protocol)
        others = [
            a.label
            for case in self.plan.cases
            for a in case.arms[1:]
            if not settings.is_control(a.label, case.arms[0].label)
        ]
        return "claim + A/A control" if others else "A/A control"

    @property
    def title(self) -> str:
        kind = "" if self.kind == "claim" else f" ({self.kind})"
        return (
            f"Run {self.number}: {self.plan.tier}{kind}" if self.several else f"Run: {self.plan.tier}{kind}"
        )


def plan_ordered(frame: pd.DataFrame, run: LoadedRun) -> pd.DataFrame:
    """Rows in plan order of case, then arm (the statistics' order follows the first round's order)."""
    if frame.empty:
        return frame
    cases = {c.label: i for i, c in enumerate(run.plan.cases)}
    arms = {label: i for i, label in enumerate(run.plan.arm_labels())}
    keys = [
        (cases.get(str(c), len(cases)), arms.get(str(a), len(arms)))
        for c, a in zip(frame["case"], frame["arm"], strict=True)
    ]
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    return frame.iloc[order].reset_index(drop=True)


def peak_median(trials: pd.DataFrame, case: str, arm: str, column: str) -> float | None:
    """Median of a per-trial byte figure over one arm's measured, finished trials; None where absent."""
    rows = finished(trials)
    if rows.empty:
        return None
    values = numeric_column(rows[(rows["case"] == case) & (rows["arm"] == arm)], column)
    return float(values.median()) if len(values) else None


def sentence_label(label: str) -> str:
    """An arm label at the start of a sentence: plain words get a capital, specs stay verbatim."""
    return label[:1].upper() + label[1:] if label.replace("-", "").replace("_", "").isalpha() else label


def claim_row(summaries: Summaries, case: str, arm: str) -> pd.Series:
    claims = summaries.claims
    match = claims[(claims["case"].astype(str) == case) & (claims["arm"].astype(str) == arm)]
    if match.empty:
        raise KeyError(f"no claim for case '{case}' and arm '{arm}' (no complete pair)")
    return match.iloc[0]


def arm_row(summaries: Summaries, case: str, arm: str) -> pd.Series:
    arms = summaries.arms
    return arms[(arms["case"].astype(str) == case) & (arms["arm"].astype(str) == arm)].iloc[0]


def claim_sentence(plan: Plan, summaries: Summaries, case: str, arm: str) -> str:
    """The claim of one arm against its case's baseline, in the project's words."""
    claim = claim_row(summaries, case, arm)
    base_label = str(claim["baseline_arm"])
    base, mine = arm_row(summaries, case, base_label), arm_row(summaries, case, arm)
    text = (
        f"{sentence_label(base_label)} median {format_value(base['median'], plan.unit)} "
        f"({format_range(base['min'], base['max'])}); {arm} {format_value(mine['median'], plan.unit)} "
        f"({format_range(mine['min'], mine['max'])}). "
        + (
            f"The one pair's reduction is {format_percent(claim['median'])}"
            if int(claim["pairs"]) == 1
            else f"The paired reduction is {format_percent(claim['estimate'])} (median; geometric mean "
            f"{format_percent(claim['gm_estimate'])}, range {format_percent_range(claim['min'], claim['max'])})"
        )
    )
    base_peak = peak_median(summaries.trials, case, base_label, "peak_allocated")
    arm_peak = peak_median(summaries.trials, case, arm, "peak_allocated")
    if base_peak is not None and arm_peak is not None:
        if format_bytes(base_peak) == format_bytes(arm_peak):
            text += f", with the same {format_bytes(base_peak)} peak allocated"
        else:
            change = (arm_peak - base_peak) / base_peak if base_peak else math.inf
            change_text = f"{100 * change:+.1f}%" if math.isfinite(change) else "from zero"
            text += (
                f", with peak allocated {format_bytes(base_peak)} vs {format_bytes(arm_peak)} ({change_text})"
            )
    text += "."
    for label, row in ((base_label, base), (arm, mine)):
        if int(row["failed"]):
            text += f" {int(row['failed'])} of {int(row['trials'])} {label} trials failed and count as infinitely slow."
    return text


def completed_pairs(plan: Plan, trials: pd.DataFrame) -> int:
    """Measured rounds (over all cases) in which every arm has a row in the log."""
    if trials.empty:
        return 0
    measured = trials[trials["phase"] == "measured"]
    return sum(
        set(in_round["arm"]) >= {a.label for a in case.arms}
        for case in plan.cases
        for _, in_round in measured[measured["case"] == case.label].groupby("round")
    )


def is_interrupted(plan: Plan, trials: pd.DataFrame) -> bool:
    """Some scheduled trial has no row (extra warm-ups, outside the schedule, do not count either way)."""
    rows = [] if trials.empty else trials[["index"]].to_dict("records")
    return scheduled_done(plan, rows) < len(plan.schedule)


def extra_warmups(trials: pd.DataFrame) -> pd.DataFrame:
    """The untimed warm-ups run after a resume or an idle gap (rows with a ``warmup_reason``)."""
    if trials.empty or "warmup_reason" not in trials:
        return trials.iloc[0:0]
    reasons = trials["warmup_reason"]
    return trials[reasons.notna() & (reasons.astype(str) != "")]


def warmup_sequence_text(plan: Plan, trials: pd.DataFrame) -> str:
    """``--warmup auto``'s sequences in words, one per phase."""
    rows = [] if trials.empty else trials.to_dict("records")
    sequences = warmup_sequences(rows, plan.protocol)
    several = len(plan.cases) > 1
    return ", ".join(
        f"{s.case} · " * several
        + f"{s.reason} {s.warmups} ("
        + ("settled" if s.settled else "never settled" if s.capped else "unfinished")
        + ")"
        for s in sequences
    )


def warmup_words(plan: Plan, trials: pd.DataFrame) -> str:
    """The warm-ups of a run in a few words."""
    p = plan.protocol
    if not p.auto_warmup:
        return f"{p.warmup} warm-up fit(s) discarded"
    done = warmup_sequence_text(plan, trials) or "none run yet"
    return (
        f"warm-up fits until one is at most {p.warmup_tolerance:g}% faster than its arm's previous (at most "
        f"{p.max_warmup}), discarded: {done}"
    )


def pairs_words(plan: Plan, trials: pd.DataFrame) -> str:
    """The measured pairs of a run in a few words."""
    p = plan.protocol
    if p.pairs != "auto":
        return f"{p.pairs} pair{'' if p.pairs == 1 else 's'}"
    rounds = 0 if trials.empty else trials.loc[trials["phase"] == "measured", "round"].nunique()
    return f"pairs by the stopping rule ({rounds} so far, at most {p.max_pairs})"


def logged(plan: Plan, trials: pd.DataFrame) -> str:
    """``8 of 8 scheduled trials`` (and the extra warm-ups beside them)."""
    rows = [] if trials.empty else trials[["index"]].to_dict("records")
    extra = len(extra_warmups(trials))
    return f"{scheduled_done(plan, rows)} of {len(plan.schedule)} scheduled trials" + (
        f" (+{extra} extra warm-up{'s' if extra != 1 else ''})" if extra else ""
    )


def plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def sentence(text: str) -> str:
    """A reason as a sentence: capitalized, with a full stop."""
    text = text.strip()
    return (text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")) if text else ""


def diagnostic_text(claim: pd.Series, name: str) -> str:
    """An order effect or drift estimate with its interval, or why there is none."""
    estimate, low, high = (
        claim[name if name == "drift" else "order_effect"],
        claim[f"{name}_low"],
        claim[f"{name}_high"],
    )
    if is_missing(estimate):
        return f"not estimable: {claim[f'{name}_reason'] or 'no data'}"
    unit = "% per trial" if name == "drift" else "%"
    return f"{float(estimate):+.2f}{unit} (95% interval {float(low):+.2f} to {float(high):+.2f}{unit})"


def attained(level: Any) -> str:
    return "n/a" if is_missing(level) else f"{100 * float(level):.1f}% attained"


def pairs_text(run: LoadedRun, claim: pd.Series) -> str:
    """``6 of 6``, with pairs left out (both arms failed) said."""
    p = run.plan.protocol
    text = f"{int(claim['pairs'])} of " + (f"auto (≤ {p.max_pairs})" if p.auto else str(p.pairs))
    if int(claim["both_failed"]):
        text += f" (+{int(claim['both_failed'])} both failed, left out)"
    return text


def limit_text(plan: Plan, claim: pd.Series) -> str:
    """A claim's bar or an A/A arm's ±tolerance, as the tables show it."""
    if is_missing(claim["bar"]):
        return "none"
    value = 100 * float(claim["bar"])
    return f"±{value:g}%" if claim["kind"] == "control" else f"{value:g}%"


def duration(seconds: float) -> str:
    return (
        f"{seconds:.0f} s"
        if seconds < 120
        else f"{seconds / 60:.1f} min"
        if seconds < 7200
        else f"{seconds / 3600:.1f} h"
    )


def level(runs: list[LoadedRun]) -> str:
    """The primary interval's description for the protocol text."""
    for run in runs:
        claims = run.summaries.claims
        if not claims.empty:
            claim = claims.iloc[0]
            return f"{100 * float(claim['ci_level']):.0f}% {method_label(claim)} interval"
    return "calibrated t interval"
