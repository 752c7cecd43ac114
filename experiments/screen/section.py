"""The screen's report section: where padding stops paying, which guard the data supports, the targets."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from experiments.screen.plan import NO_LIMIT, guard_label, parse_guard
from experiments.screen.plots import CROSSOVER_PNG, MEMORY_PNG, plot_crossover, plot_memory
from experiments.screen.summary import SUMMARY_CSV, summary_table
from harness import stats
from harness.codepaths import same_code_arms
from harness.formatting import format_bytes, format_number, format_percent
from harness.plan import Plan
from harness.present.model import Image, Section, Table
from harness.tier import Run
from harness.timing import is_cuda

# Targets of the candidate (a report, not a test).
FLOOR_TARGET = 1.5  # candidate ≤ 1.5 × its own launch floor
UPSTREAM_SPEEDUP_AT_N = 4.0  # candidate ≥ 4 × faster than upstream at n
UPSTREAM_SPEEDUP = 2.0  # and ≥ 2 × at every scale
BOUND_SHARE = 0.8  # a step is 'bound' by host dispatch (or GPU time) when that explains ≥ 80% of it


@dataclass(frozen=True)
class Paired:
    """Arm ``a`` against arm ``b`` over the rounds of one scale: per round (b − a) / b (positive = a faster)."""

    rounds: int
    a_faster: int
    median: float

    @property
    def tally(self) -> str:
        return f"faster in {self.a_faster} of {self.rounds} rounds"

    def text(self, a: str, b: str) -> str:
        if not self.rounds:
            return f"no common round of {a} and {b}"
        if math.isinf(self.median) and self.median < 0:
            return f"{a} failed where {b} finished (paired median; {a} {self.tally})"
        direction = "faster" if self.median > 0 else ("slower" if self.median < 0 else "no faster")
        return f"{a} {direction} than {b} by {format_percent(abs(self.median))} (paired median; {a} {self.tally})"


def paired(trials: pd.DataFrame, scale: str, a: str, b: str) -> Paired:
    """Round-by-round comparison of two arms of a scale, with the spine's failure conventions."""
    rows = stats.measured(trials)
    rows = rows[rows["case"] == scale] if not rows.empty else rows
    if rows.empty:
        return Paired(0, 0, math.nan)
    values = rows.pivot_table(index="round", columns="arm", values="effective", aggfunc="first")
    if a not in values or b not in values:
        return Paired(0, 0, math.nan)
    both = values[[a, b]].dropna()
    reductions = np.array(
        [stats.reduction(float(rb), float(ra)) for ra, rb in zip(both[a], both[b], strict=True)]
    )
    if not len(reductions):
        return Paired(0, 0, math.nan)
    return Paired(len(reductions), int((reductions > 0).sum()), float(np.median(reductions)))


def bound_by(ms: float, host_ms: float, floor_ms: float) -> str:
    """What bounds a step: host dispatch, GPU time, or neither alone (from the three medians)."""
    if math.isfinite(floor_ms) and floor_ms >= BOUND_SHARE * ms:
        return f"GPU time (launch-free floor {format_number(floor_ms)} ms is ≥ {BOUND_SHARE:.0%} of the step)"
    if math.isfinite(host_ms) and host_ms >= BOUND_SHARE * ms:
        return (
            f"host dispatch ({format_number(host_ms)} ms of host time per step is ≥ {BOUND_SHARE:.0%} of it)"
        )
    return (
        f"neither alone (host dispatch {format_number(host_ms)} ms, floor {format_number(floor_ms)} ms per "
        f"{format_number(ms)} ms step)"
    )


def memory_bound(table: pd.DataFrame, scale: str, candidate: str) -> str:
    """What the data says about a guarded arm's extra peak: the same arm with exact shapes (g0), if screened."""
    spec, _, guard = candidate.partition("@g")
    exact = _row(table, scale, guard_label(spec, 0)) if guard and guard != "0" else None
    if exact is None or not math.isfinite(float(exact["extra_peak_bytes_median"])):
        return "memory, not time (no exact-shape arm to compare with)"
    return (
        f"memory, not time: with exact shapes (g0) the step takes {format_bytes(exact['extra_peak_bytes_median'])}, "
        "so padding accounts for the rest"
    )


def _row(table: pd.DataFrame, scale: str, arm: str) -> pd.Series | None:
    match = table[(table["scale"] == scale) & (table["arm"] == arm)]
    return match.iloc[0] if len(match) else None


def _finite(value: float, show: Callable[[float], str]) -> str:
    return show(value) if math.isfinite(value) else "n/a"


def _ms(row: pd.Series | None) -> float:
    return math.nan if row is None else float(row["ms_median"])


def _times(row: pd.Series) -> tuple[float, float, float]:
    """A summary row's medians: ms/step, host ms/step and the launch floor."""
    return float(row["ms_median"]), float(row["host_ms_median"]), float(row["floor_ms_median"])


def guard_analysis(plan: Plan, table: pd.DataFrame, trials: pd.DataFrame, spec: str) -> list[str | Table]:
    """Where padding stops paying for ``spec``, and the guard the data supports."""
    guards = list(plan.settings["guards"])
    labels = {g: guard_label(spec, parse_guard(g)) for g in guards}
    lines: list[str | Table] = []
    best_by_scale: dict[str, float] = {}
    rows = []
    for scale in plan.settings["scales"]:
        medians = {g: _ms(_row(table, scale, labels[g])) for g in guards}
        finite = {g: m for g, m in medians.items() if math.isfinite(m)}
        if not finite:
            continue
        fastest = min(finite, key=finite.get)
        best_by_scale[scale] = finite[fastest]
        runner_up = min((g for g in finite if g != fastest), key=finite.get, default=None)
        versus = (
            paired(trials, scale, labels[fastest], labels[runner_up]).text(labels[fastest], labels[runner_up])
            if runner_up is not None
            else "no other guard finished"
        )
        rows.append([scale, fastest] + [format_number(medians[g]) for g in guards] + [versus])
    if not rows:
        return [f"No finished trial of `{spec}` at any guard."]
    lines += [
        f"Per scale, `{spec}` ms/step (median) at each guard, and the fastest guard:",
        Table(
            ["scale", "fastest guard", *(f"g{g}" for g in guards), "fastest vs next"],
            rows,
            "ll" + "r" * len(guards) + "l",
        ),
        "",
    ]

    # Where the unguarded arm (or the largest guard) turns slower than the default guard and than exact shapes.
    widest = NO_LIMIT if NO_LIMIT in guards else max((g for g in guards), key=lambda g: int(g))
    for reference in [
        g for g in (plan.settings["default_guards"].get(spec), "0") if g in guards and g != widest
    ]:
        a, b = labels[widest], labels[reference]
        found = [(scale, paired(trials, scale, a, b)) for scale in plan.settings["scales"]]
        turned = [f"{scale} ({c.text(a, b)})" for scale, c in found if c.rounds and c.median < 0]
        lines.append(
            f"- `{a}` is slower than `{b}` at: " + "; ".join(turned) + "."
            if turned
            else f"- `{a}` is never slower than `{b}` in this data (paired medians)."
        )
    if "0" in guards and len(guards) > 1:
        pays = []
        for scale in plan.settings["scales"]:
            beating = [
                f"g{g}"
                for g in guards
                if g != "0" and paired(trials, scale, labels[g], labels["0"]).median > 0
            ]
            pays.append(f"{scale}: {', '.join(beating) if beating else 'none'}")
        lines.append(
            "- Guards faster than exact shapes (g0) by paired median, per scale: " + "; ".join(pays) + "."
        )

    # The supported guard: the smallest worst-case slowdown against the fastest guard of each scale.
    worst: dict[str, tuple[float, str]] = {}
    for g in guards:
        ratios = [(_ms(_row(table, s, labels[g])) / best, s) for s, best in best_by_scale.items()]
        ratios = [(r, s) for r, s in ratios if math.isfinite(r)]
        if len(ratios) == len(best_by_scale):
            worst[g] = max(ratios)
    supported = min(worst, key=lambda g: worst[g][0]) if worst else None
    if supported is not None:
        ratio, where = worst[supported]
        lines.append("")
        others = [
            f"g{g} {format_number(worst[g][0])}× at {worst[g][1]}"
            if g in worst
            else f"g{g} did not finish at every scale"
            for g in guards
            if g != supported
        ]
        rest = f"the other guards' worst cases: {', '.join(others)}" if others else "the only guard screened"
        lines.append(
            f"**The data supports guard {supported}** (`{labels[supported]}`): across the scales its median is at "
            f"most {format_number(ratio)}× the fastest guard's (worst at {where}); {rest}."
        )
        default = plan.settings["default_guards"].get(spec)
        if default is not None and default != supported and default in worst:
            lines.append(
                f"The shipped default is g{default} (worst {format_number(worst[default][0])}× the fastest)."
            )
    return lines


def target_lines(plan: Plan, table: pd.DataFrame, trials: pd.DataFrame, candidate: str) -> list[str | Table]:
    """The issue's targets for the candidate arm ``candidate``, checked scale by scale against the data."""
    baseline = plan.cases[0].arms[0].label
    upstream = next((a.label for a in plan.cases[0].arms if a.spec == "upstream"), None)
    scales = plan.settings["scales"]
    rows = []
    misses: list[str] = []

    def add(target: str, figure: str, met: bool | None = None, why: str = "") -> None:
        verdict = "n/a" if met is None else ("met" if met else "**missed**")
        rows.append([target, scale, figure, verdict, why if met is False else ""])
        if met is False:
            misses.append(f"{target} at {scale}: {figure}; bound by {why}")

    for scale in scales:
        mine = _row(table, scale, candidate)
        if mine is None:
            continue
        ms, host, floor = _times(mine)
        cpu = "n/a on the CPU (host and device are one)"
        bound = bound_by(ms, host, floor) if is_cuda(plan.protocol.device) else cpu
        target = f"≤ {FLOOR_TARGET:g}× own floor"
        if math.isfinite(floor):
            ratio, gap = ms / floor, format_number(abs(ms - FLOOR_TARGET * floor))
            side = "under" if ratio <= FLOOR_TARGET else "over"
            figure = f"{format_number(ms)} ms = {format_number(ratio)}× floor {format_number(floor)} ms"
            figure += f" ({side} by {gap} ms)"
            add(target, figure, ratio <= FLOOR_TARGET, bound)
        else:
            add(target, f"floor {mine['floor_note'] or 'not measured'}")
        theirs = _row(table, scale, upstream) if upstream else None
        if theirs is None:
            add("vs upstream", "upstream not in this run")
        else:
            speedup = _ms(theirs) / ms
            need = UPSTREAM_SPEEDUP_AT_N if scale == "n" else UPSTREAM_SPEEDUP
            tally = paired(trials, scale, candidate, upstream).tally
            figure = (
                f"{format_number(speedup)}× ({format_number(_ms(theirs))} vs {format_number(ms)} ms; {tally})"
            )
            add(f"≥ {need:g}× faster than upstream", figure, speedup >= need, bound)
            peak_mine, peak_theirs = (
                float(mine["extra_peak_bytes_median"]),
                float(theirs["extra_peak_bytes_median"]),
            )
            if math.isfinite(peak_mine) and math.isfinite(peak_theirs):
                sign = "+" if peak_mine > peak_theirs else "−"
                gap = f"{sign}{format_bytes(abs(peak_mine - peak_theirs))}"
                figure = f"{format_bytes(peak_mine)} vs {format_bytes(peak_theirs)} ({gap})"
                why = memory_bound(table, scale, candidate)
                add("extra peak ≤ upstream's", figure, peak_mine <= peak_theirs, why)
            else:
                add("extra peak ≤ upstream's", "not measurable here (no CUDA allocator)")
        versus = paired(trials, scale, candidate, baseline)
        if versus.rounds:
            word = "faster" if versus.median > 0 else "slower"
            figure = f"{word} by {format_percent(abs(versus.median))} (paired median; {versus.tally})"
            add("never slower than baseline", figure, versus.a_faster == versus.rounds, bound)
    lines: list[str | Table] = [
        Table(["target", "scale", "figure", "verdict", "what bounds it (where missed)"], rows),
        "",
    ]
    if misses:
        lines += ["Missed:", ""] + [f"- {miss}." for miss in misses]
    elif rows:
        lines.append("Every target that this run could check is met.")
    return lines


def next_step(table: pd.DataFrame, candidate: str, scales: list[str]) -> str:
    """A closing proposal that follows from what bounds the candidate where it is furthest from its floor."""
    rows = [r for s in scales if (r := _row(table, s, candidate)) is not None]
    if not rows:
        return "No finished candidate trial: rerun the screen before drawing conclusions."
    worst = max(
        rows, key=lambda r: (r["over_floor"] if math.isfinite(r["over_floor"]) else -1, r["ms_median"])
    )
    ms, host, floor = _times(worst)
    where = f"At {worst['scale']} the candidate takes {format_number(ms)} ms/step"
    if not math.isfinite(floor):
        return (
            f"{where}, with no launch floor measured here ({worst['floor_note'] or 'no floor'}); run the screen "
            "on a CUDA device to split host dispatch from GPU time before optimizing."
        )
    where += f", {format_number(ms / floor)}× its launch floor of {format_number(floor)} ms"
    if host >= BOUND_SHARE * ms:
        return (
            f"{where}, and {format_number(host)} ms of it is host dispatch: the step is bound by launches. "
            "Next: cut Python and launch work per step (fewer, larger foreach lists; reuse the cached plan's "
            f"lists), or capture the step in a CUDA graph where the trainer allows it (the floor shows the "
            f"most that can save: {format_number(ms - floor)} ms/step)."
        )
    if floor >= BOUND_SHARE * ms:
        return (
            f"{where}: GPU time bounds it. Next: less GPU work per step (less padding in the widest batches, "
            "or a cheaper Newton-Schulz kernel), not fewer launches."
        )
    return (
        f"{where}; neither host dispatch ({format_number(host)} ms) nor the floor explains the step alone. Next: "
        "profile one step (a separate diagnostic run) to find the gaps between launches and GPU work."
    )


def _withheld(labels: list[str], same: dict[str, str], what: str) -> str:
    """The line that stands in for a conclusion drawn from arms that ran the baseline's code."""
    names = ", ".join(f"`{label}`" for label in labels)
    reasons = "; ".join(dict.fromkeys(same[label] for label in labels))
    return (
        f"**Withheld:** {names} ran the baseline's code ({reasons}), so their differences from it are noise: "
        f"{what} cannot be read from this run. Screen an arm that runs other code here (on the CPU, "
        "`candidate-cpu`)."
    )


def report_section(run: Run) -> Section:
    """The screen's report section: tables, crossover and memory plots, and the analysis, from the data."""
    plan, summaries, figures_dir = run.plan, run.summaries, run.figures_dir
    table = summary_table(plan, summaries)
    trials = summaries.trials
    section = Section("Screen: crossover over scales and padding guards")
    if table.empty:
        return section.add("No measured trial finished: nothing to analyse.")
    has_ops = "ops_per_step_median" in table and table["ops_per_step_median"].notna().any()
    cells = {
        "scale": lambda r: r["scale"],
        "arm": lambda r: r["arm"],
        "trials": lambda r: f"{int(r['trials'])}" + (f" ({int(r['failed'])} failed)" if r["failed"] else ""),
        "ms/step median (min–max)": lambda r: (
            f"{format_number(r['ms_median'])} ({format_number(r['ms_min'])}–{format_number(r['ms_max'])})"
        ),
        "host ms/step": lambda r: format_number(r["host_ms_median"]),
        "floor ms": lambda r: _finite(r["floor_ms_median"], format_number),
        "× floor": lambda r: _finite(r["over_floor"], format_number),
        "extra peak": lambda r: format_bytes(r["extra_peak_bytes_median"]),
        "state": lambda r: format_bytes(r["state_bytes_median"]),
        **(
            {"aten ops/step": lambda r: _finite(r["ops_per_step_median"], lambda v: f"{v:.0f}")}
            if has_ops
            else {}
        ),
        "vs baseline (paired median)": lambda r: (
            "—" if r["role"] == "baseline" else format_percent(r["reduction_vs_baseline_median"])
        ),
    }
    lines: list[str | Table | Image] = [
        f"Per scale × arm (measured trials; `{SUMMARY_CSV}` in the run folder holds every figure). ms/step = window "
        f"total / {plan.settings['steps']} steps after {plan.settings['warmup_steps']} warm-up steps; host = host "
        "time inside `step()` per step, no synchronization; floor = one captured step replayed "
        f"{plan.settings['floor_replays']} times (CUDA graph); extra peak = allocator peak over the window minus "
        "what was allocated when it opened (state excluded; state = what the warm-up steps left allocated).",
        "",
        Table.of(cells, (r for _, r in table.iterrows()), "ll" + "r" * (len(cells) - 2)),
        "",
    ]
    if plan.protocol.gpus > 1:
        from experiments.screen.ranks import ranks_lines

        lines += ranks_lines(plan, table, trials)
    notes: dict[str, list[str]] = {}
    for _, r in table[table["floor_note"] != ""].iterrows():
        for note in str(r["floor_note"]).split("; "):
            notes.setdefault(note, []).append(f"{r['scale']} {r['arm']}")
    lines += [f"Floor {note} ({', '.join(where)})." for note, where in notes.items()] + [""]
    labels, scales = plan.arm_labels(), plan.settings["scales"]
    names = {"scale": "x", "arm": "series", "ms_median": "median", "ms_min": "low", "ms_max": "high"}
    crossover = plot_crossover(
        table.rename(columns={**names, "floor_ms_median": "floor"}),
        labels,
        scales,
        figures_dir / CROSSOVER_PNG,
        title="optimizer step vs scale (floors dashed)",
    )
    memory = plot_memory(
        table.rename(columns={"scale": "x", "arm": "series", "extra_peak_bytes_median": "bytes"}),
        labels,
        scales,
        figures_dir / MEMORY_PNG,
        title="extra peak memory of one step vs scale",
    )
    lines += [
        Image(crossover, "crossover: ms/step vs scale"),
        "Median ms/step per arm (bars: min–max over rounds), log axis; dashed: the same arm's launch floor "
        "(CUDA-graph replay), where it could be captured.",
        "",
        Image(memory, "extra peak memory vs scale"),
        "Median extra peak of one step (allocator peak over the window minus what was allocated when it opened).",
    ]
    section = Section.of_lines(section.title, lines)
    same = same_code_arms(plan)
    for spec in plan.settings["guarded_specs"]:
        if spec == plan.settings["arm_specs"][0]:
            continue
        guarded = [guard_label(spec, parse_guard(g)) for g in plan.settings["guards"]]
        if all(label in same for label in guarded):
            body = [_withheld(guarded, same, "which guard the data supports")]
        else:
            body = guard_analysis(plan, table, trials, spec)
        section.add(Section.of_lines(f"Where padding stops paying (`{spec}`)", body, depth=4))
    if "candidate" in plan.settings["arm_specs"][1:]:
        section.add(_targets(plan, table, trials, same))
    if plan.protocol.device == "cpu":
        section.add(
            "This run was on the CPU: no launch floor, no allocator peaks; its timings say nothing about a GPU."
        )
    return section


def _targets(plan: Plan, table: pd.DataFrame, trials: pd.DataFrame, same: dict[str, str]) -> Section:
    """The targets' subsection for the candidate as shipped (or the first screened guard)."""
    default = plan.settings["default_guards"].get("candidate")
    if "candidate" not in plan.settings["guarded_specs"]:
        candidate, which = "candidate", "the candidate as shipped"
    elif default in plan.settings["guards"]:
        candidate, which = guard_label("candidate", parse_guard(default)), "the candidate as shipped"
    else:
        candidate = guard_label("candidate", parse_guard(plan.settings["guards"][0]))
        which = f"the shipped default g{default} was not screened; the first screened guard instead"
    title = f"Targets, checked for `{candidate}` ({which})"
    if candidate in same:
        body = [_withheld([candidate], same, "whether a target is met, and the next step")]
    else:
        body = target_lines(plan, table, trials, candidate)
        body += ["", f"**Next step.** {next_step(table, candidate, plan.settings['scales'])}"]
    return Section.of_lines(title, body, depth=4)
