"""What the machine did: failed trials, telemetry, the caveats section and the run's plots."""

from __future__ import annotations

import pandas as pd

from harness import plots, telemetry
from harness.folder_format import OOM_FIELDS
from harness.formatting import cell, code, format_bytes, is_missing
from harness.present.caveats import caveats
from harness.present.model import Image, Section, Table
from harness.present.run_view import LoadedRun, level, plan_ordered, plural

TELEMETRY_FIGURES = (  # (column, what it is) plotted against each trial's figure, where the log has them
    ("cpu_busy_share", "machine CPU busy share"),
    ("cpu_steal_share", "machine CPU steal share"),
    ("load1_start", "1-minute load at the start"),
    ("worker_involuntary_switches", "involuntary context switches"),
    ("gpu0_sm_clock_mhz_end", "GPU 0 SM clock at the end (MHz)"),
    ("gpu0_temperature_c_end", "GPU 0 temperature at the end (°C)"),
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
        columns = ["trial", "case", "phase", "round", "arm", *(k.removeprefix("oom_") for k in OOM_FIELDS)]
        rows = [
            [
                int(r["index"]),
                r["case"],
                r["phase"],
                int(r["round"]),
                r["arm"],
                *(format_bytes(r.get(k)) for k in OOM_FIELDS),
            ]
            for _, r in oom.iterrows()
        ]
        out.add(
            "Out of memory (`resource_failure`), with the byte figures parsed from the error:",
            Table(columns, rows, "rllrl" + "r" * 6),
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
            "Each trial's figure (y) against what was read around it (x): measured trials filled, warm-ups hollow.",
        )
    return out


def caveats_section(run: LoadedRun) -> Section:
    items = "\n".join(f"- {c}" for c in caveats(run))
    return Section("Caveats").add(items or "None derived from the tier or the data.")


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
    limit = (
        ""
        if plan.protocol.bar is None
        else ", the dashed lines the tolerance"
        if plan.protocol.control
        else ", the dashed line the bar"
    )
    return out.add(
        Image(reductions, f"{plan.tier}: paired reductions"),
        "Paired reductions: one point per pair (its arm's marker), the black tick is the median, the thick grey "
        f"line the primary interval ({level(run)}; an arrowhead where it runs past the axis); a pair far beyond "
        f"the rest is drawn at the axis edge with its value{limit}; right of zero is faster.",
    )
