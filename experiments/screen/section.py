"""The screen's summary table and report section: where padding stops paying, the guard, the targets."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from experiments.screen.plan import NO_GUARD, NO_LIMIT, guard_label, parse_guard
from experiments.screen.plots import CROSSOVER_PNG, MEMORY_PNG, plot_crossover, plot_memory
from harness import stats
from harness.codepaths import same_code_arms
from harness.formatting import format_bytes, format_number, format_percent
from harness.plan import Plan
from harness.present.model import Image, Section, Table
from harness.tables import Summaries
from harness.tier import Run
from harness.timing import is_cuda

# Targets of the candidate (a report, not a test).
FLOOR_TARGET = 1.5  # candidate ≤ 1.5 × its own launch floor
UPSTREAM_SPEEDUP_AT_N = 4.0  # candidate ≥ 4 × faster than upstream at n
UPSTREAM_SPEEDUP = 2.0  # and ≥ 2 × at every scale
BOUND_SHARE = 0.8  # a step is 'bound' by host dispatch (or GPU time) when that explains ≥ 80% of it

SUMMARY_CSV = "screen_summary.csv"
SUMMARY_COLUMNS = """scale arm spec role guard trials failed ms_median ms_min ms_max host_ms_median floor_ms_median
floor_note over_floor extra_peak_bytes_median extra_peak_bytes_max state_bytes_median ops_per_step_median
window_replays_median plan_bytes_median peak_allocated_median reduction_vs_baseline_median
reduction_vs_baseline_min reduction_vs_baseline_max ci_low ci_high collective_ms_median
collective_share_median""".split()
# Trial-log columns whose median over an arm's finished trials is a column of its own (``<name>_median``).
MEDIANS = """host_ms floor_ms extra_peak_bytes state_bytes ops_per_step window_replays plan_bytes peak_allocated
collective_ms collective_share""".split()
# The claim's columns, under the summary's names.
CLAIM_COLUMNS = {f"reduction_vs_baseline_{k}": k for k in ("median", "min", "max")} | {
    k: k for k in ("ci_low", "ci_high")
}
RANK_HEADERS = ("scale", "arm", "ms/step (slowest rank)", "per rank", "collective ms", "collective share")


def _by_arm(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.set_index(["case", "arm"]) if not frame.empty else pd.DataFrame()


def _rows_of(frame: pd.DataFrame, case: str, arm: str) -> pd.DataFrame:
    return frame[(frame["case"] == case) & (frame["arm"] == arm)] if not frame.empty else frame


def summary_table(plan: Plan, summaries: Summaries) -> pd.DataFrame:
    """One row per scale × arm (× guard): the spine's median and range, plus the screen's own figures."""
    ok = stats.finished(summaries.trials)
    arms, claims = _by_arm(summaries.arms), _by_arm(summaries.claims)
    rows = []
    for case in plan.cases:
        for arm in case.arms:
            key = (case.label, arm.label)
            if key not in arms.index:
                continue
            spine, mine = arms.loc[key], _rows_of(ok, *key)
            notes = sorted({str(n) for n in mine.get("floor_note", pd.Series(dtype=str)).dropna() if str(n)})
            row = {f"{name}_median": stats.median_of(mine, name) for name in MEDIANS}
            floor = row["floor_ms_median"]
            claim = claims.loc[key] if key in claims.index else {k: math.nan for k in CLAIM_COLUMNS.values()}
            rows.append(
                {
                    **row,
                    "scale": case.label,
                    "arm": arm.label,
                    "spec": arm.spec,
                    "role": arm.role,
                    "guard": arm.params.get("guard", NO_GUARD),
                    "trials": int(spine["trials"]),
                    "failed": int(spine["failed"]),
                    **{f"ms_{k}": float(spine[k]) for k in ("median", "min", "max")},
                    "floor_note": "; ".join(notes),
                    "over_floor": float(spine["median"]) / floor
                    if floor and math.isfinite(floor)
                    else math.nan,
                    "extra_peak_bytes_max": stats.max_of(mine, "extra_peak_bytes"),
                    **{name: float(claim[k]) for name, k in CLAIM_COLUMNS.items()},
                }
            )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


@dataclass(frozen=True)
class Paired:
    """Arm ``a`` against arm ``b`` over the rounds of one scale: per round (b − a) / b (positive = a faster)."""

    rounds: int = 0
    a_faster: int = 0
    median: float = math.nan

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
        return Paired()
    values = rows.pivot_table(index="round", columns="arm", values="effective", aggfunc="first")
    if a not in values or b not in values:
        return Paired()
    both = values[[a, b]].dropna()
    reductions = np.array(
        [stats.reduction(float(y), float(x)) for x, y in zip(both[a], both[b], strict=True)]
    )
    if not len(reductions):
        return Paired()
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
    peak = format_bytes(exact["extra_peak_bytes_median"])
    return f"memory, not time: with exact shapes (g0) the step takes {peak}, so padding accounts for the rest"


def _row(table: pd.DataFrame, scale: str, arm: str | None) -> pd.Series | None:
    match = table[(table["scale"] == scale) & (table["arm"] == arm)]
    return match.iloc[0] if len(match) else None


def _finite(value: float, show: Callable[[float], str] = format_number) -> str:
    return show(value) if math.isfinite(value) else "n/a"


def _ms(row: pd.Series | None) -> float:
    return math.nan if row is None else float(row["ms_median"])


def guard_analysis(plan: Plan, table: pd.DataFrame, trials: pd.DataFrame, spec: str) -> list[str | Table]:
    """Where padding stops paying for ``spec``, and the guard the data supports."""
    guards, scales = list(plan.settings["guards"]), plan.settings["scales"]
    labels = {g: guard_label(spec, parse_guard(g)) for g in guards}
    best_by_scale: dict[str, float] = {}
    rows = []
    for scale in scales:
        medians = {g: _ms(_row(table, scale, labels[g])) for g in guards}
        finite = {g: m for g, m in medians.items() if math.isfinite(m)}
        if not finite:
            continue
        fastest = min(finite, key=finite.get)
        best_by_scale[scale] = finite[fastest]
        next_one = min((g for g in finite if g != fastest), key=finite.get, default=None)
        a, b = labels[fastest], labels.get(next_one)
        versus = paired(trials, scale, a, b).text(a, b) if next_one else "no other guard finished"
        rows.append([scale, fastest] + [format_number(medians[g]) for g in guards] + [versus])
    if not rows:
        return [f"No finished trial of `{spec}` at any guard."]
    columns = ["scale", "fastest guard", *(f"g{g}" for g in guards), "fastest vs next"]
    lines: list[str | Table] = [
        f"Per scale, `{spec}` ms/step (median) at each guard, and the fastest guard:",
        Table(columns, rows, "ll" + "r" * len(guards) + "l"),
        "",
    ]
    # Where the unguarded arm (or the largest guard) turns slower than the default guard and than exact shapes.
    widest = NO_LIMIT if NO_LIMIT in guards else max(guards, key=int)
    for reference in (plan.settings["default_guards"].get(spec), "0"):
        if reference not in guards or reference == widest:
            continue
        a, b = labels[widest], labels[reference]
        found = [(scale, paired(trials, scale, a, b)) for scale in scales]
        turned = [f"{scale} ({c.text(a, b)})" for scale, c in found if c.rounds and c.median < 0]
        lines.append(
            f"- `{a}` is slower than `{b}` at: " + "; ".join(turned) + "."
            if turned
            else f"- `{a}` is never slower than `{b}` in this data (paired medians)."
        )
    if "0" in guards and len(guards) > 1:
        pays = []
        for scale in scales:
            faster = [
                f"g{g}"
                for g in guards
                if g != "0" and paired(trials, scale, labels[g], labels["0"]).median > 0
            ]
            pays.append(f"{scale}: {', '.join(faster) or 'none'}")
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
    if not worst:
        return lines
    supported = min(worst, key=lambda g: worst[g][0])
    ratio, where = worst[supported]
    others = [
        f"g{g} {format_number(worst[g][0])}× at {worst[g][1]}"
        if g in worst
        else f"g{g} did not finish at every scale"
        for g in guards
        if g != supported
    ]
    rest = f"the other guards' worst cases: {', '.join(others)}" if others else "the only guard screened"
    lines += [
        "",
        f"**The data supports guard {supported}** (`{labels[supported]}`): across the scales its median is at "
        f"most {format_number(ratio)}× the fastest guard's (worst at {where}); {rest}.",
    ]
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
    rows, misses = [], []

    def add(target: str, figure: str, met: bool | None = None, why: str = "") -> None:
        verdict = "n/a" if met is None else ("met" if met else "**missed**")
        rows.append([target, scale, figure, verdict, why if met is False else ""])
        if met is False:
            misses.append(f"- {target} at {scale}: {figure}; bound by {why}.")

    for scale in plan.settings["scales"]:
        mine = _row(table, scale, candidate)
        if mine is None:
            continue
        ms, host, floor = (float(mine[k]) for k in ("ms_median", "host_ms_median", "floor_ms_median"))
        cpu = "n/a on the CPU (host and device are one)"
        bound = bound_by(ms, host, floor) if is_cuda(plan.protocol.device) else cpu
        target = f"≤ {FLOOR_TARGET:g}× own floor"
        if math.isfinite(floor):
            ratio, gap = ms / floor, format_number(abs(ms - FLOOR_TARGET * floor))
            side = "under" if ratio <= FLOOR_TARGET else "over"
            figure = f"{format_number(ms)} ms = {format_number(ratio)}× floor {format_number(floor)} ms"
            add(target, f"{figure} ({side} by {gap} ms)", ratio <= FLOOR_TARGET, bound)
        else:
            add(target, f"floor {mine['floor_note'] or 'not measured'}")
        theirs = _row(table, scale, upstream)
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
            peak_mine, peak_theirs = (float(r["extra_peak_bytes_median"]) for r in (mine, theirs))
            if math.isfinite(peak_mine) and math.isfinite(peak_theirs):
                sign = "+" if peak_mine > peak_theirs else "−"
                figure = f"{format_bytes(peak_mine)} vs {format_bytes(peak_theirs)} ({sign}"
                figure += f"{format_bytes(abs(peak_mine - peak_theirs))})"
                why = memory_bound(table, scale, candidate)
                add("extra peak ≤ upstream's", figure, peak_mine <= peak_theirs, why)
            else:
                add("extra peak ≤ upstream's", "not measurable here (no CUDA allocator)")
        versus = paired(trials, scale, candidate, baseline)
        if versus.rounds:
            word = "faster" if versus.median > 0 else "slower"
            figure = f"{word} by {format_percent(abs(versus.median))} (paired median; {versus.tally})"
            add("never slower than baseline", figure, versus.a_faster == versus.rounds, bound)
    columns = ["target", "scale", "figure", "verdict", "what bounds it (where missed)"]
    lines: list[str | Table] = [Table(columns, rows), ""]
    if misses:
        return lines + ["Missed:", "", *misses]
    return lines + (["Every target that this run could check is met."] if rows else [])


def next_step(table: pd.DataFrame, candidate: str, scales: list[str]) -> str:
    """A closing proposal that follows from what bounds the candidate where it is furthest from its floor."""
    rows = [r for s in scales if (r := _row(table, s, candidate)) is not None]
    if not rows:
        return "No finished candidate trial: rerun the screen before drawing conclusions."
    worst = max(
        rows, key=lambda r: (r["over_floor"] if math.isfinite(r["over_floor"]) else -1, r["ms_median"])
    )
    ms, host, floor = (float(worst[k]) for k in ("ms_median", "host_ms_median", "floor_ms_median"))
    where = f"At {worst['scale']} the candidate takes {format_number(ms)} ms/step"
    if not math.isfinite(floor):
        return (
            f"{where}, with no launch floor here ({worst['floor_note'] or 'no floor'}). Screen on CUDA to split "
            "host dispatch from GPU time before optimizing."
        )
    where += f", {format_number(ms / floor)}× its launch floor of {format_number(floor)} ms"
    if host >= BOUND_SHARE * ms:
        return (
            f"{where}, and {format_number(host)} ms of it is host dispatch: launches bound it. Next: less "
            "Python and fewer launches per step, or a CUDA graph where the trainer allows it (at most "
            f"{format_number(ms - floor)} ms/step saved)."
        )
    if floor >= BOUND_SHARE * ms:
        return (
            f"{where}: GPU time bounds it. Next: less GPU work per step (less padding, a cheaper Newton-Schulz), "
            "not fewer launches."
        )
    return (
        f"{where}; neither host dispatch ({format_number(host)} ms) nor the floor explains it alone. Next: "
        "profile one step to find the gaps."
    )


def _withheld(labels: list[str], same: dict[str, str], what: str) -> str:
    """The line that stands in for a conclusion drawn from arms that ran the baseline's code."""
    names = ", ".join(f"`{label}`" for label in labels)
    reasons = "; ".join(dict.fromkeys(same[label] for label in labels))
    return (
        f"**Withheld:** {names} ran the baseline's code ({reasons}): {what} cannot be read from this run. "
        "Screen an arm that runs other code here (on the CPU, `candidate-cpu`)."
    )


def _rank_medians(rows: pd.DataFrame, column: str) -> list[float]:
    """Per rank, the median over trials of a per-rank list column."""
    lists = [v for v in rows.get(column, pd.Series(dtype=object)) if isinstance(v, list)]
    ranks = range(len(lists[0])) if lists else ()
    return [float(pd.Series([v[r] for v in lists if v[r] is not None]).median()) for r in ranks]


def _last(rows: pd.DataFrame, column: str) -> object:
    return rows[column].iloc[-1] if column in rows and len(rows) else None


def ranks_lines(plan: Plan, table: pd.DataFrame, trials: pd.DataFrame) -> list[str | Table]:
    """The distributed screen's own table: each rank's step, the collective's share and the sharing."""
    ok = stats.finished(trials)
    rows = []
    for _, r in table.iterrows():
        mine = _rows_of(ok, r["scale"], r["arm"])
        per_rank = " / ".join(format_number(ms) for ms in _rank_medians(mine, "rank_ms")) or "n/a"
        here, total = _last(mine, "rank_matrices_here"), _last(mine, "sharing_matrices")
        shared = (
            f"{' + '.join(str(int(h)) for h in here)} of {int(total)}"
            if isinstance(here, list) and None not in here and total is not None and not pd.isna(total)
            else "every rank: all"
        )
        ms, share = _finite(r["collective_ms_median"]), _finite(r["collective_share_median"], format_percent)
        rows.append([r["scale"], r["arm"], format_number(r["ms_median"]), per_rank, ms, share, shared])
    p = plan.protocol
    return [
        f"#### Under a process group of {p.gpus} ranks ({p.backend}: {', '.join(p.rank_devices)})",
        "",
        "ms/step is the slowest rank's; each rank's median beside it. Collective share: its time over one "
        "untimed diagnostic step's (collectives bracketed by synchronizations), the largest over ranks, waiting "
        "included. NS matrices per rank: the Newton-Schulz matrices each rank orthogonalizes "
        "(`optimizer.sharing`); an arm without sharing does all of them on every rank.",
        "",
        Table([*RANK_HEADERS, "NS matrices per rank"], rows, "llrrrrl"),
        "",
    ]


def _main_table(table: pd.DataFrame) -> Table:
    """Per scale × arm: the spine's figures, the floor and the memory."""
    cells = {
        "scale": lambda r: r["scale"],
        "arm": lambda r: r["arm"],
        "trials": lambda r: f"{int(r['trials'])}" + (f" ({int(r['failed'])} failed)" if r["failed"] else ""),
        "ms/step median (min–max)": lambda r: (
            f"{format_number(r['ms_median'])} ({format_number(r['ms_min'])}–{format_number(r['ms_max'])})"
        ),
        "host ms/step": lambda r: format_number(r["host_ms_median"]),
        "floor ms": lambda r: _finite(r["floor_ms_median"]),
        "× floor": lambda r: _finite(r["over_floor"]),
        "extra peak": lambda r: format_bytes(r["extra_peak_bytes_median"]),
        "state": lambda r: format_bytes(r["state_bytes_median"]),
        "aten ops/step": lambda r: _finite(r["ops_per_step_median"], lambda v: f"{v:.0f}"),
        "vs baseline (paired median)": lambda r: (
            "—" if r["role"] == "baseline" else format_percent(r["reduction_vs_baseline_median"])
        ),
    }
    if not table["ops_per_step_median"].notna().any():
        del cells["aten ops/step"]
    return Table.of(cells, (r for _, r in table.iterrows()), "ll" + "r" * (len(cells) - 2))


def report_section(run: Run) -> Section:
    """The screen's report section: tables, crossover and memory plots, and the analysis, from the data."""
    plan, trials, figures_dir, s = run.plan, run.summaries.trials, run.figures_dir, run.plan.settings
    table = summary_table(plan, run.summaries)
    title = "Screen: crossover over scales and padding guards"
    if table.empty:
        return Section(title).add("No measured trial finished: nothing to analyse.")
    lines: list[str | Table | Image] = [
        f"Per scale × arm, measured trials (every figure: `{SUMMARY_CSV}`). ms/step = window / {s['steps']} "
        f"steps after {s['warmup_steps']} warm-up steps; host = host time in `step()`; floor = one captured step "
        f"replayed {s['floor_replays']} times (CUDA graph); extra peak = window peak over what was allocated at "
        "its start; state = what the warm-up steps left allocated.",
        "",
        _main_table(table),
        "",
        *(ranks_lines(plan, table, trials) if plan.protocol.gpus > 1 else ()),
    ]
    notes: dict[str, list[str]] = {}
    for _, r in table[table["floor_note"] != ""].iterrows():
        for note in str(r["floor_note"]).split("; "):
            notes.setdefault(note, []).append(f"{r['scale']} {r['arm']}")
    lines += [f"Floor {note} ({', '.join(where)})." for note, where in notes.items()] + [""]
    labels, scales = plan.arm_labels(), s["scales"]
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
        "Median ms/step per arm (bars: min–max over rounds), log axis; dashed: its launch floor, where captured.",
        "",
        Image(memory, "extra peak memory vs scale"),
        "Median extra peak of one step (window peak over what was allocated at its start).",
    ]
    section = Section.of_lines(title, lines)
    same = same_code_arms(plan)
    for spec in s["guarded_specs"]:
        if spec == s["arm_specs"][0]:
            continue
        guarded = [guard_label(spec, parse_guard(g)) for g in s["guards"]]
        if all(label in same for label in guarded):
            body = [_withheld(guarded, same, "which guard the data supports")]
        else:
            body = guard_analysis(plan, table, trials, spec)
        section.add(Section.of_lines(f"Where padding stops paying (`{spec}`)", body, depth=4))
    if "candidate" in s["arm_specs"][1:]:
        section.add(_targets(plan, table, trials, same))
    if plan.protocol.device == "cpu":
        section.add(
            "This run was on the CPU: no launch floor, no allocator peaks; its timings say nothing about a GPU."
        )
    return section


def _targets(plan: Plan, table: pd.DataFrame, trials: pd.DataFrame, same: dict[str, str]) -> Section:
    """The targets' subsection for the candidate as shipped (or the first screened guard)."""
    s = plan.settings
    default = s["default_guards"].get("candidate")
    candidate, which = "candidate", "the candidate as shipped"
    if "candidate" in s["guarded_specs"] and default in s["guards"]:
        candidate = guard_label("candidate", parse_guard(default))
    elif "candidate" in s["guarded_specs"]:
        candidate = guard_label("candidate", parse_guard(s["guards"][0]))
        which = f"the shipped default g{default} was not screened; the first screened guard instead"
    if candidate in same:
        body = [_withheld([candidate], same, "whether a target is met, and the next step")]
    else:
        body = target_lines(plan, table, trials, candidate)
        body += ["", f"**Next step.** {next_step(table, candidate, s['scales'])}"]
    return Section.of_lines(f"Targets, checked for `{candidate}` ({which})", body, depth=4)
