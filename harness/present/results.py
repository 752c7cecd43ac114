"""A run's results, verdict, design diagnostics, stability and planning sections."""

from __future__ import annotations

import pandas as pd

from harness import telemetry
from harness.codepaths import WITHHELD, same_code_arms, verdict_shown
from harness.formatting import (
    format_bytes,
    format_interval,
    format_levels,
    format_limit,
    format_number,
    format_percent,
    format_percent_range,
    format_range,
    is_missing,
    method_label,
)
from harness.markdown import code, markdown_table
from harness.planning import plan_rows
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
from harness.stats import (
    disagreeing_checks,
    finished,
    instability_flags,
)


def results_section(run: LoadedRun) -> list[str]:
    plan, summaries = run.plan, run.summaries
    arms = plan_ordered(summaries.arms, run)
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
    claims = plan_ordered(summaries.claims, run)
    if claims.empty:
        return lines + ["No complete pair: no paired reduction yet."]
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
            f"{format_interval(c['sign_low'], c['sign_high'])}, {attained(c['sign_attained'])}",
            c["sign_verdict"],
            f"{format_percent(c['hl_estimate'])} {format_interval(c['hl_low'], c['hl_high'])}, "
            f"{attained(c['hl_attained'])}",
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


def verdict_section(run: LoadedRun) -> list[str]:
    plan = run.plan
    claims = plan_ordered(run.summaries.claims, run)
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
                    f"{attained(c[f'{prefix}_attained'])})"
                    for name, prefix in disagree
                )
                + "."
            )
        lines.append(line)
    if plan.protocol.control and not (claims["kind"] == "claim").any():
        lines += ["", "This run is an A/A control: its verdict is about the noise floor, not a speed-up."]
    return lines


def diagnostics_section(run: LoadedRun) -> list[str]:
    """Design diagnostics per claim: the order balance, the order effect and the drift over the schedule."""
    claims = plan_ordered(run.summaries.claims, run)
    if claims.empty:
        return []
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


def stability_section(run: LoadedRun) -> list[str]:
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


def planning_section(run: LoadedRun) -> list[str]:
    """Pairs and time each claim needs at this run's measured per-pair spread."""
    if run.summaries.claims.empty or run.tier.diagnostic:
        return []
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
