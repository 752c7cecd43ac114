"""The caveats of a run, derived from its tier and its data, most important first, each with a reason code."""

from __future__ import annotations

from typing import Any

from harness.codepaths import all_same_code, same_code_arms
from harness.formatting import (
    code,
    format_interval,
    format_levels,
    format_percent,
    format_percent_range,
    method_label,
)
from harness.instability import run_flags as instability_flags
from harness.present.model import Section
from harness.present.run_view import (
    LoadedRun,
    check_text,
    completed_pairs,
    diagnostic_text,
    plan_ordered,
    plural,
    scheduled_logged,
    sentence,
)
from harness.report_env import resumed_at_other_code, resumed_elsewhere
from harness.stats import disagreeing_checks
from harness.tier import Caveat
from harness.warmup import warmup_sequences

SPANS = (
    "Each pair ran within one slice, so its ratio is of one {what}; the environment table names each slice's."
)
TEXTS = {  # code: (headline, detail), templates filled from the run's values (a claim's columns, for a claim)
    "same-code": (
        "{kind}: {arms} ran the baseline's code on {device}; {whose} withheld.",
        "{reasons}. Name an arm that runs other code there (on the CPU, candidate-cpu takes the batched path).",
    ),
    "spans-machines": (
        "spans machines: resume {k} ran on another machine ({machine}).",
        SPANS.format(what="machine") + " The arms' medians and the spread mix machines.",
    ),
    "spans-revisions": (
        "spans code revisions: resume {k} ran {revision}, the run started at {start}.",
        SPANS.format(what="revision") + " Where the arms' code changed, the medians and the claim mix them.",
    ),
    "control": ("A/A control: it measures the noise floor, not a speed-up.", "{text}"),
    "interrupted": (
        "interrupted: {done} of {planned} pairs.",
        "{logged} of {scheduled} scheduled trials are in the log. `--resume` with this run folder continues it.",
    ),
    "failures": (
        "failures: {trials} failed and {count} as infinitely slow.",
        "A pair whose arm failed has reduction -∞ (whose baseline failed, +100%). No failure is dropped.",
    ),
    "warmup-failures": ("{trials} failed.", "Warm-ups are discarded from the statistics anyway."),
    "warmups-unsettled": (
        "warm-ups never settled in {sequences}: {which}.",
        "Every warm-up was over {tolerance:g}% faster than its arm's previous before the cap of {cap}: the "
        "measured trials after them may still be warming.",
    ),
    "cpu": ("device cpu: timings on the CPU say nothing about speed on a GPU.", ""),
    "uncommitted": (
        "uncommitted changes: the code differed from its git revision.",
        "The working tree had changes against {revision} when the run started.",
    ),
    "insufficient": (
        "insufficient: {label}'s {method} interval does not keep the stated {ci_level:.0%} with {pairs:.0f} pairs.",
        "{reason}",
    ),
    "both-failed": (
        "{left_out} of {label} left out: both arms failed.",
        "It is counted here and in `claim_diagnostics.csv` (`both_failed`), never taken as a reduction of 0.",
    ),
    "odd-pairs": (
        "odd pairs: {label} ran second in {arm_second:.0f} pairs and first in {arm_first:.0f}, unbalanced.",
        "An order effect is not averaged out of the estimate; the diagnostics give its estimate ({order}).",
    ),
    "checks-disagree": (
        "checks disagree: for {label} the primary says {verdict}, {checks}.",
        "{intervals}; see the verdict section.",
    ),
    "unstable": ("unstable: {head}.", "Flagged trials are kept in every figure; read them with care."),
    "no-bar": ("no bar set (`--bar`): the claims say only whether an arm is faster at all.", ""),
}
ONE_FOR_MANY = {  # the caveat that lists a kind's claims where more than three have it
    "insufficient": "insufficient: {n} claims' intervals do not keep their stated level.",
    "both-failed": "pairs left out in {n} claims: both arms failed.",
    "odd-pairs": "odd pairs: {n} claims ran their arm second and first unequally often.",
    "checks-disagree": "checks disagree with the primary verdict in {n} claims.",
}


def _caveat(kind: str, /, **values: Any) -> Caveat:
    headline, detail = TEXTS[kind]
    return Caveat(headline.format(**values), detail.format(**values), code=kind)


def caveats(run: LoadedRun) -> list[Caveat]:
    """Caveats derived from the tier and the data, most important first."""
    plan, trials, p = run.plan, run.summaries.trials, run.plan.protocol
    out: list[Caveat] = []
    same = same_code_arms(plan)
    if same:
        kind = "an A/A in effect" if all_same_code(plan) else "partly an A/A in effect"
        whose = "its verdict is" if len(same) == 1 else "their verdicts are"
        reasons = "; ".join(f"{label}: {reason}" for label, reason in same.items())
        arms = ", ".join(same)
        out.append(_caveat("same-code", kind=kind, arms=arms, device=p.device, whose=whose, reasons=reasons))
    out += run.tier.caveats(run)
    out += [_caveat("spans-machines", k=k, machine=m) for k, m in resumed_elsewhere(run.env)]
    start = code(run.env.get("git_revision"))
    out += [
        _caveat("spans-revisions", k=k, revision=code(r), start=start)
        for k, r in resumed_at_other_code(run.env)
    ]
    if p.control:
        out.append(_caveat("control", text=control_text(run)))
    if scheduled_logged(plan, trials) < len(plan.schedule):  # interrupted
        rounds = {(t.case, t.round) for t in plan.schedule if t.phase == "measured"}
        done, logged = completed_pairs(plan, trials), scheduled_logged(plan, trials)
        out.append(
            _caveat(
                "interrupted", done=done, planned=len(rounds), logged=logged, scheduled=len(plan.schedule)
            )
        )
    failed = trials if trials.empty else trials[trials["status"] != "ok"]
    counts = failed["phase"].value_counts() if len(failed) else {}
    measured, warmups = int(counts.get("measured", 0)), int(counts.get("warmup", 0))
    if measured:
        count = "counts" if measured == 1 else "count"
        out.append(_caveat("failures", trials=plural(measured, "measured trial"), count=count))
    if warmups:
        out.append(_caveat("warmup-failures", trials=plural(warmups, "warm-up trial")))
    unsettled = [
        w for w in warmup_sequences([] if trials.empty else trials.to_dict("records"), p) if w.capped
    ]
    if unsettled:
        which = ", ".join(f"{w.reason} ({w.warmups} warm-ups)" for w in unsettled)
        sequences, tolerance = plural(len(unsettled), "sequence"), p.warmup_tolerance
        out.append(
            _caveat(
                "warmups-unsettled", sequences=sequences, which=which, tolerance=tolerance, cap=p.max_warmup
            )
        )
    if p.device == "cpu" and run.tier.paired:
        out.append(_caveat("cpu"))
    if run.env.get("git_dirty") is True:
        out.append(_caveat("uncommitted", revision=start))
    if not run.tier.paired:  # pairs, intervals and bars mean nothing to it
        return out
    flags = instability_flags(trials, run.env)
    heads = (
        [f.reason for f in flags]
        if len(flags) <= 3
        else [f"{len(flags)} flags (the stability section lists them)"]
    )
    out += _claim_caveats(run) + [_caveat("unstable", head=head) for head in heads]
    return out + ([_caveat("no-bar")] if p.bar is None and not p.control else [])


def _claim_caveats(run: LoadedRun) -> list[Caveat]:
    """One caveat per claim and kind; beyond three claims of a kind, one that lists them."""
    found: dict[str, list[Caveat]] = {kind: [] for kind in ONE_FOR_MANY}
    for _, c in plan_ordered(run.summaries.claims, run).iterrows():
        disagree = disagreeing_checks(c)
        values = {
            **c,
            "label": f"{c['arm']} vs {c['baseline_arm']}"
            + (f" ({c['case']})" if len(run.plan.cases) > 1 else ""),
            "method": method_label(c),
            "reason": sentence(str(c["ci_reason"])) if c["ci_reason"] else "",
            "left_out": plural(int(c["both_failed"]), "pair"),
            "order": diagnostic_text(c, "order"),
            "checks": ", ".join(f"{name} {c[f'{prefix}_verdict']}" for name, prefix in disagree),
            "intervals": "; ".join(f"{name}: {check_text(c, prefix)}" for name, prefix in disagree),
        }
        present = {
            "insufficient": not c["ci_sufficient"],
            "both-failed": int(c["both_failed"]),
            "odd-pairs": c["arm_second"] != c["arm_first"],
            "checks-disagree": disagree,
        }
        for kind in (kind for kind, there in present.items() if there):
            found[kind].append(_caveat(kind, **values))
    out = []
    for kind, items in found.items():
        many = Caveat(ONE_FOR_MANY[kind].format(n=len(items)), " ".join(c.headline for c in items), kind)
        out += items if len(items) <= 3 else [many]
    return out


def control_text(run: LoadedRun) -> str:
    """What an A/A control is, with its figure where it has one."""
    text = (
        "The first arm ran against itself through the same machinery, so its reductions are this machine's "
        "noise floor"
    )
    claims = run.summaries.claims
    controls = claims[claims["kind"] == "control"] if not claims.empty else claims
    parts = [
        f"{format_percent(c['estimate'])} (median; {method_label(c)} interval "
        f"{format_interval(c['ci_low'], c['ci_high'])}, {format_levels(c)}; "
        f"geometric mean {format_percent(c['gm_estimate'])}, range {format_percent_range(c['min'], c['max'])})"
        + (f" in case {code(c['case'])}" if len(run.plan.cases) > 1 else "")
        for _, c in plan_ordered(controls, run).iterrows()
    ]
    return text + (": difference " + "; ".join(parts) if parts else "") + "."


def caveats_section(run: LoadedRun) -> Section:
    items = "\n".join(f"- {c}" for c in caveats(run))
    return Section("Caveats").add(items or "None derived from the tier or the data.")
