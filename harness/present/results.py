"""A run's results, verdict, design diagnostics, stability and planning sections."""

from __future__ import annotations

import pandas as pd

from harness import delay_check
from harness.codepaths import WITHHELD, same_code_arms, verdict_shown
from harness.formatting import (
    claim_limit,
    format_bytes,
    format_interval,
    format_levels,
    format_number,
    format_percent,
    format_percent_range,
    format_range,
    is_missing,
    method_label,
)
from harness.instability import run_flags as instability_flags
from harness.markdown import code
from harness.plan import Plan
from harness.planning import plan_rows
from harness.present.model import STATISTICS_DOC, Section, Table
from harness.present.run_view import (
    LoadedRun,
    attained,
    claim_sentence,
    diagnostic_text,
    duration,
    limit_text,
    pairs_text,
    peak_median,
    plan_ordered,
)
from harness.stats import disagreeing_checks, finished

PEAKS = ("peak_allocated", "peak_reserved")


def _arm_table(run: LoadedRun, arms: pd.DataFrame) -> Table:
    """Per arm: trials, failures, median and range, and the allocator's peaks where the trials carry them."""
    trials, unit = run.summaries.trials, run.plan.unit
    done = finished(trials)
    peaks = [c for c in PEAKS if c in done and pd.to_numeric(done[c], errors="coerce").notna().any()]
    columns = ["case", "arm", "role", "measured trials", "failed", f"median ({unit})", f"min–max ({unit})"]
    columns += [f"peak {c.split('_')[1]} (median)" for c in peaks]
    rows = [
        [a["case"], a["arm"], a["role"], int(a["trials"]), int(a["failed"]), format_number(a["median"])]
        + [format_range(a["min"], a["max"])]
        + [format_bytes(peak_median(trials, str(a["case"]), str(a["arm"]), c)) for c in peaks]
        for _, a in arms.iterrows()
    ]
    return Table(columns, rows, "lllrrrr" + "r" * len(peaks))


def results_section(run: LoadedRun) -> Section:
    plan, summaries = run.plan, run.summaries
    arms = plan_ordered(summaries.arms, run)
    out = Section("Results")
    if arms.empty:
        return out.add("No measured trial in the log: nothing to report yet.")
    out.add(
        f"Per arm, measured trials only ({plan.metric}; failed trials count as infinitely slow):",
        _arm_table(run, arms),
    )
    claims = plan_ordered(summaries.claims, run)
    if claims.empty:
        return out.add("No complete pair: no paired reduction yet.")
    rows = [
        [
            c["case"],
            f"{c['arm']} vs {c['baseline_arm']}",
            pairs_text(run, c),
            format_percent(c["estimate"]),
            format_interval(c["ci_low"], c["ci_high"]),
            f"{method_label(c)}: {format_levels(c)}"
            + ("" if is_missing(c["ci_nominal"]) else f", nominal {100 * float(c['ci_nominal']):.2f}%"),
            limit_text(plan, c),
            f"**{verdict_shown(plan, str(c['arm']), str(c['verdict']))}**",
        ]
        for _, c in claims.iterrows()
    ]
    columns = ["case", "arm vs baseline", "pairs", "median reduction", "interval", "method: levels"]
    out.add(
        "Paired reductions (higher is faster), the primary figure and interval:",
        Table([*columns, "bar", "verdict"], rows, "lllrrlll"),
    )
    checks = [
        [
            c["case"],
            f"{c['arm']} vs {c['baseline_arm']}",
            f"{format_percent(c['median'])} ({format_percent_range(c['min'], c['max'])})",
            f"{format_interval(c['sign_low'], c['sign_high'])}, {attained(c['sign_attained'])}",
            c["sign_verdict"],
            f"{format_percent(c['hl_estimate'])} {format_interval(c['hl_low'], c['hl_high'])}, "
            f"{attained(c['hl_attained'])}",
            c["hl_verdict"],
        ]
        for _, c in claims.iterrows()
    ]
    columns = ["case", "arm vs baseline", "median reduction (min–max)", "sign-test interval of the median"]
    columns += ["sign verdict", "Hodges-Lehmann, Wilcoxon interval", "HL verdict"]
    methods = dict.fromkeys(str(c["ci_method"]) for _, c in claims.iterrows())
    out.add(
        "Distribution-free checks beside it:",
        Table(columns, checks, "llrrlrl"),
        "Primary method: " + "; ".join(methods) + f". The methods are described in `{STATISTICS_DOC}`.",
    )
    for _, c in claims.iterrows():
        case, arm = str(c["case"]), str(c["arm"])
        where = f"case {code(case)}, " if len(plan.cases) > 1 else ""
        kind = "Diagnostic, not a claim" if run.tier.diagnostic else "Claim"
        out.add(
            f"**{kind} ({where}{arm} vs {c['baseline_arm']}).** {claim_sentence(plan, summaries, case, arm)}"
        )
    return out


def _explain(c: pd.Series, verdict: str, plan: Plan) -> str:
    """Why a claim got its verdict, in words."""
    interval = f"the {100 * float(c['ci_level']):.0f}% {method_label(c)} interval {format_interval(c['ci_low'], c['ci_high'])}"
    limit = claim_limit(c)
    return {
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


def verdict_section(run: LoadedRun) -> Section:
    plan = run.plan
    claims = plan_ordered(run.summaries.claims, run)
    out = Section("Verdict")
    if claims.empty:
        return out.add("No complete pair: no verdict.")
    if run.tier.diagnostic:
        return out.add("A diagnostic run (synchronized inside the timed region): no verdict.")
    items = []
    for _, c in claims.iterrows():
        verdict = verdict_shown(plan, str(c["arm"]), str(c["verdict"]))
        where = f"case {code(c['case'])}, " if len(plan.cases) > 1 else ""
        kind = " (A/A control)" if c["kind"] == "control" and len(claims) > 1 else ""
        line = (
            f"- {where}{c['arm']} vs {c['baseline_arm']}{kind}: **{verdict}** — {_explain(c, verdict, plan)}."
        )
        if str(c["verdict_basis"]).startswith("sign"):
            line += f" The verdict reads the {c['verdict_basis']}."
        disagree = [] if verdict == WITHHELD else disagreeing_checks(c)
        if disagree:
            line += (
                " The checks disagree: "
                + "; ".join(
                    f"{name} says {c[f'{prefix}_verdict']} "
                    f"({format_interval(c[f'{prefix}_low'], c[f'{prefix}_high'])}, {attained(c[f'{prefix}_attained'])})"
                    for name, prefix in disagree
                )
                + "."
            )
        items.append(line)
    items += [f"- {reading.text}." for reading in delay_check.readings(run.summaries.trials)]
    out.add("\n".join(items))
    if plan.protocol.control and not (claims["kind"] == "claim").any():
        out.add("This run is an A/A control: its verdict is about the noise floor, not a speed-up.")
    return out


def diagnostics_section(run: LoadedRun) -> Section | None:
    """Design diagnostics per claim: the order balance, the order effect and the drift over the schedule."""
    claims = plan_ordered(run.summaries.claims, run)
    if claims.empty:
        return None
    rows = [
        [
            c["case"],
            f"{c['arm']} vs {c['baseline_arm']}",
            f"{int(c['arm_second'])} / {int(c['arm_first'])}"
            + (" (balanced)" if c["arm_second"] == c["arm_first"] else " (**unbalanced**)"),
            diagnostic_text(c, "order"),
            diagnostic_text(c, "drift"),
        ]
        for _, c in claims.iterrows()
    ]
    columns = ["case", "arm vs baseline", "arm second / first", "order effect", "drift"]
    return Section("Design diagnostics").add(
        Table(columns, rows, "lllll"),
        "Both are diagnostics: estimated, never used to adjust the claim.",
    )


def stability_section(run: LoadedRun) -> Section:
    """Instability flags: per-arm spread and the machine's load (and steal, where the trials carry it)."""
    flags = instability_flags(run.summaries.trials, run.env)
    load, cores = run.env.get("load1_start"), run.env.get("cpu_logical")
    machine = (
        f"1-minute load {float(load):.2f} on {cores} logical cores at the run's start"
        if load is not None and cores
        else "the load at the run's start was not recorded"
    )
    out = Section("Stability")
    if not flags:
        return out.add(
            f"No flag: every arm's max/min is within 1.5 and its MAD/median within 10%; {machine}."
        )
    return out.add(
        "\n".join(f"- **{flag.reason}**" for flag in flags),
        f"{machine[:1].upper()}{machine[1:]}. Flagged trials are kept in every figure.",
    )


def planning_section(run: LoadedRun) -> Section | None:
    """Pairs and time each claim needs at this run's measured per-pair spread."""
    if run.summaries.claims.empty or run.tier.diagnostic:
        return None
    rows = []
    for r in plan_rows(run.plan.protocol, run.summaries):
        spread = "n/a" if is_missing(r["sigma"]) else f"{100 * r['sigma']:.2f}% ({r['sigma_pairs']} pairs)"
        if r["pairs"] is None:
            rows.append([f"{r['arm']} vs {r['baseline_arm']}", spread, r["note"], "", ""])
            continue
        seconds = "n/a" if is_missing(r["seconds"]) else duration(float(r["seconds"]))
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
    columns = ["claim", "per-pair σ of the log ratio", "goal", "pairs to run", "time"]
    return Section("Planning").add(
        Table(columns, rows, "lrlrr"),
        f"For another goal: `bench plan {run.name} --effect 3%` (or `--tolerance 1%` for an A/A arm).",
    )
