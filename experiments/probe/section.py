"""The probe tier's report section: memory against the budget, the step's own extra peak, stage share."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from experiments.probe.plots import plot_probe_memory, plot_stage_share
from harness.formatting import format_bytes, format_number, format_percent
from harness.plan import Plan
from harness.present.model import Image, Section, Table
from harness.stats import max_of, median_of
from harness.tables import Summaries
from harness.tier import Run

MEMORY_CSV = "probe_memory.csv"
SHARE_CSV = "stage_share.csv"


_MEMORY_COLUMNS = {
    "peak allocated": "peak_allocated_median",
    "max peak allocated": "peak_allocated_max",
    "peak reserved": "peak_reserved_median",
    "head's extra peak": "head_extra_peak_median",
    "step's extra peak": "step_extra_peak_median",
}


def describe_head(params: dict[str, Any]) -> str:
    """One case's head in words."""
    if params["head"] == "lm":
        text = (
            f"softcapped LM head, N={params['tokens']} tokens, V={params['vocab']}, d={params['dim']}, "
            f"cap {params['cap']:g}, {params['variant']}"
        )
        return text + (f" in chunks of {params['chunk']} rows" if params["variant"] == "chunked" else "")
    return f"YOLO26{params['scale']} detect head, batch {params['batch']} at {params['imgsz']} px"


def memory_table(plan: Plan, trials: pd.DataFrame) -> pd.DataFrame:
    """Per case and arm (plan order): measured trials, failures, time split and memory figures."""
    out = []
    measured = trials[trials["phase"] == "measured"] if not trials.empty else trials
    for case in plan.cases:
        for arm in case.arms:
            mine = (
                measured[(measured["case"] == case.label) & (measured["arm"] == arm.label)]
                if len(measured)
                else measured
            )
            ok = mine[mine["status"] == "ok"] if len(mine) else mine
            oom = mine[mine["status"] == "resource_failure"] if len(mine) else mine
            row: dict[str, Any] = {
                "case": case.label,
                "arm": arm.label,
                "role": arm.role,
                "measured": len(mine),
                "ok": len(ok),
                "out_of_memory": len(oom),
                "other_failures": len(mine) - len(ok) - len(oom),
                "time_ms_median": median_of(ok, "value"),
                "fwd_bwd_ms_median": median_of(ok, "fwd_bwd_ms"),
                "step_ms_median": median_of(ok, "step_ms"),
                "peak_allocated_median": median_of(ok, "peak_allocated"),
                "peak_allocated_max": max_of(ok, "peak_allocated"),
                "peak_reserved_median": median_of(ok, "peak_reserved"),
                "peak_reserved_max": max_of(ok, "peak_reserved"),
                "head_extra_peak_median": median_of(ok, "head_extra_peak"),
                "step_extra_peak_median": median_of(ok, "step_extra_peak"),
                "oom_requested_median": median_of(oom, "oom_requested"),
                "oom_free_median": median_of(oom, "oom_free"),
                "oom_allocated_median": median_of(oom, "oom_allocated"),
                "budget": plan.protocol.budget,
                "reserve": plan.settings.get("reserve_bytes"),
            }
            out.append(row)
    return pd.DataFrame(out)


def zero_cost_bound(share: float) -> float:
    """The round figure a share stays strictly under: 9.82% → 10%, 0.37% → 0.4%, 10% → 11%."""
    percent = round(100 * share, 6)  # 10% stays 10%, not 9.999…%
    step = 1.0 if percent >= 1 else 0.1
    return (math.floor(percent / step) + 1) * step


def share_table(plan: Plan, summaries: Summaries, learner_ms: float) -> pd.DataFrame:
    """Per case and arm: the head's median, its share of a learner step, and its saving."""
    medians = summaries.arms.set_index(["case", "arm"])["median"] if len(summaries.arms) else pd.Series()
    out = []
    for case in plan.cases:
        base_ms = float(medians.get((case.label, case.arms[0].label), math.nan))
        for position, arm in enumerate(case.arms):
            head_ms = float(medians.get((case.label, arm.label), math.nan))
            finite = math.isfinite(head_ms)
            share = head_ms / learner_ms if finite else math.nan
            saving = base_ms - head_ms if finite and position else math.nan
            out.append(
                {
                    "case": case.label,
                    "arm": arm.label,
                    "role": arm.role,
                    "head_median_ms": head_ms,
                    "learner_ms": learner_ms,
                    "head_share": share,
                    "zero_cost_saving_under_percent": zero_cost_bound(share) if share <= 1 else math.nan,
                    "saving_vs_baseline_ms": saving,
                    "learner_step_reduction": saving / learner_ms if math.isfinite(base_ms) else math.nan,
                }
            )
    return pd.DataFrame(out)


def _fit_sentence(row: pd.Series, plan: Plan) -> str:
    where, limit = f"{row['case']} · {row['arm']}", plan.protocol.budget
    budget = "the device" if limit is None else f"the {format_bytes(limit)} budget"
    measured, peak = int(row["measured"]), row["peak_reserved_max"]
    if measured == 0:
        return f"- {where}: no measured trial in the log."
    if row["ok"] == measured:
        fits = f"- {where}: fits {budget} in all {measured} measured trials"
        if limit is None or pd.isna(peak):
            return fits + "."
        return fits + f", leaving {format_bytes(limit - peak)} of it at the highest reserved peak."
    text = f"- {where}: out of memory in {int(row['out_of_memory'])} of {measured} measured trials"
    if int(row["other_failures"]):
        text += f", {int(row['other_failures'])} other failure(s)"
    requested, free = row["oom_requested_median"], row["oom_free_median"]
    if not pd.isna(requested):
        text += f" (a {format_bytes(requested)} allocation refused with {format_bytes(row['oom_allocated_median'])} allocated"
        if limit is not None and not pd.isna(free) and free > requested:
            text += f"; the card itself had {format_bytes(free)} free, so the budget refused it"
        text += "; medians over the failures)"
    return text + f" under {budget}."


def _bound_cell(share: float, bound: float) -> str:
    if pd.isna(share):
        return "n/a (failed)"
    return "n/a (head > step)" if share > 1 else f"under {bound:g}%"


def _share_section(shares: pd.DataFrame, learner_ms: float) -> Section:
    """The head's share of one learner step, per case and arm, and what it bounds."""
    cells = {
        "case": lambda r: r["case"],
        "arm": lambda r: r["arm"],
        "head median (ms)": lambda r: format_number(r["head_median_ms"]),
        "share of a learner step": lambda r: format_percent(r["head_share"]),
        "zero-cost head saves": lambda r: _bound_cell(r["head_share"], r["zero_cost_saving_under_percent"]),
        "arm's head saving as a share of a learner step": lambda r: format_percent(
            r["learner_step_reduction"]
        ),
    }
    records = [r for _, r in shares.iterrows()]
    return Section("Stage share").add(
        f"One learner step is {format_number(learner_ms)} ms (`--learner-ms`). The head's share of it bounds any "
        "whole-run saving from the head.",
        Table.of(cells, records, "llrrrr"),
        "\n".join(_share_sentence(r, learner_ms) for r in records),
    )


def _share_sentence(r: pd.Series, learner_ms: float) -> str:
    where = f"{r['case']} · {r['arm']}"
    if not math.isfinite(r["head_median_ms"]):
        return f"- {where}: the head did not finish in most measured trials; it has no share to bound."
    text = (
        f"- {where}: the head's median {format_number(r['head_median_ms'])} ms is "
        f"{format_percent(r['head_share'])} of a {format_number(learner_ms)} ms learner step"
    )
    if r["head_share"] > 1:
        text += (
            ": the head alone outlasts the stated learner step, so no bound follows; check `--learner-ms`."
        )
    else:
        text += f": even a zero-cost head would save under {r['zero_cost_saving_under_percent']:g}% of the whole run."
    if not pd.isna(r["learner_step_reduction"]):
        saving, difference = float(r["learner_step_reduction"]), float(r["saving_vs_baseline_ms"])
        effect = f"take {format_percent(saving)} off" if saving >= 0 else f"add {format_percent(-saving)} to"
        text += (
            f" Its median head step is {format_number(abs(difference))} ms "
            f"{'below' if difference >= 0 else 'above'} the baseline's, which would {effect} a learner step."
        )
    return text


def tables(run: Run) -> dict[str, pd.DataFrame]:
    """The probe's tidy tables: memory per case and arm, and the stage share where ``--learner-ms`` was given."""
    out = {MEMORY_CSV: memory_table(run.plan, run.summaries.trials)}
    learner_ms = run.plan.settings.get("learner_ms")
    if learner_ms:
        out[SHARE_CSV] = share_table(run.plan, run.summaries, float(learner_ms))
    return out


def report_section(run: Run) -> Section:
    """The probe's report section and its plots."""
    plan, summaries, figures_dir = run.plan, run.summaries, run.figures_dir
    memory = memory_table(plan, summaries.trials)
    reserve = plan.settings.get("reserve_bytes")
    budget = (
        format_bytes(plan.protocol.budget) if plan.protocol.budget is not None else "none (the whole device)"
    )
    held = (
        f", of which `--reserve` holds {format_bytes(reserve)} in every trial for the rest of the learner"
        if reserve
        else ""
    )
    has_memory = memory["peak_allocated_median"].notna().any()
    cells = {
        "case": lambda r: r["case"],
        "arm": lambda r: r["arm"],
        "finished": lambda r: f"{int(r['ok'])} of {int(r['measured'])}",
        "head step (ms)": lambda r: format_number(r["time_ms_median"]),
        "forward+backward (ms)": lambda r: format_number(r["fwd_bwd_ms_median"]),
        "optimizer step (ms)": lambda r: format_number(r["step_ms_median"]),
    }
    if has_memory:
        for name, column in _MEMORY_COLUMNS.items():
            cells[name] = lambda r, column=column: format_bytes(r[column])
    probe = Section("Head probe").add(
        "Heads: " + "; ".join(f"`{c.label}`: {describe_head(c.params)}" for c in plan.cases) + ". "
        f"Budget {budget}{held}. Head-only figures: they say nothing of a whole learner until it fits the budget.",
        "Memory and time split, measured trials that finished (medians; peaks over the timed step):",
        Table.of(cells, (r for _, r in memory.iterrows()), "llr" + "r" * (len(cells) - 3)),
        "Forward+backward and step come from CUDA events in the bracket (the host clock on the CPU). The head's "
        "extra peak is its peak over what was allocated when the timed step began. The step's extra peak is the "
        "optimizer step's, from an untimed step before the timed one."
        + ("" if has_memory else " No memory figures: the allocator's counters exist only on CUDA."),
        "Against the budget:",
        "\n".join(_fit_sentence(r, plan) for _, r in memory.iterrows()),
    )
    if has_memory or (memory["out_of_memory"] > 0).any():
        probe.add(
            Image(
                plot_probe_memory(memory, plan, figures_dir / "probe-memory.png"),
                "probe: peak memory against the budget",
            ),
            "Median peak allocated per case and arm (whisker: highest peak); reserve hatched, budget dashed; a "
            "red x: trials out of memory.",
        )
    learner_ms = plan.settings.get("learner_ms")
    tidy = f"Tidy tables: `{MEMORY_CSV}`" + (f", `{SHARE_CSV}`" if learner_ms else "") + " in the run folder."
    if not learner_ms:
        return probe.add(
            "No `--learner-ms` given: no stage share (the head's share of a whole learner step) is stated.",
            tidy,
        )
    shares = share_table(plan, summaries, float(learner_ms))
    share = _share_section(shares, float(learner_ms))
    if np.isfinite(shares["head_median_ms"].to_numpy(dtype=float)).any():
        share.add(
            Image(
                plot_stage_share(shares, figures_dir / "probe-stage-share.png"),
                "probe: the head's share of one learner step",
            ),
            "Each bar is one learner step: the head's median (coloured) and the rest of the step (grey).",
        )
    return Section("", [probe, share.add(tidy)])
