"""The markdown report of one or more run folders: what a reviewer reads.

Everything comes from the run folders alone (``plan.json``, ``env.json``, ``trials.jsonl``; the summaries
are recomputed from the log), so a report can be regenerated at any time, and the same folders give the same
markdown byte for byte: no clock is read here (the date is the plan's creation time), every ordering follows
the plan, and every number goes through ``harness.formatting``. The report writes its markdown and figures and
nothing else.

Layout: title, date, command(s); a summary of every claim; the environment (one column per run, side by
side); then one section per run: protocol, results (tables and the claim sentence), verdict, failed trials,
caveats, plots, and the tier's own section (``Tier.section``).

Where it is written: ``write_report([folder])`` writes ``<folder>/report.md``; several folders make one
combined report and need an explicit ``output`` (``bench report A B -o reports/NAME.md``), so a combined
report never overwrites a run's own report. PNGs go in a folder beside the markdown: ``<stem>-figures/``
for one run, ``<stem>-figures-<k>/`` for the k-th of several (drawn aside and put in place with the markdown).

For tier sections (``Tier.section(run) -> str``): draw into ``run.figures_dir`` through ``harness.plots``,
reference images with ``markdown_image(path, caption)``, build tables with ``markdown_table`` and format
numbers with ``format_value`` / ``format_percent`` / ``format_bytes`` so a report reads as one piece. Use
``###`` headings: a run's section is a ``##``.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness import gm_interval, plots, telemetry
from harness.codepaths import WITHHELD, all_same_code, same_code_arms, verdict_shown, what_ran
from harness.formatting import (
    format_bytes,
    format_interval,
    format_levels,
    format_limit,
    format_number,
    format_percent,
    format_percent_range,
    format_range,
    format_value,
    is_missing,
    method_label,
)
from harness.instability import run_flags as instability_flags
from harness.markdown import NOT_RECORDED, cell, code, markdown_image, markdown_table, when
from harness.options import InputError
from harness.planning import plan_rows
from harness.protocol import (
    DUET_FILLER_FORMAT,
    IDLE_GAP_SECONDS,
    WHOLE_PAIRS_FORMAT,
    Plan,
    scheduled_done,
    warmup_sequences,
)
from harness.report_env import environment_section, resumed_at_other_code, resumed_elsewhere
from harness.report_staging import remove_stale_staging, staging_folder
from harness.safe_fs import remove_tree
from harness.sentence import answers
from harness.stats import (
    ClaimSettings,
    disagreeing_checks,
    finished,
    numeric_column,
)
from harness.tables import (
    RunFolder,
    RunFolderWriteError,
    Summaries,
    check_can_write,
    unnameable,
    write_atomic,
)
from harness.tier import Caveat, Run, TierRegistry, gate_refusal

REPORT_NAME = "report.md"
# --- one run, loaded --------------------------------------------------------------------------------------


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
        """'claim', 'A/A control' (a run of one arm against its twin) or 'claim + A/A control' (``--control``
        beside other arms: both from one schedule)."""
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

    def tag(self, claim: pd.Series) -> str:
        """How the summary names this run in a claim's row: its number, and for a control's row that it is one."""
        return f"{self.number}" + (" (A/A control)" if claim["kind"] == "control" else "")

    def case_order(self) -> dict[str, int]:
        return {c.label: i for i, c in enumerate(self.plan.cases)}

    def arm_order(self) -> dict[str, int]:
        return {label: i for i, label in enumerate(self.plan.arm_labels())}


def _sorted(frame: pd.DataFrame, run: LoadedRun) -> pd.DataFrame:
    """Rows in plan order of case, then arm (the statistics' order follows the first round's order)."""
    if frame.empty:
        return frame
    cases, arms = run.case_order(), run.arm_order()
    keys = [
        (cases.get(str(c), len(cases)), arms.get(str(a), len(arms)))
        for c, a in zip(frame["case"], frame["arm"], strict=True)
    ]
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    return frame.iloc[order].reset_index(drop=True)


def peak_median(trials: pd.DataFrame, case: str, arm: str, column: str) -> float | None:
    """Median of a per-trial byte figure (``peak_allocated``/``peak_reserved``) over measured, finished
    trials of one arm; None where the trials carry no such figure (e.g. on the CPU)."""
    rows = finished(trials)
    if rows.empty:
        return None
    values = numeric_column(rows[(rows["case"] == case) & (rows["arm"] == arm)], column)
    return float(values.median()) if len(values) else None


def _sentence_label(label: str) -> str:
    """An arm label at the start of a sentence: plain words get a capital, specs stay verbatim."""
    return label[:1].upper() + label[1:] if label.replace("-", "").replace("_", "").isalpha() else label


def _claim_row(summaries: Summaries, case: str, arm: str) -> pd.Series:
    claims = summaries.claims
    match = claims[(claims["case"].astype(str) == case) & (claims["arm"].astype(str) == arm)]
    if match.empty:
        raise KeyError(f"no claim for case '{case}' and arm '{arm}' (no complete pair)")
    return match.iloc[0]


def _arm_row(summaries: Summaries, case: str, arm: str) -> pd.Series:
    arms = summaries.arms
    return arms[(arms["case"].astype(str) == case) & (arms["arm"].astype(str) == arm)].iloc[0]


def claim_sentence(plan: Plan, summaries: Summaries, case: str, arm: str) -> str:
    """The claim of one arm against its case's baseline, in the project's words:

    "Baseline median 89.448 s (88.765–89.646); candidate 79.183 s (77.799–79.660). The paired reduction
    is 11.19% (median; geometric mean 11.18%, range 10.88–13.22%), with the same 809.9 MiB peak allocated."
    """
    claim = _claim_row(summaries, case, arm)
    base_label = str(claim["baseline_arm"])
    base, mine = _arm_row(summaries, case, base_label), _arm_row(summaries, case, arm)
    text = (
        f"{_sentence_label(base_label)} median {format_value(base['median'], plan.unit)} "
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


# --- what the data says about the run ----------------------------------------------------------------------


def completed_pairs(plan: Plan, trials: pd.DataFrame) -> int:
    """Measured rounds (over all cases) in which every arm has a row in the log."""
    if trials.empty:
        return 0
    measured = trials[trials["phase"] == "measured"]
    done = 0
    for case in plan.cases:
        rows = measured[measured["case"] == case.label]
        for _, in_round in rows.groupby("round"):
            if set(in_round["arm"]) >= {a.label for a in case.arms}:
                done += 1
    return done


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
    """``--warmup auto``'s sequences in words, one per phase: ``start 4 (settled), resume 6 (never settled)``
    (by case where there are several); empty for fixed warm-ups or before any ran."""
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
    """The warm-ups of a run in a few words: ``2 warm-up fit(s) discarded``, or with ``--warmup auto`` the rule
    and each phase's count and whether it settled."""
    p = plan.protocol
    if not p.auto_warmup:
        return f"{p.warmup} warm-up fit(s) discarded"
    done = warmup_sequence_text(plan, trials) or "none run yet"
    return (
        f"warm-up fits until one is at most {p.warmup_tolerance:g}% faster than its arm's previous (at most "
        f"{p.max_warmup}), discarded: {done}"
    )


def pairs_words(plan: Plan, trials: pd.DataFrame) -> str:
    """The measured pairs of a run in a few words: ``1 pair``, ``6 pairs``, or with ``--pairs auto`` the
    stopping rule's count so far and its last look."""
    p = plan.protocol
    if p.pairs != "auto":
        return f"{p.pairs} pair{'' if p.pairs == 1 else 's'}"
    rounds = 0 if trials.empty else trials.loc[trials["phase"] == "measured", "round"].nunique()
    return f"pairs by the stopping rule ({rounds} so far, at most {p.max_pairs})"


def _logged(plan: Plan, trials: pd.DataFrame) -> str:
    """``8 of 8 scheduled trials`` (and the extra warm-ups beside them)."""
    rows = [] if trials.empty else trials[["index"]].to_dict("records")
    extra = len(extra_warmups(trials))
    return f"{scheduled_done(plan, rows)} of {len(plan.schedule)} scheduled trials" + (
        f" (+{extra} extra warm-up{'s' if extra != 1 else ''})" if extra else ""
    )


def _planned_text(plan: Plan) -> str:
    """The pairs asked for: a number, or the stopping rule's looks."""
    p = plan.protocol
    return f"auto (≤ {p.max_pairs})" if p.auto else str(p.pairs)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def caveats(run: LoadedRun) -> list[Caveat]:
    """Caveats derived from the tier and the data, most important first."""
    plan, trials, claims = run.plan, run.summaries.trials, run.summaries.claims
    out: list[Caveat] = []
    same = same_code_arms(plan)
    if same:
        out.append(
            Caveat(
                ("an A/A in effect" if all_same_code(plan) else "partly an A/A in effect")
                + f": {', '.join(same)} ran the baseline's code on {plan.protocol.device}; "
                + ("its verdict is" if len(same) == 1 else "their verdicts are")
                + " withheld.",
                "; ".join(f"{label}: {reason}" for label, reason in same.items())
                + ". Name an arm that runs other code there (on the CPU, candidate-cpu routes CPU tensors "
                "through the candidate's batched path).",
            )
        )
    out += list(run.tier.caveats(run))
    for k, machine in resumed_elsewhere(run.env):
        out.append(
            Caveat(
                f"spans machines: resume {k} ran on another machine ({machine}).",
                "Each pair ran within one slice, so each pair's ratio is of one machine; the arms' medians "
                "and the spread mix machines (the environment table names each slice's machine).",
            )
        )
    for k, revision in resumed_at_other_code(run.env):
        out.append(
            Caveat(
                f"spans code revisions: resume {k} ran {code(revision)}, the run started at "
                f"{code(run.env.get('git_revision'))}.",
                "Each pair ran within one slice, so each pair's ratio is of one revision; where the arms' code "
                "changed between revisions, the medians and the claim mix implementations (the environment "
                "table names each slice's revision).",
            )
        )
    if plan.protocol.control:
        out.append(Caveat("A/A control: it measures the noise floor, not a speed-up.", _control_text(run)))
    if is_interrupted(plan, trials):
        planned = sum(
            len({t.round for t in plan.schedule if t.case == c.label and t.phase == "measured"})
            for c in plan.cases
        )
        rows = [] if trials.empty else trials[["index"]].to_dict("records")
        out.append(
            Caveat(
                f"interrupted: {completed_pairs(plan, trials)} of {planned} pairs.",
                f"{scheduled_done(plan, rows)} of {len(plan.schedule)} scheduled trials are in the log; the "
                "figures cover only what ran. `--resume` with this run folder continues it.",
            )
        )
    if not trials.empty:
        failed = trials[trials["status"] != "ok"]
        measured_failed = int((failed["phase"] == "measured").sum())
        warmup_failed = int((failed["phase"] == "warmup").sum())
        if measured_failed:
            out.append(
                Caveat(
                    f"failures: {_plural(measured_failed, 'measured trial')} failed and "
                    f"{'counts' if measured_failed == 1 else 'count'} as infinitely slow.",
                    "A pair whose arm failed has reduction -∞ (whose baseline failed, +100%); no failure is "
                    "dropped, but a pair where both arms failed is no evidence either way: it is left out of the "
                    "claim and counted.",
                )
            )
        if warmup_failed:
            out.append(
                Caveat(
                    f"{_plural(warmup_failed, 'warm-up trial')} failed.",
                    "Warm-ups are discarded from the statistics anyway.",
                )
            )
    unsettled = [
        w
        for w in warmup_sequences([] if trials.empty else trials.to_dict("records"), plan.protocol)
        if w.capped
    ]
    if unsettled:
        out.append(
            Caveat(
                f"warm-ups never settled in {_plural(len(unsettled), 'sequence')}: "
                + ", ".join(f"{w.reason} ({w.warmups} warm-ups)" for w in unsettled)
                + ".",
                f"Every warm-up was over {plan.protocol.warmup_tolerance:g}% faster than its arm's previous before "
                f"the cap of {plan.protocol.max_warmup}; the measured trials after them may still be warming.",
            )
        )
    if plan.protocol.device == "cpu" and run.tier.paired:
        out.append(Caveat("device cpu: timings on the CPU say nothing about speed on a GPU."))
    if run.env.get("git_dirty") is True:
        out.append(
            Caveat(
                "uncommitted changes: the code differed from its git revision.",
                f"The working tree had changes against {code(run.env.get('git_revision'))} when the run started.",
            )
        )
    if not run.tier.paired:  # pairs, intervals and bars mean nothing to it
        return out
    per_claim: dict[str, list[Caveat]] = {"insufficient": [], "both": [], "odd": [], "checks": []}
    for _, c in _sorted(claims, run).iterrows():
        label = f"{c['arm']} vs {c['baseline_arm']}" + (f" ({c['case']})" if len(plan.cases) > 1 else "")
        if not c["ci_sufficient"]:
            per_claim["insufficient"].append(
                Caveat(
                    f"insufficient: {label}'s {method_label(c)} interval does not keep the stated "
                    f"{100 * float(c['ci_level']):.0f}% with {int(c['pairs'])} pairs.",
                    _sentence(str(c["ci_reason"])) if c["ci_reason"] else "",
                )
            )
        if int(c["both_failed"]):
            per_claim["both"].append(
                Caveat(
                    f"{_plural(int(c['both_failed']), 'pair')} of {label} left out: both arms failed.",
                    "A pair where both arms failed says nothing about their difference; it is counted here and in "
                    "`claims.csv` (`both_failed`), never taken as a reduction of 0.",
                )
            )
        if c["arm_second"] != c["arm_first"]:
            per_claim["odd"].append(
                Caveat(
                    f"odd pairs: {label} ran second in {int(c['arm_second'])} pairs and first in "
                    f"{int(c['arm_first'])}, unbalanced.",
                    "An order effect is not averaged out of the estimate; the diagnostics give its estimate "
                    f"({_diagnostic_text(c, 'order')}).",
                )
            )
        disagree = disagreeing_checks(c)
        if disagree:
            per_claim["checks"].append(
                Caveat(
                    f"checks disagree: for {label} the primary says {c['verdict']}, "
                    + ", ".join(f"{name} {c[f'{prefix}_verdict']}" for name, prefix in disagree)
                    + ".",
                    "; ".join(
                        f"{name}: {format_interval(c[f'{prefix}_low'], c[f'{prefix}_high'])} "
                        f"({_attained(c[f'{prefix}_attained'])})"
                        for name, prefix in disagree
                    )
                    + "; see the verdict section.",
                )
            )
    summaries = {
        "insufficient": "insufficient: {n} claims' intervals do not keep their stated level.",
        "both": "pairs left out in {n} claims: both arms failed.",
        "odd": "odd pairs: {n} claims ran their arm second and first unequally often.",
        "checks": "checks disagree with the primary verdict in {n} claims.",
    }
    for key, items in per_claim.items():
        if len(items) <= 3:  # one caveat per claim; beyond three, one that lists them
            out += items
        else:
            out.append(Caveat(summaries[key].format(n=len(items)), " ".join(c.headline for c in items)))
    flags = instability_flags(trials, run.env)
    if len(flags) <= 3:
        for flag in flags:
            out.append(
                Caveat(
                    f"unstable: {flag.reason}.",
                    "Flagged trials are kept in every figure; read them with care.",
                )
            )
    else:
        out.append(
            Caveat(
                f"unstable: {len(flags)} flags (the stability section lists them).",
                "Flagged trials are kept in every figure; read them with care.",
            )
        )
    if plan.protocol.bar is None and not plan.protocol.control:
        out.append(Caveat("no bar set (`--bar`): the claims say only whether an arm is faster at all."))
    return out


def _control_text(run: LoadedRun) -> str:
    """What an A/A control is, with its figure where it has one."""
    text = (
        "The first arm ran against itself through the same machinery; its paired reductions measure the noise "
        "floor of this protocol on this machine"
    )
    claims = run.summaries.claims
    controls = claims[claims["kind"] == "control"] if not claims.empty else claims
    if not controls.empty:
        parts = [
            f"{format_percent(c['estimate'])} (median; {method_label(c)} interval "
            f"{format_interval(c['ci_low'], c['ci_high'])}, {format_levels(c)}; geometric mean "
            f"{format_percent(c['gm_estimate'])}, range {format_percent_range(c['min'], c['max'])})"
            + (f" in case {code(c['case'])}" if len(run.plan.cases) > 1 else "")
            for _, c in _sorted(controls, run).iterrows()
        ]
        text += ": difference " + "; ".join(parts)
    return text + "."


def _sentence(text: str) -> str:
    """A reason as a sentence: capitalized, with a full stop."""
    text = text.strip()
    return (text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")) if text else ""


def _diagnostic_text(claim: pd.Series, name: str) -> str:
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


# --- sections ---------------------------------------------------------------------------------------------


def _same_code_tag(plan: Plan) -> str:
    """What the title calls a run whose compared arms ran the baseline's code."""
    if all_same_code(plan):
        return f" (an A/A in effect: the arms ran the same code on {plan.protocol.device})"
    if same_code_arms(plan):
        return f" (partly an A/A in effect: some arms ran the baseline's code on {plan.protocol.device})"
    return ""


def _title(runs: list[LoadedRun]) -> list[str]:
    kinds: list[str] = []
    for run in runs:
        kind = run.plan.tier + ("" if run.kind == "claim" else f" {run.kind}") + _same_code_tag(run.plan)
        if kind not in kinds:
            kinds.append(kind)
    first = runs[0]
    lines = [f"# musgd-bench report: {' + '.join(kinds)}", ""]
    for run in runs:  # the answer first, in words (harness.sentence)
        where = f"Run {run.number}: " if len(runs) > 1 else ""
        if run.tier.paired and not run.tier.diagnostic:
            lines += [f"{where}{said}" for said in answers(run.plan, run.summaries.claims)]
        lines += [""] if lines[-1] else []
    first_start = when(min(str(r.plan.created) for r in runs))
    lines.append(
        f"Date: {first_start[:10]} ("
        + (
            f"first run started {first_start}; the runs table gives each run's start)."
            if len(runs) > 1
            else f"run started {first_start})."
        )
    )
    lines.append("")
    if len(runs) == 1:
        plan, trials = first.plan, first.summaries.trials
        lines.append(
            f"Run folder {code(first.name)}; tier {code(plan.tier)}; primary figure: {plan.metric}"
            + (f" in {plan.unit}" if plan.unit else "")
            + f" (lower is better); {_logged(plan, trials)} in the log."
        )
        lines += ["", "Command:", "", "```sh", plan.command or "# not recorded (started from Python)", "```"]
        return lines
    gates = {r.number: _gate(r) for r in runs}
    rows = [
        [
            r.number,
            code(r.name),
            r.plan.tier,
            r.kind,
            f"{r.plan.metric} ({r.plan.unit})",
            when(r.plan.created),
            _logged(r.plan, r.summaries.trials).replace(" scheduled trials", ""),
            gates[r.number][0],
        ]
        for r in runs
    ]
    columns = ["run", "folder", "tier", "kind", "figure", "started", "trials logged", "`--gate`"]
    lines.append(markdown_table(columns, rows, "rllll"))
    failing = [(r, gates[r.number][1]) for r in runs if gates[r.number][1]]
    if failing:
        lines += [
            "",
            "`--gate`: what the run's command exits with `--gate` given, read from its folder now (1 where a "
            "claim does not clear its bar or an A/A arm is not within its tolerance):",
            "",
        ] + [f"- run {r.number} exits 1: {'; '.join(why)}." for r, why in failing]
    lines += ["", "Commands:", "", "```sh"]
    for r in runs:
        lines += [f"# run {r.number} ({r.name})", r.plan.command or "# not recorded (started from Python)"]
    lines.append("```")
    return lines


def _gate(run: LoadedRun) -> tuple[str, list[str]]:
    """The runs table's `--gate` cell (the exit status the gate gives this folder, or why it judges none)
    and why it fails (empty where it passes or judges nothing)."""
    refusal = gate_refusal(run.tier)
    if refusal is not None:
        return f"n/a ({refusal})", []
    failures = run.gate_failures()
    return ("exit 1" if failures else "exit 0"), failures


def _summary(runs: list[LoadedRun]) -> list[str]:
    several = len(runs) > 1
    columns = (["run"] if several else []) + [
        "case",
        "arm vs baseline",
        "pairs",
        "baseline median",
        "arm median",
        "reduction (median)",
        "interval (method, levels)",
        "bar",
        "verdict",
    ]
    rows = []
    for run in (r for r in runs if r.tier.paired):
        summaries = run.summaries
        for _, claim in _sorted(summaries.claims, run).iterrows():
            case, arm, base = str(claim["case"]), str(claim["arm"]), str(claim["baseline_arm"])
            base_row, arm_row = _arm_row(summaries, case, base), _arm_row(summaries, case, arm)
            rows.append(
                ([run.tag(claim)] if several else [])
                + [
                    case,
                    f"{arm} vs {base}",
                    _pairs_text(run, claim),
                    format_value(base_row["median"], run.plan.unit),
                    format_value(arm_row["median"], run.plan.unit),
                    format_percent(claim["estimate"]),
                    f"{format_interval(claim['ci_low'], claim['ci_high'])} ({method_label(claim)}, "
                    f"{format_levels(claim)})",
                    _limit_text(run.plan, claim),
                    "diagnostic"
                    if run.tier.diagnostic
                    else f"**{verdict_shown(run.plan, arm, str(claim['verdict']))}**",
                ]
            )
    lines = ["## Summary", ""]
    for run in runs:
        line = what_ran(run.plan)
        if line:
            lines += [(f"Run {run.number}: " if several else "") + line, ""]
    if rows:
        lines += [markdown_table(columns, rows, ("r" if several else "") + "llrrrrrll"), ""]
        lines.append(
            "Reduction = (baseline − arm) / baseline per pair, higher is faster; the figure is the median "
            "over the pairs. Interval: its primary interval, stated level and the level it attains (for the "
            "stopping rule, the whole rule's least simulated coverage). Each run's section gives the checks "
            "beside it."
        )
    elif any(r.tier.paired for r in runs):
        lines.append("No complete pair in any run: no claim can be made.")
    for run in (r for r in runs if not r.tier.paired):
        claim = run.tier.claim(run)
        if claim:
            lines += ([""] if len(lines) > 2 else []) + [
                f"{f'Run {run.number} ({run.plan.tier}): ' if several else ''}{claim.strip()}"
            ]
    for run in runs:
        side = _side_by_side(run)
        if side:
            lines += ["", (f"Run {run.number}: " if several else "") + side]
        elif several and run.kind == "A/A control":
            lines += [
                "",
                f"Run {run.number} is an A/A control. {_control_text(run)} Read the other runs' "
                "reductions against it.",
            ]
        elif several and run.kind == "claim + A/A control" and run.summaries.claims.empty:
            lines += [
                "",
                f"Run {run.number} (claim + A/A control) has no complete pair yet: neither its claim nor "
                "its noise floor.",
            ]
    for run in runs:
        for other, text in run.tier.bounds(run, [r for r in runs if r is not run]):
            lines += ["", f"Run {run.number}: bounded by run {other.number} ({other.plan.tier}): {text}"]
    caveat_lines = [
        f"- {f'run {run.number}: ' if several else ''}{caveat.headline}"
        for run in runs
        for caveat in caveats(run)
    ]
    if caveat_lines:
        lines += ["", "Caveats (details in each run's section):", ""] + caveat_lines
    return lines


def _pairs_text(run: LoadedRun, claim: pd.Series) -> str:
    """``6 of 6``, with pairs left out (both arms failed) said."""
    text = f"{int(claim['pairs'])} of {_planned_text(run.plan)}"
    if int(claim["both_failed"]):
        text += f" (+{int(claim['both_failed'])} both failed, left out)"
    return text


def _limit_text(plan: Plan, claim: pd.Series) -> str:
    """A claim's bar or an A/A arm's ±tolerance, as the tables show it."""
    if is_missing(claim["bar"]):
        return "none"
    value = 100 * float(claim["bar"])
    return f"±{value:g}%" if claim["kind"] == "control" else f"{value:g}%"


def _side_by_side(run: LoadedRun) -> str:
    """A claim and its A/A control measured in one run, in one sentence (empty when the run has not both)."""
    claims = _sorted(run.summaries.claims, run)
    if claims.empty or not (claims["kind"] == "control").any() or not (claims["kind"] == "claim").any():
        return ""
    parts = []
    for case in dict.fromkeys(claims["case"]):
        mine = claims[claims["case"] == case]
        text = "; ".join(
            f"{c['arm']} {format_percent(c['estimate'])} {format_interval(c['ci_low'], c['ci_high'])} "
            f"({'A/A control, ' if c['kind'] == 'control' else ''}{c['verdict']})"
            for _, c in mine.iterrows()
        )
        parts.append((f"case {code(case)}: " if len(run.plan.cases) > 1 else "") + text)
    return (
        "The claim and its noise floor come from one schedule (same machine, day and conditions): "
        + "; ".join(parts)
        + ". A claim is worth no more than the control beside it allows."
    )


def _level(runs: list[LoadedRun]) -> str:
    """The primary interval's description for the protocol text."""
    for run in runs:
        claims = run.summaries.claims
        if not claims.empty:
            claim = claims.iloc[0]
            return f"{100 * float(claim['ci_level']):.0f}% {method_label(claim)} interval"
    return "calibrated t interval"


def _describe_arms(plan: Plan) -> str:
    seen: dict[str, Any] = {}
    for case in plan.cases:
        for arm in case.arms:
            seen.setdefault(arm.label, arm)
    parts = []
    for arm in seen.values():
        params = ", ".join(f"{k}={json.dumps(v)}" for k, v in arm.params.items())
        parts.append(
            f"{code(arm.label)} ({arm.role}, spec {code(arm.spec)}" + (f", {params})" if params else ")")
        )
    return "; ".join(parts)


def _describe_cases(plan: Plan) -> str:
    parts = []
    for case in plan.cases:
        params = ", ".join(f"{k}={json.dumps(v)}" for k, v in case.params.items())
        parts.append(code(case.label) + (f" ({params})" if params else ""))
    return ", ".join(parts)


def _log_span(trials: pd.DataFrame) -> str | None:
    if trials.empty or "started" not in trials:
        return None
    starts = [
        (_dt.datetime.fromisoformat(str(s)), float(d))
        for s, d in zip(trials["started"], trials["trial_seconds"], strict=True)
        if not is_missing(s) and not is_missing(d)
    ]
    if not starts:
        return None
    first = min(s for s, _ in starts)
    last = max(s + _dt.timedelta(seconds=d) for s, d in starts)
    seconds = (last - first).total_seconds()
    duration = f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
    return (
        f"The first trial started {when(first.isoformat())} and the last ended {when(last.isoformat())} "
        f"({duration})."
    )


def _round_orders(plan: Plan) -> str:
    """The round orders of the first case's measured schedule, as run: ``AB, BA, AB, …``."""
    if not plan.cases:
        return ""
    first = plan.cases[0].label
    orders: list[str] = []
    seen: set[int] = set()
    for t in plan.schedule:
        if t.case == first and t.phase == "measured" and t.round not in seen:
            seen.add(t.round)
            orders.append(t.order)
    shown = orders[:6]
    return ", ".join(shown) + (", …" if len(orders) > len(shown) else "")


def _protocol(run: LoadedRun) -> list[str]:
    plan = run.plan
    p = plan.protocol
    arms_per_case = max(len(c.arms) for c in plan.cases) if plan.cases else 2
    unit_word = (
        ("pair" if p.pairs == 1 else "pairs")
        if arms_per_case == 2
        else f"rounds (each of the {arms_per_case} arms once per round)"
    )
    orders = _round_orders(plan)
    order = {
        "alternate": f"counterbalanced order ({orders}): every arm runs in every slot equally often per block, "
        "so slow drift favours no arm",
        "abba": f"ABBA blocks ({orders}): each block of rounds is followed by its mirror image, so an order "
        "effect is orthogonal to a linear drift over every block",
        "duet": f"duet rounds ({orders}): a round's arms run at once, each on its own share of the worker cores, "
        "the shares taken in turn; "
        + (
            "the arm that ends first runs discarded fillers until its partner ends, so both run under the same "
            "load: the estimand is the ratio of their times when they share the machine"
            if plan.format >= DUET_FILLER_FORMAT
            else "the arm that ended first left its partner to finish alone, which favours the slower arm"
        ),
    }.get(p.order, f"an order shuffled within each round by a generator seeded with {p.seed} ({orders})")
    budget = (
        f"{format_bytes(p.budget)} (device memory capped through the per-process memory fraction)"
        if p.budget is not None
        else "none"
    )
    count = (
        f"rounds chosen by the stopping rule (`--pairs auto`: looks at {list(_looks(plan))} pairs)"
        if p.auto
        else f"{p.pairs} {unit_word}"
    )
    first_warmups = (
        f"warm-up trials until one is at most {p.warmup_tolerance:g}% faster than its arm's previous (log ratio; "
        f"`--warmup auto`, at most {p.max_warmup}, then the run goes on unsettled)"
        if p.auto_warmup
        else _plural(p.warmup, "warm-up trial")
    )
    design = [
        f"Arms: {_describe_arms(plan)}.",
        f"Cases: {_describe_cases(plan)}.",
        f"Per case, first {first_warmups} (cycling through the arms; kept in the log as "
        f"`phase=warmup`, discarded from every statistic), then {count}, in {order}.",
        (
            f"After a resume, or an idle gap of more than {IDLE_GAP_SECONDS:g} s since the last trial ended, "
            "warm-ups by the same rule run before the next measured trial, cycling from its arm (`phase=warmup` "
            "rows outside the schedule); a resume inside a warm-up sequence continues it; a `--stop-after` "
            "deadline stops only between pairs or between warm-ups."
            if p.auto_warmup
            else f"After a resume, or an idle gap of more than {IDLE_GAP_SECONDS:g} s since the last trial ended, one "
            "untimed warm-up of the next arm runs before the next measured trial (a `phase=warmup` row outside "
            "the schedule); a `--stop-after` deadline stops only between pairs."
            if plan.format >= WHOLE_PAIRS_FORMAT
            else "This run predates whole-pair stops and warm-ups after a resume: a `--stop-after` slice or a "
            "resume could fall between the two trials of a pair, with no warm-up after it."
        ),
        f"Isolation: {plan.isolation or NOT_RECORDED}.",
        f"Timed region: {plan.timed_region or 'not stated by the tier'}.",
        f"Device: {code(p.device)}; memory budget: {budget}; seed {p.seed} (shared by the arms of a pair "
        "for their data" + (", and the order)." if p.order == "random" else ")."),
    ]
    if plan.settings:
        options = ", ".join(f"{k}={json.dumps(v, sort_keys=True)}" for k, v in plan.settings.items())
        design.append(f"Tier options: {code(options)}.")
    statistics = [
        f"Primary figure: {plan.metric} in {plan.unit}, lower is better; a failed trial counts as infinitely slow, "
        "never dropped, and a pair where both arms failed is left out and counted. Per pair, the reduction "
        "(baseline − arm) / baseline and the log ratio ln(arm / baseline).",
        "Per claim the estimate is the median reduction, a failure ranked slowest. Its interval is a pair of "
        "order statistics interpolated to the stated 95%; where even the range falls short it is the range at "
        "its exact level (93.75% at 5 pairs). Simulated on normal, skewed, heavy-tailed, outlier and drift "
        "laws, it covers within 1.5 points of the level stated; from 5 pairs it decides, below that it is "
        "`insufficient`. Beside it: the geometric-mean reduction with the t interval "
        f"({gm_interval.describe()}), the exact sign-test interval and "
        "Hodges-Lehmann with its Wilcoxon interval. The failure rate of each arm has its own interval.",
        _verdict_rule(plan),
    ]
    if p.auto:
        statistics.append(_stopping_text(plan))
    log = []
    resumes = run.env.get("resumes") or []
    trials = run.summaries.trials
    if resumes:
        # A log that repeats a trial is refused when it is read (harness.validation.check_log).
        log.append(
            f"The run was resumed {_plural(len(resumes), 'time')}; "
            "the log holds each scheduled trial at most once (none re-run)."
        )
    sequences = warmup_sequence_text(plan, trials)
    if sequences:
        log.append(f"Warm-up sequences (`--warmup auto`), warm-ups each: {sequences}.")
    extra = extra_warmups(trials)
    if len(extra) and not p.auto_warmup:
        reasons = ", ".join(
            f"{k} ({n})" for k, n in extra["warmup_reason"].astype(str).value_counts().items()
        )
        log.append(f"{_plural(len(extra), 'extra warm-up')} ran outside the schedule: {reasons}.")
    span = _log_span(trials)
    if span:
        log.append(span)
    lines = ["### Protocol", "", " ".join(design), "", " ".join(statistics)]
    return lines + (["", " ".join(log)] if log else [])


def _looks(plan: Plan) -> tuple[int, ...]:
    from harness.sequential import looks

    return looks(plan.protocol.first_look, plan.protocol.max_pairs)


def _verdict_rule(plan: Plan) -> str:
    """How the verdicts read the interval, for a claim's bar and an A/A arm's tolerance."""
    settings = ClaimSettings.from_protocol(plan.protocol)
    parts = []
    if settings.bar_percent is not None:
        parts.append(
            f"a claim against {format_limit(settings.bar_percent, False)} `clears` when the whole interval lies "
            "above it, `fails` when it lies wholly below, `ambiguous` when it straddles or touches it"
        )
    if settings.tolerance_percent is not None:
        parts.append(
            f"an A/A arm against {format_limit(settings.tolerance_percent, True)} is `within` when the whole "
            "interval lies strictly inside it, `outside` when wholly beyond it, `ambiguous` otherwise"
        )
    if not parts:
        return "No bar was set, so there is no verdict."
    return (
        "Verdicts: " + "; ".join(parts) + "; `insufficient` when the interval does not keep its stated level."
    )


def _stopping_text(plan: Plan) -> str:
    """The stopping rule as it ran: the rule, its looks and each look's decision."""
    from harness.sequential import look_level

    p = plan.protocol
    levels, worst, best = look_level(0.95, _looks(plan))
    text = (
        f"Stopping rule (`--pairs auto --precision {p.precision:g}`): at pre-set looks {list(_looks(plan))} "
        f"the median's interval at that look's level ({', '.join(f'{v:.2%}' for v in levels)}) is "
        f"compared with the target half-width of {p.precision:g} points; the run stops when every claim's is "
        f"within it (A/A controls do not hold a claim's stop), at the last look ({p.max_pairs} pairs)"
        + (f", or when {p.time_budget:g} s of trials are spent" if p.time_budget is not None else "")
        + f". Simulated over normal, skewed, heavy-tailed, outlier and drift laws, the interval it stops "
        f"with covers {worst:.1%} to {best:.1%}."
    )
    decisions = [
        f"{d['rounds']} pairs" + (f" ({d['case']})" if len(plan.cases) > 1 else "") + f": {d['reason']}"
        for d in plan.looks
    ]
    if decisions:
        text += " Looks taken: " + "; ".join(decisions) + "."
    return text


def _results(run: LoadedRun) -> list[str]:
    plan, summaries = run.plan, run.summaries
    arms = _sorted(summaries.arms, run)
    trials = summaries.trials
    has_peaks = (
        {
            column: column in trials
            and pd.to_numeric(finished(trials)[column], errors="coerce").notna().any()
            for column in ("peak_allocated", "peak_reserved")
        }
        if not trials.empty
        else {"peak_allocated": False, "peak_reserved": False}
    )
    lines = ["### Results", ""]
    if arms.empty:
        return lines + ["No measured trial in the log: nothing to report yet."]
    columns = [
        "case",
        "arm",
        "role",
        "measured trials",
        "failed",
        f"median ({plan.unit})",
        f"min–max ({plan.unit})",
    ]
    columns += [f"peak {c.split('_')[1]} (median)" for c, present in has_peaks.items() if present]
    rows = []
    for _, arm in arms.iterrows():
        row = [
            arm["case"],
            arm["arm"],
            arm["role"],
            int(arm["trials"]),
            int(arm["failed"]),
            format_number(arm["median"]),
            format_range(arm["min"], arm["max"]),
        ]
        row += [
            format_bytes(peak_median(trials, str(arm["case"]), str(arm["arm"]), c))
            for c, present in has_peaks.items()
            if present
        ]
        rows.append(row)
    lines += [f"Per arm, measured trials only ({plan.metric}; failed trials count as infinitely slow):", ""]
    lines += [markdown_table(columns, rows, "lllrrrr" + "r" * sum(has_peaks.values())), ""]
    claims = _sorted(summaries.claims, run)
    if claims.empty:
        return lines + ["No complete pair: no paired reduction yet."]
    rows = [
        [
            c["case"],
            f"{c['arm']} vs {c['baseline_arm']}",
            _pairs_text(run, c),
            format_percent(c["estimate"]),
            format_interval(c["ci_low"], c["ci_high"]),
            f"{method_label(c)}: {format_levels(c)}"
            + ("" if is_missing(c["ci_nominal"]) else f", nominal {100 * float(c['ci_nominal']):.2f}%"),
            _limit_text(plan, c),
            f"**{verdict_shown(plan, str(c['arm']), str(c['verdict']))}**",
        ]
        for _, c in claims.iterrows()
    ]
    lines += ["Paired reductions (higher is faster), the primary figure and interval:", ""]
    lines += [
        markdown_table(
            [
                "case",
                "arm vs baseline",
                "pairs",
                "median reduction",
                "interval",
                "method: levels",
                "bar",
                "verdict",
            ],
            rows,
            "lllrrlll",
        ),
        "",
    ]
    checks = [
        [
            c["case"],
            f"{c['arm']} vs {c['baseline_arm']}",
            f"{format_percent(c['median'])} ({format_percent_range(c['min'], c['max'])})",
            f"{format_interval(c['sign_low'], c['sign_high'])}, {_attained(c['sign_attained'])}",
            c["sign_verdict"],
            f"{format_percent(c['hl_estimate'])} {format_interval(c['hl_low'], c['hl_high'])}, "
            f"{_attained(c['hl_attained'])}",
            c["hl_verdict"],
        ]
        for _, c in claims.iterrows()
    ]
    lines += ["Distribution-free checks beside it:", ""]
    lines += [
        markdown_table(
            [
                "case",
                "arm vs baseline",
                "median reduction (min–max)",
                "sign-test interval of the median",
                "sign verdict",
                "Hodges-Lehmann, Wilcoxon interval",
                "HL verdict",
            ],
            checks,
            "llrrlrl",
        ),
        "",
    ]
    methods = dict.fromkeys(str(c["ci_method"]) for _, c in claims.iterrows())
    lines.append("Primary method: " + "; ".join(methods) + ".")
    lines.append(
        "Checks: the sign test takes order statistics of the log ratios (exact for any continuous law, at "
        "the level binomial(n, 1/2) gives); Hodges-Lehmann is the median of the Walsh averages with its "
        "Wilcoxon signed-rank interval (exact for a symmetric law)."
    )
    for _, c in claims.iterrows():
        case, arm = str(c["case"]), str(c["arm"])
        where = f"case {code(case)}, " if len(plan.cases) > 1 else ""
        kind = "Diagnostic, not a claim" if run.tier.diagnostic else "Claim"
        lines += [
            "",
            f"**{kind} ({where}{arm} vs {c['baseline_arm']}).** {claim_sentence(plan, summaries, case, arm)}",
        ]
    return lines


def _attained(level: Any) -> str:
    return "n/a" if is_missing(level) else f"{100 * float(level):.1f}% attained"


def _verdict(run: LoadedRun) -> list[str]:
    plan = run.plan
    claims = _sorted(run.summaries.claims, run)
    lines = ["### Verdict", ""]
    if claims.empty:
        return lines + ["No complete pair: no verdict."]
    if run.tier.diagnostic:
        return lines + ["A diagnostic run (synchronized inside the timed region): no verdict."]
    for _, c in claims.iterrows():
        interval = (
            f"the {100 * float(c['ci_level']):.0f}% {method_label(c)} interval "
            f"{format_interval(c['ci_low'], c['ci_high'])}"
        )
        verdict = verdict_shown(plan, str(c["arm"]), str(c["verdict"]))
        control = c["kind"] == "control"
        limit = "no bar" if is_missing(c["bar"]) else format_limit(100 * float(c["bar"]), control)
        explanation = {
            "clears": f"{interval} lies wholly above {limit}",
            "fails": f"{interval} lies wholly below {limit}",
            "within": f"{interval} lies inside {limit}: the noise floor is within it",
            "outside": f"{interval} lies wholly beyond {limit}: the arms differ by more than it",
            "ambiguous": f"{interval} straddles {limit}: more pairs or less noise are needed to decide",
            "insufficient": f"{interval} does not keep its stated level: {c['ci_reason']}",
            "faster": f"{interval} lies wholly above 0 (no bar was set)",
            "slower": f"{interval} lies wholly below 0 (no bar was set)",
            "no difference detected": f"{interval} holds 0 (no bar was set)",
            "no bar": f"no bar was set (`--bar`); {interval} is shown for reference",
            "no tolerance": f"no tolerance was set (`--tolerance`); {interval} is shown for reference",
            "no pairs": "no complete pair",
            WITHHELD: f"{c['arm']} ran the baseline's code ({same_code_arms(plan).get(str(c['arm']))}), so "
            f"{interval} measures noise, not a speed-up",
        }.get(verdict, interval)
        where = f"case {code(c['case'])}, " if len(plan.cases) > 1 else ""
        kind = " (A/A control)" if control and len(claims) > 1 else ""
        line = f"- {where}{c['arm']} vs {c['baseline_arm']}{kind}: **{verdict}** — {explanation}."
        if str(c["verdict_basis"]).startswith("sign"):
            line += f" The verdict reads the {c['verdict_basis']}."
        disagree = [] if verdict == WITHHELD else disagreeing_checks(c)
        if disagree:
            line += (
                " The checks disagree: "
                + "; ".join(
                    f"{name} says {c[f'{prefix}_verdict']} ({format_interval(c[f'{prefix}_low'], c[f'{prefix}_high'])}, "
                    f"{_attained(c[f'{prefix}_attained'])})"
                    for name, prefix in disagree
                )
                + "."
            )
        lines.append(line)
    if plan.protocol.control and not (claims["kind"] == "claim").any():
        lines += ["", "This run is an A/A control: its verdict is about the noise floor, not a speed-up."]
    return lines


def _diagnostics(run: LoadedRun) -> list[str]:
    """Design diagnostics per claim: the order balance, the order effect and the drift over the schedule."""
    claims = _sorted(run.summaries.claims, run)
    if claims.empty:
        return []
    rows = [
        [
            c["case"],
            f"{c['arm']} vs {c['baseline_arm']}",
            f"{int(c['arm_second'])} / {int(c['arm_first'])}"
            + (" (balanced)" if c["arm_second"] == c["arm_first"] else " (**unbalanced**)"),
            _diagnostic_text(c, "order"),
            _diagnostic_text(c, "drift"),
        ]
        for _, c in claims.iterrows()
    ]
    return [
        "### Design diagnostics",
        "",
        markdown_table(
            ["case", "arm vs baseline", "arm second / first", "order effect", "drift"], rows, "lllll"
        ),
        "",
        "Order effect: the mean log ratio of the pairs where the arm ran second minus that where it ran first, as "
        "a percent change of the ratio, with a pooled two-sample t interval (95%); an unbalanced count leaves "
        "that much of it in the estimate. Drift: the least-squares slope of log(figure) over the measured "
        "schedule's trial index with one level per arm, and per slice where the run was resumed (a resume "
        "may run on another machine: a step between slices is not a trend), in percent per trial, with its "
        "t interval (95%). Both are diagnostics, estimated rather than assumed away; neither adjusts the claim.",
    ]


def _stability(run: LoadedRun) -> list[str]:
    """Instability flags: per-arm spread and the machine's load (and steal, where the trials carry it)."""
    flags = instability_flags(run.summaries.trials, run.env)
    lines = ["### Stability", ""]
    load, cores = run.env.get("load1_start"), run.env.get("cpu_logical")
    machine = (
        f"1-minute load {float(load):.2f} on {cores} logical cores at the run's start"
        if load is not None and cores
        else "the load at the run's start was not recorded"
    )
    if not flags:
        return lines + [
            f"No flag: every arm's max/min is within 1.5 and its MAD/median within 10%; {machine}."
        ]
    lines += [f"- **{flag.reason}**" for flag in flags]
    return lines + [
        "",
        f"Thresholds: max/min above 1.5 or MAD/median above 10% per arm (beyond the house's measured noise), "
        f"a 1-minute load above the cores, CPU steal above "
        f"{telemetry.STEAL_FLAG_SHARE:.0%} of the CPU time a trial wanted; {machine}. Flagged trials are kept in every "
        "figure.",
    ]


def _planning(run: LoadedRun) -> list[str]:
    """Pairs and time each claim needs at this run's measured per-pair spread."""
    if run.summaries.claims.empty or run.tier.diagnostic:
        return []
    rows = []
    for r in plan_rows(run.plan.protocol, run.summaries):
        spread = "n/a" if is_missing(r["sigma"]) else f"{100 * r['sigma']:.2f}% ({r['sigma_pairs']} pairs)"
        if r["pairs"] is None:
            rows.append([f"{r['arm']} vs {r['baseline_arm']}", spread, r["note"], "", ""])
            continue
        seconds = "n/a" if is_missing(r["seconds"]) else _duration(float(r["seconds"]))
        rows.append(
            [
                f"{r['arm']} vs {r['baseline_arm']}" + (f" ({r['case']})" if len(run.plan.cases) > 1 else ""),
                spread,
                r["goal"],
                f"{r['pairs']} ({r['pairs_for_goal']} for the goal, {100 * r['probability']:.0f}% likely; "
                f"{r['pairs_upper']} at σ's upper bound)",
                seconds,
            ]
        )
    return [
        "### Planning",
        "",
        markdown_table(
            ["claim", "per-pair σ of the log ratio", "goal", "pairs to run", "time"], rows, "lrlrr"
        ),
        "",
        "From this run's per-pair spread (normal log ratios, simulated): the fewest pairs whose primary "
        "interval meets the goal with 80% probability, the effect against 0, raised to an even count; beside "
        "it, the pairs at σ's one-sided 95% upper bound. Time from each arm's median trial (a duet pair: the "
        "slower arm's). For another goal: "
        f"`bench plan {run.name} --effect 3%` (or `--tolerance 1%` for an A/A arm).",
    ]


def _duration(seconds: float) -> str:
    return (
        f"{seconds:.0f} s"
        if seconds < 120
        else f"{seconds / 60:.1f} min"
        if seconds < 7200
        else f"{seconds / 3600:.1f} h"
    )


OOM_FIELDS = ("requested", "total", "free", "allocated", "reserved", "budget")
TELEMETRY_FIGURES = (  # (column, what it is) plotted against each trial's figure, where the log has them
    ("cpu_busy_share", "machine CPU busy share"),
    ("cpu_steal_share", "machine CPU steal share"),
    ("load1_start", "1-minute load at the start"),
    ("worker_involuntary_switches", "involuntary context switches"),
    ("gpu0_sm_clock_mhz_end", "GPU 0 SM clock at the end (MHz)"),
    ("gpu0_temperature_c_end", "GPU 0 temperature at the end (°C)"),
)


def _failures(run: LoadedRun) -> list[str]:
    trials = run.summaries.trials
    lines = ["### Failed trials", ""]
    failed = trials[trials["status"] != "ok"] if not trials.empty else trials
    if failed.empty:
        return lines + ["None: every logged trial finished."]
    lines.append(f"{_plural(len(failed), 'failed trial')}; measured ones count as infinitely slow.")
    oom = failed[failed["status"] == "resource_failure"]
    if len(oom):
        rows = [
            [int(r["index"]), r["case"], r["phase"], int(r["round"]), r["arm"]]
            + [format_bytes(r.get(f"oom_{k}")) for k in OOM_FIELDS]
            for _, r in oom.iterrows()
        ]
        lines += [
            "",
            "Out of memory (`resource_failure`), with the byte figures parsed from the error:",
            "",
            markdown_table(["trial", "case", "phase", "round", "arm", *OOM_FIELDS], rows, "rllrl" + "r" * 6),
        ]
    other = failed[failed["status"] != "resource_failure"]
    if len(other):
        lines += ["", "Other failures, with their messages:", ""]
        lines += [
            f"- trial {int(r['index'])} ({r['case']}, {r['phase']} round {int(r['round'])}, {r['arm']}, "
            f"`{r['status']}`): {code(r['message'] or 'no message')}"
            for _, r in other.iterrows()
        ]
    return lines


def _telemetry(run: LoadedRun) -> list[str]:
    """What the machine did during each trial: the placement, the flagged trials (kept, never dropped), and a
    plot of each trial's figure against the telemetry that could move it."""
    trials = run.summaries.trials
    if trials.empty or "telemetry_seconds" not in trials:
        return []
    lines = ["### Telemetry", ""]
    placement = run.env.get("placement")
    lines.append(
        "CPU placement: "
        + (
            f"worker on cores {cell(placement.get('worker_cores'))}, parent on {cell(placement.get('parent_cores'))}, "
            f"{placement.get('torch_threads')} torch threads ({placement.get('reason')})."
            if placement
            else "none (as the OS scheduled)."
        )
    )
    flagged = []
    for row in trials.to_dict("records"):
        reasons = telemetry.flags({k: (None if is_missing(v) else v) for k, v in row.items()})
        if reasons:
            flagged.append(
                f"- trial {int(row['index'])} ({row['phase']}, {row['arm']}): " + "; ".join(reasons) + "."
            )
    lines += [
        "",
        f"Flagged trials ({len(flagged)} of {len(trials)}; kept in every figure):"
        if flagged
        else "No trial was flagged (GPU throttling, CPU steal, load above the cores).",
    ]
    if flagged:
        lines += [""] + flagged
    present = [
        (c, label)
        for c, label in TELEMETRY_FIGURES
        if c in trials and pd.to_numeric(trials[c], errors="coerce").notna().any()
    ]
    if present:
        path = plots.plot_telemetry(trials, run.plan, present, run.figures_dir / "telemetry.png")
        lines += [
            "",
            markdown_image(path, f"{run.plan.tier}: each trial's figure against its telemetry"),
            "",
            "Each trial's figure (y) against what was read around it (x): measured trials filled, warm-ups hollow.",
        ]
    return lines


def _caveats(run: LoadedRun) -> list[str]:
    items = caveats(run)
    return ["### Caveats", ""] + (
        [f"- {c}" for c in items] if items else ["None derived from the tier or the data."]
    )


def _plots(run: LoadedRun) -> list[str]:
    plan, summaries = run.plan, run.summaries
    timeline = plots.plot_timeline(summaries.trials, plan, run.figures_dir / "timeline.png")
    lines = [
        "### Plots",
        "",
        markdown_image(timeline, f"{plan.tier}: every trial in schedule order"),
        "",
        "Every trial in schedule order: filled markers are measured trials (colour and shape per arm), the "
        "arm's marker hollow and grey is a warm-up (discarded), a red x along the top is a failed trial, "
        "hatched slots were scheduled but not run.",
    ]
    if summaries.claims.empty:
        return lines + ["", "No complete pair: no reduction plot."]
    reductions = plots.plot_reductions(
        _sorted(summaries.pairs, run),
        _sorted(summaries.claims, run),
        plan,
        run.figures_dir / "reductions.png",
    )
    lines += [
        "",
        markdown_image(reductions, f"{plan.tier}: paired reductions"),
        "",
        "Paired reductions: one point per pair (its arm's marker), the black tick is the median, the thick grey "
        f"line the primary interval ({_level([run])}; an arrowhead where it runs past the axis); a pair far beyond "
        "the rest is drawn at the axis edge with its value"
        + (
            ""
            if plan.protocol.bar is None
            else ", the dashed lines the tolerance"
            if plan.protocol.control
            else ", the dashed line the bar"
        )
        + "; right of zero is faster.",
    ]
    return lines


def _tier_section(run: LoadedRun) -> list[str]:
    """The tier's own section."""
    text = run.tier.section(run)
    return [str(text).strip()] if text and str(text).strip() else []


def _run_section(run: LoadedRun) -> list[str]:
    lines = [f"## {run.title}", "", f"Run folder {code(run.name)}; started {when(run.plan.created)}."]
    parts = (
        _protocol,
        _results,
        _verdict,
        _diagnostics,
        _stability,
        _planning,
        _failures,
        _telemetry,
        _caveats,
        _plots,
        _tier_section,
    )
    if not run.tier.paired:  # a tier whose rows are not paired trials reads them in its own section
        parts = (_tier_section, _failures, _caveats)
    for part in parts:
        body = part(run)
        if body:
            lines += [""] + body
    return lines


# --- the report -------------------------------------------------------------------------------------------


def resolve_output(folders: Sequence[RunFolder], output: Path | None) -> Path:
    """Where the report goes; ``InputError`` (one line) for what cannot be right."""
    if not folders:
        raise InputError("no run folder given; use: bench report RUN_DIR [RUN_DIR …] [-o reports/NAME.md]")
    seen: set[Path] = set()
    for folder in folders:
        key = folder.path.resolve()
        if key in seen:
            raise InputError(f"run folder '{folder.path}' is given twice; name each run folder once")
        seen.add(key)
    if output is None:
        if len(folders) > 1:
            raise InputError(
                f"{len(folders)} run folders make one combined report: name it with -o, e.g. -o reports/NAME.md"
            )
        return folders[0].path / REPORT_NAME
    why = unnameable(output)
    if why:
        raise InputError(f"-o '{output}': {why}; give a file path ending in .md, e.g. reports/NAME.md")
    output = Path(output)
    if output.suffix.lower() != ".md":
        raise InputError(
            f"-o '{output}' is not a markdown file; give a path ending in .md, e.g. reports/NAME.md"
        )
    if output.is_dir():
        raise InputError(
            f"-o '{output}' is a directory; give a file path ending in .md, e.g. reports/NAME.md"
        )
    return output


def _figures_names(output: Path, count: int) -> list[str]:
    """The figures folders' names beside the markdown: ``<stem>-figures``, or ``<stem>-figures-<k>`` each."""
    return [f"{output.stem}-figures" + (f"-{k}" if count > 1 else "") for k in range(1, count + 1)]


def _load(folders: Sequence[RunFolder], output: Path, tiers: TierRegistry, drawn_in: Path) -> list[LoadedRun]:
    """The runs, each to draw its figures in its folder's name under ``drawn_in``."""
    runs = []
    names = _figures_names(output, len(folders))
    for number, (folder, name) in enumerate(zip(folders, names, strict=True), start=1):
        run = Run.load(folder, drawn_in / name, tiers)
        runs.append(LoadedRun(**vars(run), number=number, several=len(folders) > 1, tiers=tiers))
    return runs


def render(runs: list[LoadedRun]) -> str:
    """The markdown of the report (and, as it goes, its PNGs in each run's figures folder, made already)."""
    lines = _title(runs) + [""] + _summary(runs) + [""] + environment_section(runs)
    for run in runs:
        lines += [""] + _run_section(run)
    return "\n".join(lines).rstrip() + "\n"


def write_report(
    folders: list[RunFolder], tiers: TierRegistry | None = None, output: Path | None = None
) -> Path:
    """Write the report of ``folders`` (one, or several side by side) and return the markdown's path.

    One folder: ``<folder>/report.md`` unless ``output`` says otherwise. Several: ``output`` is required
    (``InputError`` otherwise). ``tiers`` reads each run's tier (its section, caveats); an unknown tier gets
    the defaults. Every input is checked before anything is written. The figures are drawn aside, in
    ``<stem>-figures.partial/``, and each folder replaces its older self whole just before the markdown is
    written (through a temporary file and a rename): an interrupted report leaves the older one, figures and
    all, or nothing.
    """
    folders = [RunFolder.open(f.path) for f in folders]
    path = resolve_output(folders, output)
    if output is None:
        check_can_write(path.parent, "run folder", "write the report elsewhere with -o NAME.md")
    else:
        check_can_write(path.parent, "-o")
    staging = staging_folder(path)  # this report's own: two reports of one folder never share it
    runs = _load(folders, path, tiers or TierRegistry(), staging)
    for run in runs:  # a file where the figures go is refused before anything is drawn
        final = path.parent / run.figures_dir.name
        check_can_write(final, "the report's figures folder", "move it, or name the report otherwise with -o")
        _check_only_figures(final)
    remove_stale_staging(path)  # left by a report killed outright
    try:
        for folder in [path.parent, *(run.figures_dir for run in runs)]:
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # a folder that takes no new entries (/proc), found only by trying
                raise RunFolderWriteError(f"could not make {folder}: {exc.strerror or exc}") from None
        try:
            markdown = render(runs)
        except OSError as exc:  # a figure that could not be drawn (a full disk): nothing replaced yet
            raise RunFolderWriteError(
                f"could not draw the report's figures beside {path}: {exc.strerror or exc}; nothing was replaced"
            ) from None
        for run in runs:
            _put_in_place(run.figures_dir, path.parent / run.figures_dir.name, staging)
        return write_atomic(path, markdown)
    finally:
        remove_tree(staging)


def _check_only_figures(folder: Path) -> None:
    """A figures folder the report will replace whole holds nothing but a report's PNGs: ``InputError``
    otherwise (a run folder, or a folder holding one, that the name lands on is never replaced)."""
    if not folder.is_dir():
        return
    other = next((p for p in folder.iterdir() if not (p.is_file() and p.suffix == ".png")), None)
    if other is not None:
        raise InputError(
            f"the report's figures folder '{folder}' holds '{other.name}', not only a report's figures, and a "
            "report replaces that folder whole; move it, or name the report otherwise with -o"
        )


def _put_in_place(drawn: Path, final: Path, staging: Path) -> None:
    """``drawn`` renamed to ``final``; an older ``final`` is moved into ``staging`` first (removed with it)."""
    try:
        if final.exists():
            final.rename(staging / f"{final.name}.older")
        drawn.rename(final)
    except OSError as exc:
        raise RunFolderWriteError(f"could not put the figures in {final}: {exc.strerror or exc}") from None
