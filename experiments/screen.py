"""Tier 1, the optimizer-only crossover screen: ``optimizer.step()`` alone on the YOLO26 parameter sets.

For each scale (n, s, m, l, x) one case; its arms are the first arm (the baseline), then every other arm,
once per padding guard for arms whose optimizer class has one (``pad_guard``, the internal knob of
``optimizers.BatchedMuSGD``; an arm without it, such as upstream, runs once). Labels: ``candidate@g256``,
``candidate@g0`` (exact-shape batches only), ``candidate@gnone`` (no limit).

One trial = a fresh optimizer on fresh parameters and gradients, seeded by the round (the arms of one round
see the same values), then:

1. ``W`` untimed warm-up steps (they create the optimizer state and, for the candidate, its batch plan);
2. the claim window: one synchronized bracket (``SyncTimer``) around ``S`` steps. The figure is the window
   total / ``S`` in ms/step. Inside the window nothing synchronizes: host dispatch is the sum over the
   window of the host time from calling ``step()`` to its return (a per-step mean is logged), and the
   step's extra peak memory is the allocator's peak over the window minus what was allocated when the
   window opened (the state already exists then, so it is the step's transient working memory; the state
   itself is logged as ``state_bytes``). With ``W = 0`` the window's first step creates the state, and
   the extra peak includes it;
3. the launch floor, a diagnostic outside the claim bracket: the same step captured once in a CUDA graph
   (after warm-up steps on a side stream, as PyTorch documents; the side stream is the capture stream
   itself, so its per-stream lazy set-up such as the cuBLAS workspace happens before capture) and replayed
   ``K`` times in a synchronized bracket, ms/replay. It is GPU time without host launch cost. Where capture
   is impossible the floor is null and ``floor_note`` says why ('n/a: CPU', 'n/a: capture failed: …').

Why ``--warmup`` counts steps while ``--warmup-trials`` counts trials: the issue's ``W`` is warm-up steps
inside each trial (state, plan, caches of one optimizer); the protocol's warm-up trials (default one per
arm per scale, discarded from the statistics) absorb what a process warms once: CUDA context, cuBLAS,
kernel loading, allocator growth at a new scale.

The guard is set on the trial's own optimizer instance before its first step, so no class (and no other
arm or trial) ever sees it. Parameters and gradients are built once per round on the CPU by
``experiments.workloads`` (the same seed for every arm of the round) and copied to the device for each
trial, so drawing the values does not cost each trial again.

Outputs besides the spine's CSVs: ``screen_summary.csv`` (scale × arm × guard), the crossover and memory
plots and the report section (``report_section``), which states from the data where padding stops paying,
which guard the data supports and how the candidate stands against the issue's targets.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from experiments import workloads
from experiments.arms import checked_optimizer, make_optimizer
from harness import plots, stats
from harness.formatting import format_bytes, format_number, format_percent
from harness.options import (
    InputError,
    check_choice,
    check_non_negative,
    check_positive,
    protocol_options,
    split_list,
)
from harness.protocol import Arm, Case, Plan, TrialContext, TrialFunction
from harness.report import markdown_image, markdown_table
from harness.stats import finished, numeric_column
from harness.tables import PLAN, RunFolder, Summaries
from harness.timing import SyncTimer, current_allocated, is_cuda, read_peaks, reset_peaks

GUARD_ATTRIBUTE = "pad_guard"  # an optimizer class with this attribute has a padding guard (None = no limit)
NO_LIMIT = "none"
NO_GUARD = "no-guard"  # the arm's class has no guard (not "n/a": pandas reads that as NaN)
DEFAULT_GUARD = "default"  # the first arm of a guarded class runs at its class default
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
FLOOR_WARMUP_STEPS = 2  # steps on the capture stream before capture (the state already exists by then)
SUMMARY_CSV = "screen_summary.csv"
CROSSOVER_PNG = "screen_crossover.png"
MEMORY_PNG = "screen_memory.png"

# Targets of issue 4 (a report, not a test).
FLOOR_TARGET = 1.5  # candidate ≤ 1.5 × its own launch floor
UPSTREAM_SPEEDUP_AT_N = 4.0  # candidate ≥ 4 × faster than upstream at n
BOUND_SHARE = 0.8  # a step is 'bound' by host dispatch (or GPU time) when that explains ≥ 80% of it

DEFAULTS = {
    "scales": "n,s,m,l,x",
    "guards": "0,256,512,none",
    "arms": "baseline,candidate",
    "steps": 10,
    "repeats": 5,
    "warmup": 2,
    "warmup_trials": 1,
    "floor_replays": 20,
    "dtype": "float32",
}


# --- options → plan ---------------------------------------------------------------------------------------


def parse_guard(text: str) -> int | None:
    """``'256'`` → 256, ``'none'`` → None (no limit); ``InputError`` for anything else."""
    if text.strip().lower() == NO_LIMIT:
        return None
    if not (text.strip().isascii() and text.strip().isdigit()):  # '²' is a digit to str.isdigit, not to int()
        raise InputError(
            f"--guards: '{text}' is not a guard; use whole numbers ≥ 0 or 'none', e.g. 0,256,512,none"
        )
    return int(text)


def guard_name(guard: int | None) -> str:
    return NO_LIMIT if guard is None else str(guard)


def guard_label(spec: str, guard: int | None) -> str:
    """The arm label of ``spec`` at one guard: ``candidate@g256``, ``candidate@gnone``."""
    return f"{spec}@g{guard_name(guard)}"


def has_guard(optimizer_class: type) -> bool:
    return hasattr(optimizer_class, GUARD_ATTRIBUTE)


def parse_scales(text: str) -> list[str]:
    scales = split_list("--scales", text)
    for scale in scales:
        check_choice("--scales", scale, workloads.SCALES)
    if len(set(scales)) != len(scales):
        raise InputError(
            f"--scales '{text}' names a scale twice; name each of {', '.join(workloads.SCALES)} once"
        )
    return scales


def parse_guards(text: str) -> list[int | None]:
    guards = [parse_guard(item) for item in split_list("--guards", text)]
    if len(set(guards)) != len(guards):
        raise InputError(f"--guards '{text}' names a guard twice; name each once")
    return guards


def build_cases(
    scales: list[str], guards: list[int | None], arms: tuple[Arm, ...], guarded: set[str]
) -> list[Case]:
    """One case per scale: the first arm as given, then each other arm, once per guard if it has one."""
    cases = []
    for scale in scales:
        first = arms[0]
        case_arms = [
            Arm(
                first.label,
                "baseline",
                first.spec,
                {"guard": DEFAULT_GUARD if first.spec in guarded else NO_GUARD},
            )
        ]
        for arm in arms[1:]:
            if arm.spec in guarded:
                case_arms += [
                    Arm(guard_label(arm.spec, g), "candidate", arm.spec, {"guard": guard_name(g)})
                    for g in guards
                ]
            else:
                case_arms.append(Arm(arm.label, "candidate", arm.spec, {"guard": NO_GUARD}))
        cases.append(Case(scale, {"scale": scale, "model": f"yolo26{scale}"}, tuple(case_arms)))
    return cases


def make_plan(
    scales: str = DEFAULTS["scales"],
    guards: str = DEFAULTS["guards"],
    arms: str = DEFAULTS["arms"],
    steps: int = DEFAULTS["steps"],
    repeats: int = DEFAULTS["repeats"],
    warmup: int = DEFAULTS["warmup"],
    warmup_trials: int = DEFAULTS["warmup_trials"],
    floor_replays: int = DEFAULTS["floor_replays"],
    dtype: str = DEFAULTS["dtype"],
    device: str = "cuda",
    seed: int = 0,
    order: str = "alternate",
    bar: float | None = None,
    command: str = "",
) -> Plan:
    """Check every option (``InputError`` with one line on the first bad one) and describe the screen.

    ``repeats`` = measured rounds per scale (the protocol's pairs); ``warmup`` = untimed warm-up steps inside
    each trial; ``warmup_trials`` = discarded warm-up trials per arm per scale, before the rounds.
    """
    check_positive("--steps", steps)
    check_positive("--repeats", repeats)
    check_non_negative("--warmup", warmup)
    check_non_negative("--warmup-trials", warmup_trials)
    check_positive("--floor-replays", floor_replays)
    check_choice("--dtype", dtype, tuple(DTYPES))
    scale_list = parse_scales(scales)
    guard_list = parse_guards(guards)
    shared = protocol_options(arms, 0, repeats, order, seed, bar, device, None, False)
    guarded: set[str] = set()
    default_guards: dict[str, str] = {}
    for arm in shared.arms:
        optimizer_class = checked_optimizer(arm.spec)
        if has_guard(optimizer_class):
            guarded.add(arm.spec)
            default_guards[arm.spec] = guard_name(getattr(optimizer_class, GUARD_ATTRIBUTE))
    cases = build_cases(scale_list, guard_list, shared.arms, guarded)
    arms_per_case = len(cases[0].arms)
    return Plan(
        tier="screen",
        factory="experiments.screen:make_trial_function",
        unit="ms/step",
        metric="optimizer step time (window total / steps)",
        cases=cases,
        warmup=warmup_trials * arms_per_case,
        pairs=repeats,
        order=shared.order,
        seed=shared.seed,
        bar=shared.bar,
        device=shared.device,
        options={
            "scales": scale_list,
            "guards": [guard_name(g) for g in guard_list],
            "arm_specs": [a.spec for a in shared.arms],
            "guarded_specs": sorted(guarded),
            "default_guards": default_guards,
            "steps": steps,
            "warmup_steps": warmup,
            "warmup_trials_per_arm": warmup_trials,
            "floor_replays": floor_replays,
            "floor_warmup_steps": FLOOR_WARMUP_STEPS,
            "dtype": dtype,
        },
        command=command,
        isolation="in-process; a fresh optimizer on fresh parameters and gradients (seeded by the round) per trial",
        timed_region=(
            f"{steps} optimizer.step() calls after {warmup} untimed warm-up steps, in one synchronized bracket "
            "(no synchronization inside); the launch floor (CUDA-graph replay) is measured after it, outside"
        ),
        sections="experiments.screen:report_section",
    )


# --- one trial --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialSettings:
    """What every trial of a screen does, read from ``plan.options``."""

    steps: int
    warmup_steps: int
    floor_replays: int
    dtype: torch.dtype

    @classmethod
    def from_plan(cls, plan: Plan) -> TrialSettings:
        o = plan.options
        return cls(int(o["steps"]), int(o["warmup_steps"]), int(o["floor_replays"]), DTYPES[o["dtype"]])


class WorkloadCache:
    """Parameters and gradients of one (scale, seed, dtype), drawn once on the CPU and copied per trial.

    The arms of a round share the seed, so all but the first arm of a round copy instead of drawing again.
    Only the latest workload is kept (one scale's values at a time).
    """

    def __init__(self) -> None:
        self.key: tuple[str, int, torch.dtype] | None = None
        self.groups: list[dict[str, Any]] = []
        self.kwargs: dict[str, float] = {}

    def fresh(
        self, scale: str, seed: int, dtype: torch.dtype, device: str
    ) -> tuple[list[dict[str, Any]], dict]:
        """New parameter tensors with gradients on ``device``, equal to the seeded workload's values."""
        key = (scale, seed, dtype)
        if key != self.key:
            self.key, self.groups = None, []  # drop the old workload before drawing the next
            groups, self.kwargs = workloads.build_param_groups(scale, "cpu", dtype, seed)
            workloads.fill_synthetic_grads(groups, seed)
            self.groups, self.key = groups, key
        copies = []
        for group in self.groups:
            params = []
            for source in group["params"]:
                param = torch.nn.Parameter(
                    source.detach().to(device, copy=True), requires_grad=source.requires_grad
                )
                if source.grad is not None:
                    param.grad = source.grad.to(device, copy=True)
                params.append(param)
            copies.append({**group, "params": params})
        return copies, dict(self.kwargs)


def make_trial_function(plan: Plan) -> TrialFunction:
    """The screen's trial function (``plan.factory``): one timed window and one floor per trial."""
    settings = TrialSettings.from_plan(plan)
    cache = WorkloadCache()

    def trial(ctx: TrialContext) -> dict[str, Any]:
        groups, kwargs = cache.fresh(ctx.case.params["scale"], ctx.seed, settings.dtype, ctx.device)
        return run_trial(ctx.arm, groups, kwargs, ctx.device, settings)

    return trial


def make_arm_optimizer(
    arm: Arm, groups: list[dict[str, Any]], kwargs: dict[str, float]
) -> torch.optim.Optimizer:
    """The arm's optimizer over ``groups``, its guard (if the arm has one) set on this instance only.

    Setting the guard on the instance, before its first step, means no class attribute ever changes: the
    next trial, of any arm, starts from the class default whatever happened in this one.
    """
    optimizer = make_optimizer(arm.spec, groups, kwargs)
    guard = arm.params.get("guard", NO_GUARD)
    if guard not in (NO_GUARD, DEFAULT_GUARD):
        setattr(optimizer, GUARD_ATTRIBUTE, parse_guard(guard))
    return optimizer


def run_trial(
    arm: Arm, groups: list[dict[str, Any]], kwargs: dict[str, float], device: str, settings: TrialSettings
) -> dict[str, Any]:
    """Warm-up steps, the timed window, then the launch floor, on a fresh optimizer of ``arm``."""
    optimizer = make_arm_optimizer(arm, groups, kwargs)
    guard_in_effect = (
        guard_name(getattr(optimizer, GUARD_ATTRIBUTE)) if has_guard(type(optimizer)) else NO_GUARD
    )
    allocated_at_start = current_allocated(device)
    for _ in range(settings.warmup_steps):
        optimizer.step()
    figures = time_window(optimizer, device, settings.steps)
    if allocated_at_start is not None and figures["allocated_at_window"] is not None:
        figures["state_bytes"] = figures["allocated_at_window"] - allocated_at_start
    else:
        figures["state_bytes"] = None
    figures.update(launch_floor(optimizer, device, settings.floor_replays))
    figures.update(guard_in_effect=guard_in_effect, steps=settings.steps, warmup_steps=settings.warmup_steps)
    return figures


def time_window(optimizer: torch.optim.Optimizer, device: str, steps: int) -> dict[str, Any]:
    """``steps`` steps in one synchronized bracket: ms/step, host dispatch ms/step and the step's extra peak.

    Nothing inside the bracket synchronizes: the host clock is read around each ``step()`` call only, and
    the allocator's peak is reset before the bracket opens and read after it closes.
    """
    allocated = current_allocated(device)
    reset_peaks(device)
    host_ns = 0
    with SyncTimer(device) as bracket:
        for _ in range(steps):
            called = time.perf_counter_ns()
            optimizer.step()
            host_ns += time.perf_counter_ns() - called
    peak_allocated, peak_reserved = read_peaks(device)
    extra = peak_allocated - allocated if peak_allocated is not None and allocated is not None else None
    return {
        "value": bracket.seconds * 1e3 / steps,
        "window_ms": bracket.seconds * 1e3,
        "host_ms": host_ns / 1e6 / steps,
        "allocated_at_window": allocated,
        "extra_peak_bytes": extra,
        "peak_allocated": peak_allocated,
        "peak_reserved": peak_reserved,
    }


_CAPTURE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per device for every capture of the run (its lazy per-stream set-up happens once)."""
    if device not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[device] = torch.cuda.Stream(device)
    return _CAPTURE_STREAMS[device]


def capture_step(optimizer: torch.optim.Optimizer, device: torch.device) -> torch.cuda.CUDAGraph:
    """One ``step()`` captured in a CUDA graph, after warm-up steps on the side stream (PyTorch's recipe)."""
    side = capture_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(FLOOR_WARMUP_STEPS):
            optimizer.step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # The outer stream context restores the current stream even if capture_end raises inside graph.__exit__.
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        optimizer.step()
    return graph


def _reason(exc: BaseException) -> str:
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first_line}"[:200]


def launch_floor(optimizer: torch.optim.Optimizer, device: str, replays: int) -> dict[str, Any]:
    """ms per replay of the captured step (``floor_ms``), or None with ``floor_note`` saying why."""
    if not is_cuda(device):
        return {
            "floor_ms": None,
            "floor_note": "n/a: CPU (CUDA graphs need a CUDA device)",
            "floor_replays": 0,
        }
    dev = torch.device(device)
    with torch.cuda.device(dev):
        try:
            graph = capture_step(optimizer, dev)
        except Exception as exc:  # noqa: BLE001 - a step that cannot be captured is a recorded fact
            torch.cuda.synchronize(dev)
            return {
                "floor_ms": None,
                "floor_note": f"n/a: capture failed: {_reason(exc)}",
                "floor_replays": 0,
            }
        try:
            graph.replay()  # the first replay uploads the graph; not timed
            with SyncTimer(dev) as bracket:
                for _ in range(replays):
                    graph.replay()
        except Exception as exc:  # noqa: BLE001
            return {"floor_ms": None, "floor_note": f"n/a: replay failed: {_reason(exc)}", "floor_replays": 0}
        finally:
            del graph
    return {"floor_ms": bracket.seconds * 1e3 / replays, "floor_note": "", "floor_replays": replays}


# --- summary ----------------------------------------------------------------------------------------------

SUMMARY_COLUMNS = [
    "scale",
    "arm",
    "spec",
    "role",
    "guard",
    "trials",
    "failed",
    "ms_median",
    "ms_min",
    "ms_max",
    "host_ms_median",
    "floor_ms_median",
    "floor_note",
    "over_floor",
    "extra_peak_bytes_median",
    "extra_peak_bytes_max",
    "state_bytes_median",
    "peak_allocated_median",
    "reduction_vs_baseline_median",
    "reduction_vs_baseline_min",
    "reduction_vs_baseline_max",
    "ci_low",
    "ci_high",
]


def _median(rows: pd.DataFrame, column: str) -> float:
    values = numeric_column(rows, column)
    return float(values.median()) if len(values) else math.nan


def summary_table(plan: Plan, summaries: Summaries) -> pd.DataFrame:
    """One row per scale × arm (× guard): the spine's median and range, plus the screen's own figures."""
    trials = summaries.trials
    ok = finished(trials)
    arms = summaries.arms.set_index(["case", "arm"]) if not summaries.arms.empty else None
    claims = summaries.claims.set_index(["case", "arm"]) if not summaries.claims.empty else None
    rows = []
    for case in plan.cases:
        for arm in case.arms:
            key = (case.label, arm.label)
            if arms is None or key not in arms.index:
                continue
            spine = arms.loc[key]
            mine = ok[(ok["case"] == case.label) & (ok["arm"] == arm.label)] if not ok.empty else ok
            notes = sorted({str(n) for n in mine.get("floor_note", pd.Series(dtype=str)).dropna() if str(n)})
            floor = _median(mine, "floor_ms")
            claim = claims.loc[key] if claims is not None and key in claims.index else None
            rows.append(
                {
                    "scale": case.label,
                    "arm": arm.label,
                    "spec": arm.spec,
                    "role": arm.role,
                    "guard": arm.params.get("guard", NO_GUARD),
                    "trials": int(spine["trials"]),
                    "failed": int(spine["failed"]),
                    "ms_median": float(spine["median"]),
                    "ms_min": float(spine["min"]),
                    "ms_max": float(spine["max"]),
                    "host_ms_median": _median(mine, "host_ms"),
                    "floor_ms_median": floor,
                    "floor_note": "; ".join(notes),
                    "over_floor": float(spine["median"]) / floor
                    if floor and math.isfinite(floor)
                    else math.nan,
                    "extra_peak_bytes_median": _median(mine, "extra_peak_bytes"),
                    "extra_peak_bytes_max": float(
                        pd.to_numeric(mine["extra_peak_bytes"], errors="coerce").max()
                    )
                    if "extra_peak_bytes" in mine and len(mine)
                    else math.nan,
                    "state_bytes_median": _median(mine, "state_bytes"),
                    "peak_allocated_median": _median(mine, "peak_allocated"),
                    "reduction_vs_baseline_median": float(claim["median"]) if claim is not None else math.nan,
                    "reduction_vs_baseline_min": float(claim["min"]) if claim is not None else math.nan,
                    "reduction_vs_baseline_max": float(claim["max"]) if claim is not None else math.nan,
                    "ci_low": float(claim["ci_low"]) if claim is not None else math.nan,
                    "ci_high": float(claim["ci_high"]) if claim is not None else math.nan,
                }
            )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def write_screen_summary(folder: RunFolder, summaries: Summaries) -> pd.DataFrame:
    """Write ``screen_summary.csv`` into the run folder and return it."""
    plan = Plan.from_json(folder.read_json(PLAN))
    table = summary_table(plan, summaries)
    folder.write_csv(SUMMARY_CSV, table)
    return table


# --- analysis (from the data) -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Paired:
    """Arm ``a`` against arm ``b`` over the rounds of one scale: per round (b − a) / b (positive = a faster)."""

    rounds: int
    a_faster: int
    median: float

    def text(self, a: str, b: str) -> str:
        if not self.rounds:
            return f"no common round of {a} and {b}"
        if math.isinf(self.median) and self.median < 0:
            return f"{a} failed where {b} finished (paired median; {a} faster in {self.a_faster} of {self.rounds} rounds)"
        direction = "faster" if self.median > 0 else ("slower" if self.median < 0 else "no faster")
        return (
            f"{a} {direction} than {b} by {format_percent(abs(self.median))} (paired median; {a} faster in "
            f"{self.a_faster} of {self.rounds} rounds)"
        )


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


def _ms(row: pd.Series | None) -> float:
    return math.nan if row is None else float(row["ms_median"])


def guard_analysis(
    plan: Plan, table: pd.DataFrame, trials: pd.DataFrame, spec: str
) -> tuple[list[str], str | None]:
    """Markdown lines on where padding stops paying for ``spec``, and the guard the data supports."""
    guards = list(plan.options["guards"])
    labels = {g: guard_label(spec, parse_guard(g)) for g in guards}
    lines: list[str] = []
    best_by_scale: dict[str, float] = {}
    rows = []
    for scale in plan.options["scales"]:
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
        return [f"No finished trial of `{spec}` at any guard."], None
    lines.append(f"Per scale, `{spec}` ms/step (median) at each guard, and the fastest guard:")
    lines.append("")
    lines.append(
        markdown_table(
            ["scale", "fastest guard"] + [f"g{g}" for g in guards] + ["fastest vs next"],
            rows,
            "ll" + "r" * len(guards) + "l",
        )
    )
    lines.append("")

    # Where the unguarded arm (or the largest guard) turns slower than the default guard and than exact shapes.
    widest = NO_LIMIT if NO_LIMIT in guards else max((g for g in guards), key=lambda g: int(g))
    for reference in [
        g for g in (plan.options["default_guards"].get(spec), "0") if g in guards and g != widest
    ]:
        turned = []
        for scale in plan.options["scales"]:
            comparison = paired(trials, scale, labels[widest], labels[reference])
            if comparison.rounds and comparison.median < 0:
                turned.append(f"{scale} ({comparison.text(labels[widest], labels[reference])})")
        if turned:
            lines.append(
                f"- `{labels[widest]}` is slower than `{labels[reference]}` at: " + "; ".join(turned) + "."
            )
        else:
            lines.append(
                f"- `{labels[widest]}` is never slower than `{labels[reference]}` in this data "
                "(paired medians)."
            )
    if "0" in guards and len(guards) > 1:
        pays = []
        for scale in plan.options["scales"]:
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
        lines.append(
            f"**The data supports guard {supported}** (`{labels[supported]}`): across the scales its median is at "
            f"most {format_number(ratio)}× the fastest guard's (worst at {where}); the other guards' worst cases: "
            + ", ".join(
                f"g{g} {format_number(worst[g][0])}× at {worst[g][1]}"
                if g in worst
                else f"g{g} did not finish at every scale"
                for g in guards
                if g != supported
            )
            + "."
        )
        default = plan.options["default_guards"].get(spec)
        if default is not None and default != supported and default in worst:
            lines.append(
                f"The shipped default is g{default} (worst {format_number(worst[default][0])}× the fastest)."
            )
    return lines, supported


def target_lines(plan: Plan, table: pd.DataFrame, trials: pd.DataFrame, candidate: str) -> list[str]:
    """The issue's targets for the candidate arm ``candidate``, checked scale by scale against the data."""
    baseline = plan.cases[0].arms[0].label
    upstream = next((a.label for a in plan.cases[0].arms if a.spec == "upstream"), None)
    scales = plan.options["scales"]
    rows = []
    misses: list[str] = []

    def add(target: str, scale: str, figure: str, met: bool | None, bound: str) -> None:
        verdict = "n/a" if met is None else ("met" if met else "**missed**")
        rows.append([target, scale, figure, verdict, bound if met is False else ""])
        if met is False:
            misses.append(f"{target} at {scale}: {figure}; bound by {bound}")

    for scale in scales:
        mine = _row(table, scale, candidate)
        if mine is None:
            continue
        ms, host, floor = (
            float(mine["ms_median"]),
            float(mine["host_ms_median"]),
            float(mine["floor_ms_median"]),
        )
        bound = (
            bound_by(ms, host, floor) if is_cuda(plan.device) else "n/a on the CPU (host and device are one)"
        )
        if math.isfinite(floor):
            ratio = ms / floor
            add(
                f"≤ {FLOOR_TARGET:g}× own floor",
                scale,
                f"{format_number(ms)} ms = {format_number(ratio)}× floor {format_number(floor)} ms "
                f"({'under' if ratio <= FLOOR_TARGET else 'over'} by {format_number(abs(ms - FLOOR_TARGET * floor))} ms)",
                ratio <= FLOOR_TARGET,
                bound,
            )
        else:
            add(
                f"≤ {FLOOR_TARGET:g}× own floor",
                scale,
                f"floor {mine['floor_note'] or 'not measured'}",
                None,
                "",
            )
        theirs = _row(table, scale, upstream) if upstream else None
        if theirs is not None:
            speedup = _ms(theirs) / ms
            need = UPSTREAM_SPEEDUP_AT_N if scale == "n" else 1.0
            comparison = paired(trials, scale, candidate, upstream)
            add(
                f"≥ {need:g}× faster than upstream" if scale == "n" else "faster than upstream",
                scale,
                f"{format_number(speedup)}× ({format_number(_ms(theirs))} vs {format_number(ms)} ms; faster in "
                f"{comparison.a_faster} of {comparison.rounds} rounds)",
                speedup >= need if scale == "n" else speedup > 1,
                bound,
            )
            peak_mine, peak_theirs = (
                float(mine["extra_peak_bytes_median"]),
                float(theirs["extra_peak_bytes_median"]),
            )
            if math.isfinite(peak_mine) and math.isfinite(peak_theirs):
                add(
                    "extra peak ≤ upstream's",
                    scale,
                    f"{format_bytes(peak_mine)} vs {format_bytes(peak_theirs)} "
                    f"({'+' if peak_mine > peak_theirs else '−'}{format_bytes(abs(peak_mine - peak_theirs))})",
                    peak_mine <= peak_theirs,
                    memory_bound(table, scale, candidate),
                )
            else:
                add("extra peak ≤ upstream's", scale, "not measurable here (no CUDA allocator)", None, "")
        else:
            add("vs upstream", scale, "upstream not in this run", None, "")
        versus = paired(trials, scale, candidate, baseline)
        if versus.rounds:
            add(
                "never slower than baseline",
                scale,
                f"{'faster' if versus.median > 0 else 'slower'} by {format_percent(abs(versus.median))} (paired "
                f"median; faster in {versus.a_faster} of {versus.rounds} rounds)",
                versus.a_faster == versus.rounds,
                bound,
            )
    lines = [
        markdown_table(
            ["target", "scale", "figure", "verdict", "what bounds it (where missed)"], rows, "lllll"
        )
    ]
    lines.append("")
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
    ms, host, floor = (
        float(worst["ms_median"]),
        float(worst["host_ms_median"]),
        float(worst["floor_ms_median"]),
    )
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


def report_section(folder: RunFolder, summaries: Summaries, figures_dir: Path) -> str:
    """The screen's report section: tables, crossover and memory plots, and the analysis, from the data."""
    plan = Plan.from_json(folder.read_json(PLAN))
    table = write_screen_summary(folder, summaries)
    trials = summaries.trials
    lines = ["### Screen: crossover over scales and padding guards", ""]
    if table.empty:
        return "\n".join(lines + ["No measured trial finished: nothing to analyse."])
    lines.append(
        f"Per scale × arm (measured trials; `{SUMMARY_CSV}` in the run folder holds every figure). ms/step = window "
        f"total / {plan.options['steps']} steps after {plan.options['warmup_steps']} warm-up steps; host = host "
        "time inside `step()` per step, no synchronization; floor = one captured step replayed "
        f"{plan.options['floor_replays']} times (CUDA graph); extra peak = allocator peak over the window minus "
        "what was allocated when it opened (state excluded; state = what the warm-up steps left allocated)."
    )
    lines.append("")
    rows = []
    for _, r in table.iterrows():
        floor = format_number(r["floor_ms_median"]) if math.isfinite(r["floor_ms_median"]) else "n/a"
        rows.append(
            [
                r["scale"],
                r["arm"],
                f"{int(r['trials'])}" + (f" ({int(r['failed'])} failed)" if r["failed"] else ""),
                f"{format_number(r['ms_median'])} ({format_number(r['ms_min'])}–{format_number(r['ms_max'])})",
                format_number(r["host_ms_median"]),
                floor,
                format_number(r["over_floor"]) if math.isfinite(r["over_floor"]) else "n/a",
                format_bytes(r["extra_peak_bytes_median"]),
                format_bytes(r["state_bytes_median"]),
                "—" if r["role"] == "baseline" else format_percent(r["reduction_vs_baseline_median"]),
            ]
        )
    lines.append(
        markdown_table(
            [
                "scale",
                "arm",
                "trials",
                "ms/step median (min–max)",
                "host ms/step",
                "floor ms",
                "× floor",
                "extra peak",
                "state",
                "vs baseline (paired median)",
            ],
            rows,
            "llrrrrrrrr",
        )
    )
    lines.append("")
    notes: dict[str, list[str]] = {}
    for _, r in table[table["floor_note"] != ""].iterrows():
        for note in str(r["floor_note"]).split("; "):
            notes.setdefault(note, []).append(f"{r['scale']} {r['arm']}")
    for note, where in notes.items():
        lines.append(f"Floor {note} ({', '.join(where)}).")
    if notes:
        lines.append("")

    labels = plots.arm_order(plan)
    lines_table = table.rename(
        columns={
            "scale": "x",
            "arm": "series",
            "ms_median": "median",
            "ms_min": "low",
            "ms_max": "high",
            "floor_ms_median": "floor",
        }
    )
    crossover = plots.plot_crossover(
        lines_table,
        labels,
        plan.options["scales"],
        figures_dir / CROSSOVER_PNG,
        title="optimizer step vs scale (floors dashed)",
    )
    memory_table = table.rename(columns={"scale": "x", "arm": "series", "extra_peak_bytes_median": "bytes"})
    memory = plots.plot_memory(
        memory_table,
        labels,
        plan.options["scales"],
        figures_dir / MEMORY_PNG,
        title="extra peak memory of one step vs scale",
    )
    lines += [
        markdown_image(crossover, "crossover: ms/step vs scale"),
        "",
        "Median ms/step per arm (bars: min–max over rounds), log axis; dashed: the same arm's launch floor "
        "(CUDA-graph replay), where it could be captured.",
        "",
        markdown_image(memory, "extra peak memory vs scale"),
        "",
        "Median extra peak of one step (allocator peak over the window minus what was allocated when it opened).",
    ]

    for spec in plan.options["guarded_specs"]:
        if spec == plan.options["arm_specs"][0]:
            continue
        guard_text, supported = guard_analysis(plan, table, trials, spec)
        lines += ["", f"#### Where padding stops paying (`{spec}`)", ""] + guard_text

    if "candidate" in plan.options["arm_specs"][1:]:
        default = plan.options["default_guards"].get("candidate")
        if "candidate" not in plan.options["guarded_specs"]:
            candidate, which = "candidate", "the candidate as shipped"
        elif default in plan.options["guards"]:
            candidate, which = guard_label("candidate", parse_guard(default)), "the candidate as shipped"
        else:
            candidate = guard_label("candidate", parse_guard(plan.options["guards"][0]))
            which = f"the shipped default g{default} was not screened; the first screened guard instead"
        lines += ["", f"#### Targets (issue 4), checked for `{candidate}` ({which})", ""]
        lines += target_lines(plan, table, trials, candidate)
        lines += ["", f"**Next step.** {next_step(table, candidate, plan.options['scales'])}"]
    if plan.device == "cpu":
        lines += [
            "",
            "This run was on the CPU: no launch floor, no allocator peaks; its timings say nothing about "
            "a GPU.",
        ]
    return "\n".join(lines)
