"""What the machine did: failed trials, telemetry, the caveats section and the run's plots."""

from __future__ import annotations

import pandas as pd

from harness import plots, telemetry
from harness.formatting import (
    format_bytes,
    is_missing,
)
from harness.markdown import cell, code, markdown_image, markdown_table
from harness.present.caveats import caveats
from harness.present.run_view import LoadedRun, level, plan_ordered, plural

OOM_FIELDS = ("requested", "total", "free", "allocated", "reserved", "budget")

TELEMETRY_FIGURES = (  # (column, what it is) plotted against each trial's figure, where the log has them
    ("cpu_busy_share", "machine CPU busy share"),
    ("cpu_steal_share", "machine CPU steal share"),
    ("load1_start", "1-minute load at the start"),
    ("worker_involuntary_switches", "involuntary context switches"),
    ("gpu0_sm_clock_mhz_end", "GPU 0 SM clock at the end (MHz)"),
    ("gpu0_temperature_c_end", "GPU 0 temperature at the end (°C)"),
)


def failures_section(run: LoadedRun) -> list[str]:
    trials = run.summaries.trials
    lines = ["### Failed trials", ""]
    failed = trials[trials["status"] != "ok"] if not trials.empty else trials
    if failed.empty:
        return lines + ["None: every logged trial finished."]
    lines.append(f"{plural(len(failed), 'failed trial')}; measured ones count as infinitely slow.")
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


def telemetry_section(run: LoadedRun) -> list[str]:
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


def caveats_section(run: LoadedRun) -> list[str]:
    items = caveats(run)
    return ["### Caveats", ""] + (
        [f"- {c}" for c in items] if items else ["None derived from the tier or the data."]
    )


def plots_section(run: LoadedRun) -> list[str]:
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
        plan_ordered(summaries.pairs, run),
        plan_ordered(summaries.claims, run),
        plan,
        run.figures_dir / "reductions.png",
    )
    lines += [
        "",
        markdown_image(reductions, f"{plan.tier}: paired reductions"),
        "",
        "Paired reductions: one point per pair (its arm's marker), the black tick is the median, the thick grey "
        f"line the primary interval ({level([run])}; an arrowhead where it runs past the axis); a pair far beyond "
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
