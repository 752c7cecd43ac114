"""The complete-fit tier's words: its report section, its claim text and the stage-share analysis."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.fit.plan import FitSettings
from experiments.fit.plots import plot_fit_stage_shares
from experiments.fit.stages import OPTIMIZER_STAGE, STAGES, stage_column
from harness.codepaths import same_code_arms, verdict_shown, what_ran
from harness.formatting import (
    claim_limit,
    format_bytes,
    format_interval,
    format_levels,
    format_limit,
    format_number,
    format_percent,
    format_value,
    is_missing,
    method_label,
)
from harness.plan import Plan
from harness.present.model import Image, Section, Table
from harness.present.run_view import claim_sentence, pairs_words, warmup_words
from harness.stats import finished, median_of, numeric_column, secondary_claims
from harness.tier import Run

STAGES_CSV = "stages.csv"
STEADY_CLAIMS_CSV = "steady_claims.csv"
STEADY_COLUMN = "steady_s"


def steady_claims(run: Run) -> pd.DataFrame:
    """The paired statistics of the steady-state figure ``steady_s``; empty where no fit carries it."""
    if FitSettings.from_dict(run.plan.settings).stages:
        return pd.DataFrame()
    return secondary_claims(run.summaries.trials, run.plan.protocol, STEADY_COLUMN)


def _by_arm(plan: Plan, rows: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Each arm of the plan that has rows, with its rows, in the plan's order."""
    return [(arm, mine) for arm in plan.arm_labels() if not (mine := rows[rows["arm"] == arm]).empty]


def stage_table(plan: Plan, trials: pd.DataFrame) -> pd.DataFrame:
    """Per arm and stage: median seconds over measured trials and the share of the median stage total."""
    rows = finished(trials)
    columns = ["arm", "stage", "median_s", "share", "fit_median_s", "trials"]
    if rows.empty or stage_column(OPTIMIZER_STAGE) not in rows:
        return pd.DataFrame(columns=columns)
    out = []
    for arm, mine in _by_arm(plan, rows):
        medians = {s: float(pd.to_numeric(mine[stage_column(s)]).median()) for s in STAGES}
        total = sum(medians.values())
        fit_median = float(pd.to_numeric(mine["value"]).median())
        out += [
            [arm, stage, median, median / total if total > 0 else float("nan"), fit_median, len(mine)]
            for stage, median in medians.items()
        ]
    return pd.DataFrame(out, columns=columns)


def _optimizer_stage(table: pd.DataFrame, arm: str) -> tuple[float, float, float]:
    """An arm's optimizer stage in a stage table: (median seconds, share of its fit, its stages' total)."""
    mine = table[table["arm"] == arm].set_index("stage")
    optimizer = mine.loc[OPTIMIZER_STAGE]
    return float(optimizer["median_s"]), float(optimizer["share"]), float(mine["median_s"].sum())


def _implied(table: pd.DataFrame, reference: str, arm: str) -> tuple[float, float]:
    """The whole-fit saving the optimizer stages' difference implies, and the part of the ceiling it reaches."""
    optimizer_s, _, total = _optimizer_stage(table, reference)
    saved = optimizer_s - _optimizer_stage(table, arm)[0]
    return saved / total if total else math.nan, saved / optimizer_s if optimizer_s else math.nan


def stage_findings(plan: Plan, table: pd.DataFrame) -> list[str]:
    """The ceiling and the stage-implied saving, in sentences derived from the stage table."""
    if table.empty:
        return []
    labels = [a for a in plan.arm_labels() if a in set(table["arm"])]
    reference = labels[0]
    optimizer_s, optimizer_share, total = _optimizer_stage(table, reference)
    lines = [
        f"Ceiling: in {reference}'s fits the optimizer step is {format_percent(optimizer_share)} of the fit "
        f"({format_value(optimizer_s, 's')} of {format_value(total, 's')}), so a change to the optimizer alone "
        f"can save at most {format_percent(optimizer_share)} of the whole fit, even if its step took no time."
    ]
    for arm in labels[1:]:
        arm_s, arm_share, _ = _optimizer_stage(table, arm)
        implied, reached = _implied(table, reference, arm)
        lines.append(
            f"{arm}: optimizer step {format_value(arm_s, 's')} "
            f"({format_percent(arm_share)} of its fit); the stage difference alone "
            f"implies a whole-fit saving of {format_percent(implied)} "
            f"({format_percent(reached)} of the ceiling reached)."
        )
    lines.append(
        "These shares come from a run synchronized at every stage boundary: they bound the claim, never make it."
    )
    return lines


_COMPARABLE = ("workload", "model", "data", "steps", "images", "batch", "imgsz", "amp")  # what a fit measures


def claim_bounds(run: Run, others: Sequence[Run]) -> list[tuple[Run, str]]:
    """What a stages run of the same fit among a report's other runs says bounds each claim of this run."""
    settings = FitSettings.from_dict(run.plan.settings)
    if settings.stages or run.summaries.claims.empty:
        return []
    specs = {a.label: a.spec for case in run.plan.cases for a in case.arms}
    found = []
    for other in others:
        if other.plan.tier != "stages":
            continue
        theirs = FitSettings.from_dict(other.plan.settings)
        if any(getattr(theirs, key) != getattr(settings, key) for key in _COMPARABLE):
            continue
        table = stage_table(other.plan, other.summaries.trials)
        if table.empty:
            continue
        label_of = {
            a.spec: a.label for case in other.plan.cases for a in case.arms if a.label in set(table["arm"])
        }
        for _, claim in run.summaries.claims.iterrows():
            arm, base = str(claim["arm"]), str(claim["baseline_arm"])
            if claim["kind"] == "control" or specs[arm] not in label_of or specs[base] not in label_of:
                continue
            reference, theirs_arm = label_of[specs[base]], label_of[specs[arm]]
            _, share, _ = _optimizer_stage(table, reference)
            implied, reached = _implied(table, reference, theirs_arm)
            found.append(
                (
                    other,
                    f"{arm} vs {base} ({format_percent(claim['estimate'])}): {reference}'s optimizer step is "
                    f"{format_percent(share)} of its fit there (the most an optimizer-only change can save), "
                    f"and the optimizer stages' difference implies {format_percent(implied)} "
                    f"({format_percent(reached)} of that ceiling).",
                )
            )
    return found


def step_findings(plan: Plan, trials: pd.DataFrame) -> list[str]:
    """Per arm, the optimizer stage's first step and median of the rest, and how the step's core ran."""
    rows = finished(trials)
    if "stage_optimizer_first_s" not in rows:
        return []
    rows = rows[pd.to_numeric(rows["stage_optimizer_first_s"], errors="coerce").notna()]
    steps = FitSettings.from_dict(plan.settings).steps
    lines = []
    for arm, mine in _by_arm(plan, rows):
        last = mine.iloc[-1]
        graphs = last.get("optimizer_graphs")
        core = f"; its core ran: {graphs}" if isinstance(graphs, str) and graphs else ""
        host = pd.to_numeric(last.get("stage_optimizer_host_median_s"), errors="coerce")
        host_text = (
            f" ({format_value(1e3 * float(host), 'ms')} of it on the host before the device was waited for)"
            if pd.notna(host)
            else ""
        )
        lines.append(
            f"{arm}: the first optimizer step took {format_value(float(last['stage_optimizer_first_s']), 's')}, "
            f"the median of the other {steps - 1} "
            f"{format_value(1e3 * float(last['stage_optimizer_step_median_s']), 'ms')}{host_text}{core}."
        )
    return lines


def _settings_section(plan: Plan) -> Section:
    """The fit's settings, a row each; rows that do not apply to its workload or ranks are left out."""
    s, protocol = FitSettings.from_dict(plan.settings), plan.protocol
    real, ranks = s.workload == "ultralytics", protocol.gpus
    sizes = f"{s.images} train + {s.val_images} val images, {s.imgsz} px, seed {protocol.seed}"
    synthetic = (
        f"synthetic: {sizes} (generated once under {s.data_cache})"
        if real
        else f"synthetic in memory: {sizes}"
    )
    per_rank = (
        f"{ranks} data-parallel ranks ({protocol.backend}; {', '.join(protocol.rank_devices)}): the global batch "
        f"{s.batch} is {s.batch // ranks} images per rank and iteration"
    )
    rows = {
        "workload": "the real Ultralytics trainer" if real else "embedded (small conv net)",
        "model": s.model,
        "data": s.data or synthetic,
        "steps": f"{s.steps} = {s.epochs} epochs × {s.iterations_per_epoch} iterations ({s.images} images / batch "
        f"{s.batch})",
        "batch / nbs": f"{s.batch} / {s.batch} (the optimizer steps every iteration)",
        "precision": s.amp,
        "ranks": per_rank if ranks > 1 else None,
        "loader workers, image cache": f"{s.workers}, {s.cache}" if real else None,
        "close_mosaic": f"{s.close_mosaic} (mosaic closes when epoch ≥ epochs − close_mosaic)"
        if real
        else None,
        "trial isolation": plan.isolation,
    }
    return Section("Fit settings").add(
        Table(["setting", "value"], [(k, v) for k, v in rows.items() if v is not None])
    )


def _figures_section(plan: Plan, trials: pd.DataFrame) -> Section | None:
    rows = finished(trials)
    if rows.empty:
        return None
    ranked = plan.protocol.gpus > 1
    quality = "val_map50_95" if "val_map50_95" in rows else "val_accuracy" if "val_accuracy" in rows else None
    kept = len(numeric_column(rows, "optimizer_plan_bytes")) > 0  # older runs did not record it
    over = " (max over ranks)" if ranked else ""
    cells: dict[str, Any] = {
        "arm": lambda m: m["arm"].iloc[0],
        "trials": len,
        "fit (s)": lambda m: format_number(median_of(m, "value")),
        "iteration (ms, host)": lambda m: _milliseconds(median_of(m, "iteration_host_median_s")),
        "peak allocated" + over: lambda m: format_bytes(median_of(m, "peak_allocated")),
        "peak reserved" + over: lambda m: format_bytes(median_of(m, "peak_reserved")),
    }
    if ranked:
        cells["peak allocated (sum over ranks)"] = lambda m: format_bytes(median_of(m, "peak_allocated_sum"))
        cells["NS matrices per rank"] = _shares
    if kept:
        cells["kept between steps"] = lambda m: format_bytes(median_of(m, "optimizer_plan_bytes"))
    quality_name = {"val_map50_95": "val mAP50-95", "val_accuracy": "val accuracy"}.get(
        quality or "", "val metric"
    )
    cells["checkpoints"] = lambda m: format_bytes(median_of(m, "checkpoint_bytes"))
    cells[quality_name] = lambda m: "n/a" if quality is None else format_number(median_of(m, quality))
    cells["optimizer class"] = lambda m: (
        ", ".join(sorted(set(m.get("optimizer_class", pd.Series(dtype=str)).dropna().astype(str)))) or "n/a"
    )
    align = "lrrrrrr" + ("rr" if ranked else "") + ("r" if kept else "") + "rl"
    return Section("Per-trial figures (medians over measured trials)").add(
        Table.of(cells, (mine for _, mine in _by_arm(plan, rows)), align),
        "Iteration: the median gap between iteration ends on the host clock, unsynchronized; a diagnostic. "
        "Checkpoints: bytes of the checkpoint files the fit wrote. The quality figure only shows that the fit trained.",
        "Kept between steps: device memory the optimizer holds besides its state (`optimizer.plan_bytes`). "
        "It is part of every later peak."
        if kept
        else None,
        "Ranks: the fit's figure is rank 0's bracket; each rank's peaks are in the row, with their max and sum. "
        "NS matrices per rank: the Newton-Schulz matrices each rank orthogonalized (`optimizer.sharing`)."
        if ranked
        else None,
    )


def _milliseconds(seconds: float) -> str:
    """Seconds as milliseconds with one decimal, or n/a."""
    return "n/a" if math.isnan(seconds) else f"{1000 * seconds:.1f}"


def _shares(rows: pd.DataFrame) -> str:
    """The last finished trial's Newton-Schulz matrices per rank, 'of' all of them; or that none are shared."""
    last = rows.iloc[-1]
    here, total = last.get("rank_matrices_here"), last.get("sharing_matrices")
    if not isinstance(here, list) or any(h is None for h in here) or total is None or pd.isna(total):
        return "every rank: all"
    return f"{' + '.join(str(int(h)) for h in here)} of {int(total)}"


def _stages_section(plan: Plan, trials: pd.DataFrame, figures_dir: Path) -> Section:
    table = stage_table(plan, trials)
    if table.empty:
        return Section("Stage shares").add("No finished measured trial with stage figures yet.")
    arms = [a for a in plan.arm_labels() if a in set(table["arm"])]
    cells = {"stage": lambda stage: stage}
    for arm in arms:
        cells[f"{arm} median (share)"] = lambda stage, arm=arm: _stage_cell(table, arm, stage)
    findings = stage_findings(plan, table) + step_findings(plan, trials)
    path = plot_fit_stage_shares(table, plan, figures_dir / "stage_shares.png")
    return Section("Stage shares (diagnostic: synchronized at every stage boundary)").add(
        Table.of(cells, STAGES, "l" + "r" * len(arms)),
        "\n".join(f"- {line}" for line in findings),
        Image(path, "stage shares per arm"),
        f"Stage medians per arm are in `{STAGES_CSV}` in the run folder.",
    )


def _stage_cell(table: pd.DataFrame, arm: str, stage: str) -> str:
    entry = table[(table["arm"] == arm) & (table["stage"] == stage)].iloc[0]
    return f"{format_value(entry['median_s'], 's')} ({format_percent(entry['share'])})"


def tables(run: Run) -> dict[str, pd.DataFrame]:
    """The stage table of a ``--stages`` run."""
    if not FitSettings.from_dict(run.plan.settings).stages:
        steady = steady_claims(run)
        return {} if steady.empty else {STEADY_CLAIMS_CSV: steady}
    return {STAGES_CSV: stage_table(run.plan, run.summaries.trials)}


def _verdict_cell(claim: pd.Series, same: set[str]) -> str:
    """``insufficient (the 8% bar)``, ``withheld`` for an arm that ran the baseline's code, or ``no bar``."""
    if str(claim["arm"]) in same:
        return "withheld (the baseline's code)"
    if is_missing(claim["bar"]):
        return str(claim["verdict"])
    return f"{claim['verdict']} ({claim_limit(claim)})"


def _steady_section(run: Run) -> Section | None:
    """The steady-state figure's section: per-arm medians and its own paired statistics, beside the claim."""
    steady = steady_claims(run)
    if steady.empty:
        return None
    plan, trials = run.plan, run.summaries.trials
    same = set(same_code_arms(plan))
    rows = finished(trials)
    medians = [
        f"{arm} {format_value(median_of(mine, STEADY_COLUMN), 's')}" for arm, mine in _by_arm(plan, rows)
    ]
    several = steady["case"].nunique() > 1
    columns = ["case"] * several + ["pair", "pairs", "median reduction", "interval", "method"]
    columns += ["checks: sign test; HL", "verdict"]
    table = [
        [
            *([c["case"]] * several),
            f"{c['arm']} vs {c['baseline_arm']}",
            int(c["pairs"]),
            format_percent(c["estimate"]),
            format_interval(c["ci_low"], c["ci_high"]),
            f"{method_label(c)}: {format_levels(c)}",
            f"{format_interval(c['sign_low'], c['sign_high'])}; HL {format_percent(c['hl_estimate'])} "
            f"{format_interval(c['hl_low'], c['hl_high'])}",
            _verdict_cell(c, same),
        ]
        for _, c in steady.iterrows()
    ]
    return Section("Steady-state figure (secondary: the whole fit stays the claim)").add(
        "Per fit, the training time from the second epoch's start to the last iteration's end, validation and "
        "checkpoints left out. Its pairs get the "
        f"claim's statistics and bar; the gate reads only the whole fit. Medians: {', '.join(medians)}.",
        Table(columns, table, "l" * (len(columns) - 7) + "lrrrlll"),
        f"The table is `{STEADY_CLAIMS_CSV}` in the run folder.",
    )


def report_section(run: Run) -> Section:
    """The fit tier's report section: its settings, per-trial figures and, in a stages run, the stage shares."""
    plan, trials = run.plan, run.summaries.trials
    parts = [_settings_section(plan), _figures_section(plan, trials), _steady_section(run)]
    if FitSettings.from_dict(plan.settings).stages:
        return Section("").add(*parts, _stages_section(plan, trials, run.figures_dir))
    return Section("").add(
        *parts,
        "What bounds the figure: the same command with `--stages` gives each stage's share and the ceiling.",
    )


def _verdict_words(claim: pd.Series, same: set[str]) -> str:
    """A claim row's verdict as the claim text states it (withheld for an arm that ran the baseline's code)."""
    control = claim["kind"] == "control"
    if str(claim["arm"]) in same:
        return f"verdict withheld: {claim['arm']} ran the baseline's code"
    if is_missing(claim["bar"]):
        return f"no {'tolerance (--tolerance)' if control else 'bar (--bar)'} set: {claim['verdict']}"
    limit = format_limit(100 * float(claim["bar"]), control)
    return f"{'A/A ' if control else ''}verdict against {limit}: {claim['verdict']}"


def _environment_line(env: dict[str, Any]) -> str:
    """The environment a claim was measured in, as one sentence."""
    gpus = env.get("gpu_names") or []
    cuda = f" (CUDA {env['cuda_runtime']})" if env.get("cuda_runtime") else ""
    revision = str(env.get("git_revision") or "")[:10]
    parts = [
        ", ".join(gpus) if gpus else f"CPU {env.get('cpu_model') or 'unknown'}",
        env.get("driver_version") and f"driver {env['driver_version']}",
        f"torch {env.get('torch')}{cuda}",
        f"Python {env.get('python')}",
        env.get("ultralytics") and f"ultralytics {env['ultralytics']}",
        revision and f"revision {revision}" + (" (dirty)" if env.get("git_dirty") else ""),
    ]
    return "Environment: " + ", ".join(p for p in parts if p) + "."


def claim_text(run: Run) -> str:
    """The claim of a paired run (or the stage shares of a stages run), as plain text (``claim.txt``)."""
    plan, summaries = run.plan, run.summaries
    settings = FitSettings.from_dict(plan.settings)
    lines = [what_ran(plan)] if what_ran(plan) else []
    same = set(same_code_arms(plan))
    if settings.stages:
        lines += [
            "Stages diagnostic (not a claim):",
            *stage_findings(plan, stage_table(plan, summaries.trials)),
        ]
    elif summaries.claims.empty:
        lines.append("No complete pair: no claim.")
    else:
        for _, claim in summaries.claims.iterrows():
            lines += _claim_lines(run, claim, same)
    for _, claim in steady_claims(run).iterrows():
        lines.append(
            f"Secondary, not the claim: the steady-state figure (epochs 2 on, training only) of {claim['arm']} "
            f"vs {claim['baseline_arm']}: {format_percent(claim['estimate'])}, {100 * float(claim['ci_level']):.0f}% "
            f"{method_label(claim)} interval {format_interval(claim['ci_low'], claim['ci_high'])} "
            f"({int(claim['pairs'])} pairs); {_verdict_words(claim, same)}."
        )
    lines.append(
        f"Protocol: {warmup_words(plan, summaries.trials)}, then {pairs_words(plan, summaries.trials)} in "
        f"{plan.protocol.order} order ({_orders(plan)}), {settings.steps} steps each ({settings.epochs} epochs × "
        f"{settings.iterations_per_epoch}); isolation: {plan.isolation}; timed region: {plan.timed_region}."
    )
    return "\n".join([*lines, _environment_line(run.env)]) + "\n"


def _claim_lines(run: Run, claim: pd.Series, same: set[str]) -> list[str]:
    """One claim row in words: its sentence, its interval and verdict, its checks."""
    plan, arm = run.plan, str(claim["arm"])
    if claim["kind"] == "control":
        kind = "A/A control (noise floor): "
    else:
        kind = "A/A in effect (noise, not a speed-up): " if arm in same else ""
    both_failed = int(claim["both_failed"])
    pairs = f"{int(claim['pairs'])} pairs" + (
        f", {both_failed} more with both arms failed left out" if both_failed else ""
    )
    insufficient = "" if claim["ci_sufficient"] else f" Insufficient: {claim['ci_reason']}."

    def attained(check: str) -> str:
        verdict = verdict_shown(plan, arm, str(claim[f"{check}_verdict"]))
        return f"({100 * float(claim[f'{check}_attained']):.1f}% attained, {verdict})"

    hl = "(not computable)" if math.isnan(float(claim["hl_attained"])) else attained("hl")
    return [
        f"{kind}{claim_sentence(plan, run.summaries, str(claim['case']), arm)}",
        f"{100 * float(claim['ci_level']):.0f}% {method_label(claim)} interval of the median reduction "
        f"{format_interval(claim['ci_low'], claim['ci_high'])} ({format_levels(claim)}, {pairs}); "
        f"{_verdict_words(claim, same)}.{insufficient}",
        f"Checks: geometric-mean t {format_percent(claim['gm_estimate'])}, interval "
        f"{format_interval(claim['gm_low'], claim['gm_high'])} ({verdict_shown(plan, arm, str(claim['gm_verdict']))}); "
        f"sign-test interval of the median {format_interval(claim['sign_low'], claim['sign_high'])} "
        f"{attained('sign')}; Hodges-Lehmann {format_percent(claim['hl_estimate'])}, Wilcoxon interval "
        f"{format_interval(claim['hl_low'], claim['hl_high'])} {hl}.",
    ]


def _orders(plan: Plan) -> str:
    """The first rounds' orders as scheduled: ``AB, BA, …``."""
    orders = list(dict.fromkeys((t.round, t.order) for t in plan.schedule if t.phase == "measured"))
    return ", ".join(order for _, order in orders[:2]) + (", …" if len(orders) > 2 else "")
