"""The caveats of a run, derived from its tier and its data, most important first, each with a reason code."""

from __future__ import annotations

from harness.codepaths import all_same_code, same_code_arms
from harness.formatting import (
    format_interval,
    format_levels,
    format_percent,
    format_percent_range,
    method_label,
)
from harness.instability import run_flags as instability_flags
from harness.markdown import code
from harness.plan import scheduled_done
from harness.present.run_view import (
    LoadedRun,
    attained,
    completed_pairs,
    diagnostic_text,
    is_interrupted,
    plan_ordered,
    plural,
    sentence,
)
from harness.report_env import resumed_at_other_code, resumed_elsewhere
from harness.stats import disagreeing_checks
from harness.tier import Caveat
from harness.warmup import warmup_sequences

ONE_FOR_MANY = {  # the caveat that lists a kind's claims where more than three have it
    "insufficient": "insufficient: {n} claims' intervals do not keep their stated level.",
    "both": "pairs left out in {n} claims: both arms failed.",
    "odd": "odd pairs: {n} claims ran their arm second and first unequally often.",
    "checks": "checks disagree with the primary verdict in {n} claims.",
}


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
                code="same-code",
            )
        )
    out += list(run.tier.caveats(run))
    for k, machine in resumed_elsewhere(run.env):
        out.append(
            Caveat(
                f"spans machines: resume {k} ran on another machine ({machine}).",
                "Each pair ran within one slice, so each pair's ratio is of one machine; the arms' medians "
                "and the spread mix machines (the environment table names each slice's machine).",
                code="spans-machines",
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
                code="spans-revisions",
            )
        )
    if plan.protocol.control:
        out.append(
            Caveat(
                "A/A control: it measures the noise floor, not a speed-up.", control_text(run), code="control"
            )
        )
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
                code="interrupted",
            )
        )
    if not trials.empty:
        failed = trials[trials["status"] != "ok"]
        measured_failed = int((failed["phase"] == "measured").sum())
        warmup_failed = int((failed["phase"] == "warmup").sum())
        if measured_failed:
            out.append(
                Caveat(
                    f"failures: {plural(measured_failed, 'measured trial')} failed and "
                    f"{'counts' if measured_failed == 1 else 'count'} as infinitely slow.",
                    "A pair whose arm failed has reduction -∞ (whose baseline failed, +100%); no failure is "
                    "dropped, but a pair where both arms failed is no evidence either way: it is left out of the "
                    "claim and counted.",
                    code="failures",
                )
            )
        if warmup_failed:
            out.append(
                Caveat(
                    f"{plural(warmup_failed, 'warm-up trial')} failed.",
                    "Warm-ups are discarded from the statistics anyway.",
                    code="warmup-failures",
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
                f"warm-ups never settled in {plural(len(unsettled), 'sequence')}: "
                + ", ".join(f"{w.reason} ({w.warmups} warm-ups)" for w in unsettled)
                + ".",
                f"Every warm-up was over {plan.protocol.warmup_tolerance:g}% faster than its arm's previous before "
                f"the cap of {plan.protocol.max_warmup}; the measured trials after them may still be warming.",
                code="warmups-unsettled",
            )
        )
    if plan.protocol.device == "cpu" and run.tier.paired:
        out.append(Caveat("device cpu: timings on the CPU say nothing about speed on a GPU.", code="cpu"))
    if run.env.get("git_dirty") is True:
        out.append(
            Caveat(
                "uncommitted changes: the code differed from its git revision.",
                f"The working tree had changes against {code(run.env.get('git_revision'))} when the run started.",
                code="uncommitted",
            )
        )
    if not run.tier.paired:  # pairs, intervals and bars mean nothing to it
        return out
    per_claim: dict[str, list[Caveat]] = {key: [] for key in ONE_FOR_MANY}
    for _, c in plan_ordered(claims, run).iterrows():
        label = f"{c['arm']} vs {c['baseline_arm']}" + (f" ({c['case']})" if len(plan.cases) > 1 else "")
        if not c["ci_sufficient"]:
            per_claim["insufficient"].append(
                Caveat(
                    f"insufficient: {label}'s {method_label(c)} interval does not keep the stated "
                    f"{100 * float(c['ci_level']):.0f}% with {int(c['pairs'])} pairs.",
                    sentence(str(c["ci_reason"])) if c["ci_reason"] else "",
                    code="insufficient",
                )
            )
        if int(c["both_failed"]):
            per_claim["both"].append(
                Caveat(
                    f"{plural(int(c['both_failed']), 'pair')} of {label} left out: both arms failed.",
                    "A pair where both arms failed says nothing about their difference; it is counted here and in "
                    "`claim_diagnostics.csv` (`both_failed`), never taken as a reduction of 0.",
                    code="both-failed",
                )
            )
        if c["arm_second"] != c["arm_first"]:
            per_claim["odd"].append(
                Caveat(
                    f"odd pairs: {label} ran second in {int(c['arm_second'])} pairs and first in "
                    f"{int(c['arm_first'])}, unbalanced.",
                    "An order effect is not averaged out of the estimate; the diagnostics give its estimate "
                    f"({diagnostic_text(c, 'order')}).",
                    code="odd-pairs",
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
                        f"({attained(c[f'{prefix}_attained'])})"
                        for name, prefix in disagree
                    )
                    + "; see the verdict section.",
                    code="checks-disagree",
                )
            )
    for key, items in per_claim.items():  # one caveat per claim; beyond three, one that lists them
        headlines = " ".join(c.headline for c in items)
        out += (
            items
            if len(items) <= 3
            else [Caveat(ONE_FOR_MANY[key].format(n=len(items)), headlines, code=items[0].code)]
        )
    flags = instability_flags(trials, run.env)
    heads = (
        [flag.reason for flag in flags]
        if len(flags) <= 3
        else [f"{len(flags)} flags (the stability section lists them)"]
    )
    for head in heads:
        out.append(
            Caveat(
                f"unstable: {head}.",
                "Flagged trials are kept in every figure; read them with care.",
                code="unstable",
            )
        )
    if plan.protocol.bar is None and not plan.protocol.control:
        out.append(
            Caveat(
                "no bar set (`--bar`): the claims say only whether an arm is faster at all.", code="no-bar"
            )
        )
    return out


def control_text(run: LoadedRun) -> str:
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
            for _, c in plan_ordered(controls, run).iterrows()
        ]
        text += ": difference " + "; ".join(parts)
    return text + "."
