"""A run's sections of figures: results, verdict, diagnostics, stability, planning, failures, telemetry, plots."""

from __future__ import annotations

from functools import partial

import pandas as pd

from harness import delay_check, plots, telemetry
from harness.codepaths import WITHHELD, same_code_arms, verdict_shown
from harness.folder_format import OOM_FIELDS
from harness.formatting import (
    cell,
    claim_limit,
    code,
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
from harness.plan import Plan
from harness.planning import plan_rows
from harness.present.model import STATISTICS_DOC, Image, Section, Table
from harness.present.run_view import (
    LoadedRun,
    check_text,
    claim_label,
    claim_sentence,
    diagnostic_text,
    duration,
    limit_text,
    pairs_text,
    peak_median,
    plan_ordered,
    plural,
)
from harness.stats import disagreeing_checks, finished

PEAKS = ("peak_allocated", "peak_reserved")
TELEMETRY_FIGURES = (  # (column, what it is) plotted against each trial's figure, where the log has them
    ("cpu_busy_share", "machine CPU busy share"),
    ("cpu_steal_share", "machine CPU steal share"),
    ("load1_start", "1-minute load at the start"),
    ("worker_involuntary_switches", "involuntary context switches"),
    ("gpu0_sm_clock_mhz_end", "GPU 0 SM clock at the end (MHz)"),
    ("gpu0_temperature_c_end", "GPU 0 temperature at the end (°C)"),
)


def _arm_table(run: LoadedRun, arms: pd.DataFrame) -> Table:
    """Per arm: trials, failures, median and range, and the allocator's peaks where the trials carry them."""
    trials, unit = run.summaries.trials, run.plan.unit
    done = finished(trials)
    cells = {
        "case": lambda a: a["case"],
        "arm": lambda a: a["arm"],
        "role": lambda a: a["role"],
        "measured trials": lambda a: int(a["trials"]),
        "failed": lambda a: int(a["failed"]),
        f"median ({unit})": lambda a: format_number(a["median"]),
        f"min–max ({unit})": lambda a: format_range(a["min"], a["max"]),
    }
    peaks = [c for c in PEAKS if c in done and pd.to_numeric(done[c], errors="coerce").notna().any()]
    cells.update({f"peak {c.split('_')[1]} (median)": partial(_peak_cell, trials, c) for c in peaks})
    return Table.of(cells, (a for _, a in arms.iterrows()), "lllrrrr" + "r" * (len(cells) - 7))


def _peak_cell(trials: pd.DataFrame, column: str, arm: pd.Series) -> str:
    return format_bytes(peak_median(trials, str(arm["case"]), str(arm["arm"]), column))


def _primary_cell(c: pd.Series) -> str:
    nominal = "" if is_missing(c["ci_nominal"]) else f", nominal {100 * float(c['ci_nominal']):.2f}%"
    return f"{method_label(c)}: {format_levels(c)}{nominal}"


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
    rows = [c for _, c in claims.iterrows()]
    primary = {
        "case": lambda c: c["case"],
        "arm vs baseline": claim_label,
        "pairs": lambda c: pairs_text(run, c),
        "median reduction": lambda c: format_percent(c["estimate"]),
        "interval": lambda c: format_interval(c["ci_low"], c["ci_high"]),
        "method: levels": _primary_cell,
        "bar": limit_text,
        "verdict": lambda c: f"**{verdict_shown(plan, str(c['arm']), str(c['verdict']))}**",
    }
    checks = {
        "case": lambda c: c["case"],
        "arm vs baseline": claim_label,
        "median reduction (min–max)": lambda c: (
            f"{format_percent(c['median'])} ({format_percent_range(c['min'], c['max'])})"
        ),
        "sign-test interval of the median": lambda c: check_text(c, "sign"),
        "sign verdict": lambda c: c["sign_verdict"],
        "Hodges-Lehmann, Wilcoxon interval": lambda c: (
            f"{format_percent(c['hl_estimate'])} {check_text(c, 'hl')}"
        ),
        "HL verdict": lambda c: c["hl_verdict"],
    }
    methods = dict.fromkeys(str(c["ci_method"]) for c in rows)
    out.add(
        "Paired reductions (higher is faster), the primary figure and interval:",
        Table.of(primary, rows, "lllrrlll"),
        "Distribution-free checks beside it:",
        Table.of(checks, rows, "llrrlrl"),
        "Primary method: " + "; ".join(methods) + f". The methods are described in `{STATISTICS_DOC}`.",
    )
    for c in rows:
        where = f"case {code(c['case'])}, " if len(plan.cases) > 1 else ""
        kind = "Diagnostic, not a claim" if run.tier.diagnostic else "Claim"
        sentence = claim_sentence(plan, summaries, str(c["case"]), str(c["arm"]))
        out.add(f"**{kind} ({where}{claim_label(c)}).** {sentence}")
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
        line = f"- {where}{claim_label(c)}{kind}: **{verdict}** — {_explain(c, verdict, plan)}."
        if str(c["verdict_basis"]).startswith("sign"):
            line += f" The verdict reads the {c['verdict_basis']}."
        disagree = [] if verdict == WITHHELD else disagreeing_checks(c)
        if disagree:
            says = [
                f"{name} says {c[f'{prefix}_verdict']} ({check_text(c, prefix)})" for name, prefix in disagree
            ]
            line += " The checks disagree: " + "; ".join(says) + "."
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
    cells = {
        "case": lambda c: c["case"],
        "arm vs baseline": claim_label,
        "arm second / first": lambda c: (
            f"{int(c['arm_second'])} / {int(c['arm_first'])}"
            + (" (balanced)" if c["arm_second"] == c["arm_first"] else " (**unbalanced**)")
        ),
        "order effect": lambda c: diagnostic_text(c, "order"),
        "drift": lambda c: diagnostic_text(c, "drift"),
    }
    return Section("Design diagnostics").add(
        Table.of(cells, (c for _, c in claims.iterrows()), "lllll"),
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


def _planning_row(r: dict, several: bool) -> list[str]:
    spread = "n/a" if is_missing(r["sigma"]) else f"{100 * r['sigma']:.2f}% ({r['sigma_pairs']} pairs)"
    if r["pairs"] is None:
        return [f"{r['arm']} vs {r['baseline_arm']}", spread, r["note"], "", ""]
    return [
        f"{r['arm']} vs {r['baseline_arm']}" + (f" ({r['case']})" if several else ""),
        spread,
        r["goal"],
        f"{r['pairs']} ({r['pairs_for_goal']} for the goal, {100 * r['probability']:.0f}% likely; "
        f"{r['pairs_upper']} at σ's upper bound)",
        "n/a" if is_missing(r["seconds"]) else duration(float(r["seconds"])),
    ]


def planning_section(run: LoadedRun) -> Section | None:
    """Pairs and time each claim needs at this run's measured per-pair spread."""
    if run.summaries.claims.empty or run.tier.diagnostic:
        return None
    rows = [_planning_row(r, len(run.plan.cases) > 1) for r in plan_rows(run.plan.protocol, run.summaries)]
    columns = ["claim", "per-pair σ of the log ratio", "goal", "pairs to run", "time"]
    return Section("Planning").add(
        Table(columns, rows, "lrlrr"),
        f"For another goal: `bench plan {run.name} --effect 3%` (or `--tolerance 1%` for an A/A arm).",
    )


def failures_section(run: LoadedRun) -> Section:
    trials = run.summaries.trials
    out = Section("Failed trials")
    failed = trials[trials["status"] != "ok"] if not trials.empty else trials
    if failed.empty:
        return out.add("None: every logged trial finished.")
    out.add(f"{plural(len(failed), 'failed trial')}; measured ones count as infinitely slow.")
    oom = failed[failed["status"] == "resource_failure"]
    if len(oom):
        shown = oom.reindex(columns=["index", "case", "phase", "round", "arm", *OOM_FIELDS])
        shown = shown.astype({"index": int, "round": int}).assign(
            **{k: shown[k].map(format_bytes) for k in OOM_FIELDS}
        )
        columns = ["trial", "case", "phase", "round", "arm", *(k.removeprefix("oom_") for k in OOM_FIELDS)]
        out.add(
            "Out of memory (`resource_failure`), with the byte figures parsed from the error:",
            Table(columns, shown.values.tolist(), "rllrl" + "r" * 6),
        )
    other = failed[failed["status"] != "resource_failure"]
    if len(other):
        out.add(
            "Other failures, with their messages:",
            "\n".join(
                f"- trial {int(r['index'])} ({r['case']}, {r['phase']} round {int(r['round'])}, {r['arm']}, "
                f"`{r['status']}`): {code(r['message'] or 'no message')}"
                for _, r in other.iterrows()
            ),
        )
    return out


def _placement(run: LoadedRun) -> str:
    placement = run.env.get("placement")
    if not placement:
        return "CPU placement: none (as the OS scheduled)."
    return (
        f"CPU placement: worker on cores {cell(placement.get('worker_cores'))}, parent on "
        f"{cell(placement.get('parent_cores'))}, {placement.get('torch_threads')} torch threads "
        f"({placement.get('reason')})."
    )


def telemetry_section(run: LoadedRun) -> Section | None:
    """The placement, the flagged trials (kept, never dropped), and each trial's figure against its telemetry."""
    trials = run.summaries.trials
    if trials.empty or "telemetry_seconds" not in trials:
        return None
    out = Section("Telemetry").add(_placement(run))
    flagged = []
    for row in trials.to_dict("records"):
        reasons = telemetry.flags({k: (None if is_missing(v) else v) for k, v in row.items()})
        if reasons:
            flagged.append(
                f"- trial {int(row['index'])} ({row['phase']}, {row['arm']}): " + "; ".join(reasons) + "."
            )
    if flagged:
        out.add(
            f"Flagged trials ({len(flagged)} of {len(trials)}; kept in every figure):", "\n".join(flagged)
        )
    else:
        out.add("No trial was flagged (GPU throttling, CPU steal, load above the cores).")
    present = [
        (c, label)
        for c, label in TELEMETRY_FIGURES
        if c in trials and pd.to_numeric(trials[c], errors="coerce").notna().any()
    ]
    if present:
        path = plots.plot_telemetry(trials, run.plan, present, run.figures_dir / "telemetry.png")
        out.add(
            Image(path, f"{run.plan.tier}: each trial's figure against its telemetry"),
            "Each trial's figure (y) against what was read around it (x): "
            "measured trials filled, warm-ups hollow.",
        )
    return out


def plots_section(run: LoadedRun) -> Section:
    plan, summaries = run.plan, run.summaries
    timeline = plots.plot_timeline(summaries.trials, plan, run.figures_dir / "timeline.png")
    out = Section("Plots").add(
        Image(timeline, f"{plan.tier}: every trial in schedule order"),
        "Every trial in schedule order: filled markers are measured trials (colour and shape per arm), the "
        "arm's marker hollow and grey is a warm-up (discarded), a red x along the top is a failed trial, "
        "hatched slots were scheduled but not run.",
    )
    if summaries.claims.empty:
        return out.add("No complete pair: no reduction plot.")
    pairs, claims = plan_ordered(summaries.pairs, run), plan_ordered(summaries.claims, run)
    reductions = plots.plot_reductions(pairs, claims, plan, run.figures_dir / "reductions.png")
    limit = ", the dashed lines the tolerance" if plan.protocol.control else ", the dashed line the bar"
    limit = "" if plan.protocol.bar is None else limit
    first = summaries.claims.iloc[0]
    level = f"{100 * float(first['ci_level']):.0f}% {method_label(first)} interval"
    return out.add(
        Image(reductions, f"{plan.tier}: paired reductions"),
        "Paired reductions: one point per pair (its arm's marker), the black tick is the median, the thick grey "
        f"line the primary interval ({level}; an arrowhead where it runs past the axis); a pair far beyond "
        f"the rest is drawn at the axis edge with its value{limit}; right of zero is faster.",
    )
