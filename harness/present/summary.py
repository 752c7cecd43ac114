"""The report's head: its title, the answer, the runs table and the summary of every claim."""

from __future__ import annotations

from harness.codepaths import all_same_code, same_code_arms, verdict_shown, what_ran
from harness.formatting import (
    code,
    format_interval,
    format_levels,
    format_percent,
    format_value,
    method_label,
    when,
)
from harness.plan import Plan
from harness.present.caveats import caveats, control_text
from harness.present.model import STATISTICS_DOC, Section, Table
from harness.present.run_view import (
    LoadedRun,
    claim_label,
    limit_text,
    logged,
    pairs_text,
    plan_ordered,
    row_of,
)
from harness.sentence import answers
from harness.tier import gate_refusal

NO_COMMAND = "# not recorded (started from Python)"


def same_code_tag(plan: Plan) -> str:
    """What the title calls a run whose compared arms ran the baseline's code."""
    if all_same_code(plan):
        return f" (an A/A in effect: the arms ran the same code on {plan.protocol.device})"
    if same_code_arms(plan):
        return f" (partly an A/A in effect: some arms ran the baseline's code on {plan.protocol.device})"
    return ""


def title_section(runs: list[LoadedRun]) -> Section:
    """The title, the answers in words, the date, and the run folder or the runs table."""
    kinds = dict.fromkeys(
        r.plan.tier + ("" if r.kind == "claim" else f" {r.kind}") + same_code_tag(r.plan) for r in runs
    )
    out = Section(f"musgd-bench report: {' + '.join(kinds)}", depth=1)
    for run in (r for r in runs if r.tier.paired and not r.tier.diagnostic):  # the answer first, in words
        where = f"Run {run.number}: " if len(runs) > 1 else ""
        out.add("\n".join(f"{where}{said}" for said in answers(run.plan, run.summaries.claims)))
    start = when(min(str(r.plan.created) for r in runs))
    several = f"first run started {start}; the runs table gives each run's start)."
    out.add(f"Date: {start[:10]} (" + (several if len(runs) > 1 else f"run started {start})."))
    if len(runs) == 1:
        plan = runs[0].plan
        return out.add(
            f"Run folder {code(runs[0].name)}; tier {code(plan.tier)}; primary figure: {plan.metric}"
            + (f" in {plan.unit}" if plan.unit else "")
            + f" (lower is better); {logged(plan, runs[0].summaries.trials)} in the log.",
            "Command:",
            f"```sh\n{plan.command or NO_COMMAND}\n```",
        )
    gates = {r.number: gate(r) for r in runs}
    cells = {
        "run": lambda r: r.number,
        "folder": lambda r: code(r.name),
        "tier": lambda r: r.plan.tier,
        "kind": lambda r: r.kind,
        "figure": lambda r: f"{r.plan.metric} ({r.plan.unit})",
        "started": lambda r: when(r.plan.created),
        "trials logged": lambda r: logged(r.plan, r.summaries.trials).replace(" scheduled trials", ""),
        "`--gate`": lambda r: gates[r.number][0],
    }
    out.add(Table.of(cells, runs, "rllll"))
    failing = [
        f"- run {r.number} exits 1: {'; '.join(gates[r.number][1])}." for r in runs if gates[r.number][1]
    ]
    if failing:
        out.add(
            "`--gate`: what the run's command exits with `--gate` given, read from its folder now (1 where a "
            "claim does not clear its bar or an A/A arm is not within its tolerance):",
            "\n".join(failing),
        )
    commands = [f"# run {r.number} ({r.name})\n{r.plan.command or NO_COMMAND}" for r in runs]
    return out.add("Commands:", "```sh\n" + "\n".join(commands) + "\n```")


def gate(run: LoadedRun) -> tuple[str, list[str]]:
    """The runs table's `--gate` cell and why the gate fails (empty where it passes or judges nothing)."""
    refusal = gate_refusal(run.tier)
    if refusal is not None:
        return f"n/a ({refusal})", []
    failures = run.gate_failures()
    return ("exit 1" if failures else "exit 0"), failures


def _claims_table(runs: list[LoadedRun]) -> Table | None:
    """Every paired claim of every run, one row each."""
    several = len(runs) > 1
    rows = []
    for run in (r for r in runs if r.tier.paired):
        arms = run.summaries.arms
        for _, claim in plan_ordered(run.summaries.claims, run).iterrows():
            case, arm, base = str(claim["case"]), str(claim["arm"]), str(claim["baseline_arm"])
            verdict = (
                "diagnostic"
                if run.tier.diagnostic
                else f"**{verdict_shown(run.plan, arm, str(claim['verdict']))}**"
            )
            interval = format_interval(claim["ci_low"], claim["ci_high"])
            rows.append(
                [f"{run.number}" + (" (A/A control)" if claim["kind"] == "control" else "")] * several
                + [
                    case,
                    claim_label(claim),
                    pairs_text(run, claim),
                    format_value(row_of(arms, case, base)["median"], run.plan.unit),
                    format_value(row_of(arms, case, arm)["median"], run.plan.unit),
                    format_percent(claim["estimate"]),
                    f"{interval} ({method_label(claim)}, {format_levels(claim)})",
                    limit_text(claim),
                    verdict,
                ]
            )
    columns = ["case", "arm vs baseline", "pairs", "baseline median", "arm median", "reduction (median)"]
    columns += ["interval (method, levels)", "bar", "verdict"]
    return Table(["run"] * several + columns, rows, "r" * several + "llrrrrrll") if rows else None


def summary_section(runs: list[LoadedRun]) -> Section:
    several = len(runs) > 1
    prefix = {r.number: f"Run {r.number}: " if several else "" for r in runs}
    out = Section("Summary", depth=2)
    out.add(*(prefix[r.number] + line for r in runs if (line := what_ran(r.plan))))
    table = _claims_table(runs)
    if table:
        out.add(
            table,
            "Reduction = (baseline − arm) / baseline per pair, higher is faster; the figure is the median over "
            f"the pairs. The methods are described in `{STATISTICS_DOC}`.",
        )
    elif any(r.tier.paired for r in runs):
        out.add("No complete pair in any run: no claim can be made.")
    for run in (r for r in runs if not r.tier.paired):
        claim = run.tier.claim(run)
        if claim:
            out.add(f"{f'Run {run.number} ({run.plan.tier}): ' if several else ''}{claim.strip()}")
    for run in runs:
        side = side_by_side(run)
        if side:
            out.add(prefix[run.number] + side)
        elif several and run.kind == "A/A control":
            out.add(
                f"Run {run.number} is an A/A control. {control_text(run)} "
                "Read the other runs' reductions against it."
            )
        elif several and run.kind == "claim + A/A control" and run.summaries.claims.empty:
            out.add(
                f"Run {run.number} (claim + A/A control) has no complete pair yet: "
                "neither its claim nor its noise floor."
            )
    for run in runs:
        for other, text in run.tier.bounds(run, [r for r in runs if r is not run]):
            out.add(f"Run {run.number}: bounded by run {other.number} ({other.plan.tier}): {text}")
    items = [
        f"- {f'run {r.number}: ' if several else ''}{caveat.headline}" for r in runs for caveat in caveats(r)
    ]
    if items:
        out.add("Caveats (details in each run's section):", "\n".join(items))
    return out


def side_by_side(run: LoadedRun) -> str:
    """A claim and its A/A control measured in one run, in one sentence (empty when the run has not both)."""
    claims = plan_ordered(run.summaries.claims, run)
    if claims.empty or not (claims["kind"] == "control").any() or not (claims["kind"] == "claim").any():
        return ""
    parts = []
    for case in dict.fromkeys(claims["case"]):
        text = "; ".join(
            f"{c['arm']} {format_percent(c['estimate'])} {format_interval(c['ci_low'], c['ci_high'])} "
            f"({'A/A control, ' if c['kind'] == 'control' else ''}{c['verdict']})"
            for _, c in claims[claims["case"] == case].iterrows()
        )
        parts.append((f"case {code(case)}: " if len(run.plan.cases) > 1 else "") + text)
    return (
        "The claim and its noise floor come from one schedule (same machine, day and conditions): "
        + "; ".join(parts)
        + ". A claim is worth no more than the control beside it allows."
    )
