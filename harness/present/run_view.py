"""A run as a report reads it: plan order, arms' and claims' rows, and the run's facts in words."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from harness.formatting import (
    format_bytes,
    format_interval,
    format_percent,
    format_percent_range,
    format_range,
    format_value,
    is_missing,
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
        cases = self.plan.cases
        others = [a for c in cases for a in c.arms[1:] if not settings.is_control(a.label, c.arms[0].label)]
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
    return frame.iloc[sorted(range(len(keys)), key=keys.__getitem__)].reset_index(drop=True)


def peak_median(trials: pd.DataFrame, case: str, arm: str, column: str) -> float | None:
    """Median of a per-trial byte figure over one arm's measured, finished trials; None where absent."""
    rows = finished(trials)
    if rows.empty:
        return None
    values = numeric_column(rows[(rows["case"] == case) & (rows["arm"] == arm)], column)
    return float(values.median()) if len(values) else None


def row_of(table: pd.DataFrame, case: str, arm: str) -> pd.Series:
    """The row of one case and arm in an arms or claims table; ``KeyError`` where there is none."""
    match = table[(table["case"].astype(str) == case) & (table["arm"].astype(str) == arm)]
    if match.empty:
        raise KeyError(f"no row for case '{case}' and arm '{arm}' (no complete pair)")
    return match.iloc[0]


def claim_sentence(plan: Plan, summaries: Summaries, case: str, arm: str) -> str:
    """The claim of one arm against its case's baseline, in the project's words."""
    claim = row_of(summaries.claims, case, arm)
    base_label = str(claim["baseline_arm"])
    base, mine = row_of(summaries.arms, case, base_label), row_of(summaries.arms, case, arm)
    words = base_label.replace("-", "").replace("_", "").isalpha()  # a spec stays verbatim
    opening = base_label[:1].upper() + base_label[1:] if words else base_label
    text = (
        f"{opening} median {format_value(base['median'], plan.unit)} ({format_range(base['min'], base['max'])}); "
        f"{arm} {format_value(mine['median'], plan.unit)} ({format_range(mine['min'], mine['max'])}). "
    )
    if int(claim["pairs"]) == 1:
        text += f"The one pair's reduction is {format_percent(claim['median'])}"
    else:
        text += (
            f"The paired reduction is {format_percent(claim['estimate'])} (median; geometric mean "
            f"{format_percent(claim['gm_estimate'])}, range {format_percent_range(claim['min'], claim['max'])})"
        )
    peaks = [peak_median(summaries.trials, case, label, "peak_allocated") for label in (base_label, arm)]
    if None not in peaks:
        before, after = format_bytes(peaks[0]), format_bytes(peaks[1])
        change = f"{100 * (peaks[1] - peaks[0]) / peaks[0]:+.1f}%" if peaks[0] else "from zero"
        if before == after:
            text += f", with the same {before} peak allocated"
        else:
            text += f", with peak allocated {before} vs {after} ({change})"
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


def scheduled_logged(plan: Plan, trials: pd.DataFrame) -> int:
    """How many of the schedule's trials the log holds (extra warm-ups, outside it, do not count)."""
    return scheduled_done(plan, [] if trials.empty else trials[["index"]].to_dict("records"))


def extra_warmups(trials: pd.DataFrame) -> pd.DataFrame:
    """The untimed warm-ups run after a resume or an idle gap (rows with a ``warmup_reason``)."""
    if trials.empty or "warmup_reason" not in trials:
        return trials.iloc[0:0]
    reasons = trials["warmup_reason"]
    return trials[reasons.notna() & (reasons.astype(str) != "")]


def warmup_sequence_text(plan: Plan, trials: pd.DataFrame) -> str:
    """``--warmup auto``'s sequences in words, one per phase."""
    sequences = warmup_sequences([] if trials.empty else trials.to_dict("records"), plan.protocol)
    return ", ".join(
        f"{s.case} · " * (len(plan.cases) > 1)
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
    return (
        f"warm-up fits until one is at most {p.warmup_tolerance:g}% faster than its arm's previous (at most "
        f"{p.max_warmup}), discarded: {warmup_sequence_text(plan, trials) or 'none run yet'}"
    )


def pairs_words(plan: Plan, trials: pd.DataFrame) -> str:
    """The measured pairs of a run in a few words."""
    p = plan.protocol
    if p.pairs != "auto":
        return plural(p.pairs, "pair")
    rounds = 0 if trials.empty else trials.loc[trials["phase"] == "measured", "round"].nunique()
    return f"pairs by the stopping rule ({rounds} so far, at most {p.max_pairs})"


def logged(plan: Plan, trials: pd.DataFrame) -> str:
    """``8 of 8 scheduled trials`` (and the extra warm-ups beside them)."""
    extra = len(extra_warmups(trials))
    text = f"{scheduled_logged(plan, trials)} of {len(plan.schedule)} scheduled trials"
    return text + (f" (+{plural(extra, 'extra warm-up')})" if extra else "")


def plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def sentence(text: str) -> str:
    """A reason as a sentence: capitalized, with a full stop."""
    text = text.strip()
    return (text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")) if text else ""


def diagnostic_text(claim: pd.Series, name: str) -> str:
    """An order effect or drift estimate with its interval, or why there is none."""
    estimate = claim[name if name == "drift" else "order_effect"]
    if is_missing(estimate):
        return f"not estimable: {claim[f'{name}_reason'] or 'no data'}"
    low, high = float(claim[f"{name}_low"]), float(claim[f"{name}_high"])
    unit = "% per trial" if name == "drift" else "%"
    return f"{float(estimate):+.2f}{unit} (95% interval {low:+.2f} to {high:+.2f}{unit})"


def check_text(claim: pd.Series, prefix: str) -> str:
    """A check's interval and its attained level: ``[4.06%, 18.30%], 96.9% attained``."""
    level = claim[f"{prefix}_attained"]
    attained = "n/a" if is_missing(level) else f"{100 * float(level):.1f}% attained"
    return f"{format_interval(claim[f'{prefix}_low'], claim[f'{prefix}_high'])}, {attained}"


def pairs_text(run: LoadedRun, claim: pd.Series) -> str:
    """``6 of 6``, with pairs left out (both arms failed) said."""
    p = run.plan.protocol
    text = f"{int(claim['pairs'])} of " + (f"auto (≤ {p.max_pairs})" if p.auto else str(p.pairs))
    both = int(claim["both_failed"])
    return text + (f" (+{both} both failed, left out)" if both else "")


def limit_text(claim: pd.Series) -> str:
    """A claim's bar or an A/A arm's ±tolerance, as the tables show it."""
    if is_missing(claim["bar"]):
        return "none"
    value = 100 * float(claim["bar"])
    return f"±{value:g}%" if claim["kind"] == "control" else f"{value:g}%"


def claim_label(claim: pd.Series) -> str:
    """``candidate vs upstream``."""
    return f"{claim['arm']} vs {claim['baseline_arm']}"


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"
