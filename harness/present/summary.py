"""The report's head: its title, the answer, the runs table and the summary of every claim."""

from __future__ import annotations

from harness.codepaths import all_same_code, same_code_arms, verdict_shown, what_ran
from harness.formatting import format_interval, format_levels, format_percent, format_value, method_label
from harness.markdown import code, when
from harness.plan import Plan
from harness.present.caveats import caveats, control_text
from harness.present.model import STATISTICS_DOC, Section, Table
from harness.present.run_view import LoadedRun, arm_row, limit_text, logged, pairs_text, plan_ordered
from harness.sentence import answers
from harness.tier import gate_refusal


def same_code_tag(plan: Plan) -> str:
    """What the title calls a run whose compared arms ran the baseline's code."""
    if all_same_code(plan):
        return f" (an A/A in effect: the arms ran the same code on {plan.protocol.device})"
    if same_code_arms(plan):
        return f" (partly an A/A in effect: some arms ran the baseline's code on {plan.protocol.device})"
    return ""


def title_section(runs: list[LoadedRun]) -> Section:
    """The title, the answers in words, the date, and the run folder or the runs table."""
    kinds: list[str] = []
    for run in runs:
        kind = run.plan.tier + ("" if run.kind == "claim" else f" {run.kind}") + same_code_tag(run.plan)
        if kind not in kinds:
            kinds.append(kind)
    first = runs[0]
    lines: list[str | Table] = [f"# musgd-bench report: {' + '.join(kinds)}", ""]
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
            + f" (lower is better); {logged(plan, trials)} in the log."
        )
        lines += ["", "Command:", "", "```sh", plan.command or "# not recorded (started from Python)", "```"]
        return Section.of_lines(lines[0][2:], lines[2:], depth=1)
    gates = {r.number: gate(r) for r in runs}
    rows = [
        [
            r.number,
            code(r.name),
            r.plan.tier,
            r.kind,
            f"{r.plan.metric} ({r.plan.unit})",
            when(r.plan.created),
            logged(r.plan, r.summaries.trials).replace(" scheduled trials", ""),
            gates[r.number][0],
        ]
        for r in runs
    ]
    columns = ["run", "folder", "tier", "kind", "figure", "started", "trials logged", "`--gate`"]
    lines.append(Table(columns, rows, "rllll"))
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
    return Section.of_lines(lines[0][2:], lines[2:], depth=1)


def gate(run: LoadedRun) -> tuple[str, list[str]]:
    """The runs table's `--gate` cell and why the gate fails (empty where it passes or judges nothing)."""
    refusal = gate_refusal(run.tier)
    if refusal is not None:
        return f"n/a ({refusal})", []
    failures = run.gate_failures()
    return ("exit 1" if failures else "exit 0"), failures


def summary_section(runs: list[LoadedRun]) -> Section:
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
        for _, claim in plan_ordered(summaries.claims, run).iterrows():
            case, arm, base = str(claim["case"]), str(claim["arm"]), str(claim["baseline_arm"])
            base_row, mine = arm_row(summaries, case, base), arm_row(summaries, case, arm)
            rows.append(
                (
                    [f"{run.number}" + (" (A/A control)" if claim["kind"] == "control" else "")]
                    if several
                    else []
                )
                + [
                    case,
                    f"{arm} vs {base}",
                    pairs_text(run, claim),
                    format_value(base_row["median"], run.plan.unit),
                    format_value(mine["median"], run.plan.unit),
                    format_percent(claim["estimate"]),
                    f"{format_interval(claim['ci_low'], claim['ci_high'])} ({method_label(claim)}, "
                    f"{format_levels(claim)})",
                    limit_text(run.plan, claim),
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
        lines += [Table(columns, rows, ("r" if several else "") + "llrrrrrll"), ""]
        lines.append(
            "Reduction = (baseline − arm) / baseline per pair, higher is faster; the figure is the median over "
            f"the pairs. The methods are described in `{STATISTICS_DOC}`."
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
        side = side_by_side(run)
        if side:
            lines += ["", (f"Run {run.number}: " if several else "") + side]
        elif several and run.kind == "A/A control":
            lines += [
                "",
                f"Run {run.number} is an A/A control. {control_text(run)} Read the other runs' "
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
    return Section.of_lines("Summary", lines[2:], depth=2)


def side_by_side(run: LoadedRun) -> str:
    """A claim and its A/A control measured in one run, in one sentence (empty when the run has not both)."""
    claims = plan_ordered(run.summaries.claims, run)
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
