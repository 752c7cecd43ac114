"""The complete-fit tier's words: its report section, the claim it prints, and the stage-share analysis.

``sections`` is the tier's report section (``plan.sections``): the fit settings and how steps map to epochs,
per-arm medians of the trial's own figures, and — in a ``--stages`` run — each stage's share of the fit and
the ceiling it puts on the whole-fit saving. ``finish`` runs when a ``bench pair`` command ends: it prints the
claim (or, for a stages run, the shares) and writes it into the run folder as ``claim.txt`` (which the report
section rewrites too, so ``bench report`` refreshes it).

Everything here is derived from the run folder alone, so it can be regenerated at any time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from experiments.fit.plan import FitSettings
from experiments.fit.stages import OPTIMIZER_STAGE, STAGES, stage_column
from harness.protocol import Plan
from harness.run import summarize
from harness.stats import finished
from harness.tables import ENV, RunFolder, Summaries

CLAIM_FILE = "claim.txt"
STAGES_CSV = "stages.csv"


def _arm_labels(plan: Plan) -> list[str]:
    return [arm.label for case in plan.cases for arm in case.arms]


def stage_table(plan: Plan, trials: pd.DataFrame) -> pd.DataFrame:
    """Per arm and stage: median seconds over measured trials and the share of the median stage total.

    Also, per arm, the whole fit's median and, for the reference (first) arm, the ceiling of an
    optimizer-only change: its optimizer share (a candidate whose step took no time at all saves that much).
    """
    rows = finished(trials)
    columns = ["arm", "stage", "median_s", "share", "fit_median_s", "trials"]
    if rows.empty or stage_column(OPTIMIZER_STAGE) not in rows:
        return pd.DataFrame(columns=columns)
    out = []
    for arm in _arm_labels(plan):
        mine = rows[rows["arm"] == arm]
        if mine.empty:
            continue
        medians = {s: float(pd.to_numeric(mine[stage_column(s)]).median()) for s in STAGES}
        total = sum(medians.values())
        fit_median = float(pd.to_numeric(mine["value"]).median())
        for stage in STAGES:
            out.append(
                {
                    "arm": arm,
                    "stage": stage,
                    "median_s": medians[stage],
                    "share": medians[stage] / total if total > 0 else float("nan"),
                    "fit_median_s": fit_median,
                    "trials": len(mine),
                }
            )
    return pd.DataFrame(out, columns=columns)


def stage_findings(plan: Plan, table: pd.DataFrame) -> list[str]:
    """The ceiling and the stage-implied saving, in sentences derived from the stage table."""
    if table.empty:
        return []
    from harness.formatting import format_percent, format_value

    labels = [a for a in _arm_labels(plan) if a in set(table["arm"])]
    reference = labels[0]
    ref = table[table["arm"] == reference].set_index("stage")
    optimizer_share = float(ref.loc[OPTIMIZER_STAGE, "share"])
    optimizer_s = float(ref.loc[OPTIMIZER_STAGE, "median_s"])
    total = float(ref["median_s"].sum())
    lines = [
        f"Ceiling: in {reference}'s fits the optimizer step is {format_percent(optimizer_share)} of the fit "
        f"({format_value(optimizer_s, 's')} of {format_value(total, 's')}), so a change to the optimizer alone "
        f"can save at most {format_percent(optimizer_share)} of the whole fit, even if its step took no time."
    ]
    for arm in labels[1:]:
        other = table[table["arm"] == arm].set_index("stage")
        saved = optimizer_s - float(other.loc[OPTIMIZER_STAGE, "median_s"])
        lines.append(
            f"{arm}: optimizer step {format_value(float(other.loc[OPTIMIZER_STAGE, 'median_s']), 's')} "
            f"({format_percent(float(other.loc[OPTIMIZER_STAGE, 'share']))} of its fit); the stage difference alone "
            f"implies a whole-fit saving of {format_percent(saved / total if total else float('nan'))} "
            f"({format_percent(saved / optimizer_s if optimizer_s else float('nan'))} of the ceiling reached)."
        )
    lines.append(
        "These shares come from a diagnostic run with a synchronization at every stage boundary; they bound and "
        "explain the claim, they are not the claim (that is the unsynchronized paired run)."
    )
    return lines


def _settings_text(plan: Plan) -> list[str]:
    from harness.report import markdown_table

    s = FitSettings.from_options(plan.options)
    data = s.data or (
        f"synthetic: {s.images} train + {s.val_images} val images, {s.imgsz} px, seed {s.data_seed} "
        f"(generated once under {s.data_root})"
        if s.workload == "ultralytics"
        else f"synthetic in memory: {s.images} train + {s.val_images} val images, {s.imgsz} px, seed {s.data_seed}"
    )
    rows = [
        (
            "workload",
            "the real Ultralytics trainer" if s.workload == "ultralytics" else "embedded (small conv net)",
        ),
        ("model", s.model),
        ("data", data),
        (
            "steps",
            f"{s.steps} = {s.epochs} epochs × {s.iterations_per_epoch} iterations ({s.images} images / batch {s.batch})",
        ),
        ("batch / nbs", f"{s.batch} / {s.batch} (the optimizer steps every iteration)"),
        ("precision", s.amp),
    ]
    if s.workload == "ultralytics":
        rows += [
            ("loader workers, image cache", f"{s.workers}, {s.cache}"),
            ("close_mosaic", f"{s.close_mosaic} (mosaic closes when epoch ≥ epochs − close_mosaic)"),
        ]
    rows.append(("trial isolation", plan.isolation))
    return ["### Fit settings", "", markdown_table(["setting", "value"], rows), ""]


def _figures_text(plan: Plan, trials: pd.DataFrame) -> list[str]:
    from harness.formatting import format_bytes, format_number
    from harness.report import markdown_table

    rows = finished(trials)
    if rows.empty:
        return []
    quality = "val_map50_95" if "val_map50_95" in rows else "val_accuracy" if "val_accuracy" in rows else None
    table = []
    for arm in _arm_labels(plan):
        mine = rows[rows["arm"] == arm]
        if mine.empty:
            continue

        def median(column: str, frame: pd.DataFrame = mine) -> float | None:
            if column not in frame:
                return None
            values = pd.to_numeric(frame[column], errors="coerce").dropna()
            return float(values.median()) if len(values) else None

        iteration = median("iteration_host_median_s")
        classes = ", ".join(
            sorted(set(mine.get("optimizer_class", pd.Series(dtype=str)).dropna().astype(str)))
        )
        table.append(
            [
                arm,
                len(mine),
                format_number(median("value")),
                "n/a" if iteration is None else f"{1000 * iteration:.1f}",
                format_bytes(median("peak_allocated")),
                format_bytes(median("peak_reserved")),
                format_bytes(median("checkpoint_bytes")),
                "n/a" if quality is None else format_number(median(quality)),
                classes or "n/a",
            ]
        )
    quality_name = {"val_map50_95": "val mAP50-95", "val_accuracy": "val accuracy"}.get(
        quality or "", "val metric"
    )
    return [
        "### Per-trial figures (medians over measured trials)",
        "",
        markdown_table(
            [
                "arm",
                "trials",
                "fit (s)",
                "iteration (ms, host)",
                "peak allocated",
                "peak reserved",
                "checkpoints",
                quality_name,
                "optimizer class",
            ],
            table,
            "lrrrrrrrl",
        ),
        "",
        "Iteration: median gap between consecutive iteration ends, read from the host clock with no "
        "synchronization (so nothing is added inside the timed region); a diagnostic, not the claim. "
        "Checkpoints: bytes on disk of the checkpoint files the fit wrote. The quality figure is a sanity "
        "check that the fit trained; a short fit says nothing about final accuracy.",
        "",
    ]


def _stages_text(folder: RunFolder, plan: Plan, trials: pd.DataFrame, figures_dir: Path) -> list[str]:
    from harness import plots
    from harness.formatting import format_percent, format_value
    from harness.report import markdown_image, markdown_table

    table = stage_table(plan, trials)
    if table.empty:
        return ["### Stage shares", "", "No finished measured trial with stage figures yet.", ""]
    folder.write_csv(STAGES_CSV, table)
    arms = [a for a in _arm_labels(plan) if a in set(table["arm"])]
    rows = []
    for stage in STAGES:
        row: list[Any] = [stage]
        for arm in arms:
            entry = table[(table["arm"] == arm) & (table["stage"] == stage)].iloc[0]
            row.append(f"{format_value(entry['median_s'], 's')} ({format_percent(entry['share'])})")
        rows.append(row)
    lines = [
        "### Stage shares (diagnostic: synchronized at every stage boundary)",
        "",
        markdown_table(["stage", *[f"{a} median (share)" for a in arms]], rows, "l" + "r" * len(arms)),
        "",
    ]
    lines += [f"- {line}" for line in stage_findings(plan, table)]
    lines.append("")
    path = plots.plot_fit_stage_shares(table, plan, figures_dir / "stage_shares.png")
    lines += [markdown_image(path, "stage shares per arm"), ""]
    lines.append(f"Stage medians per arm are in `{STAGES_CSV}` in the run folder.")
    return lines


def sections(folder: RunFolder, summaries: Summaries, figures_dir: Path) -> str:
    """The tier's report section (named in ``plan.sections``); it refreshes ``claim.txt`` too, so that
    ``bench report`` regenerates everything a fit run folder shows from its log."""
    plan = Plan.from_json(folder.read_json("plan.json"))
    write_claim(folder, plan, summaries)
    lines = _settings_text(plan) + _figures_text(plan, summaries.trials)
    if FitSettings.from_options(plan.options).stages:
        lines += _stages_text(folder, plan, summaries.trials, figures_dir)
    else:
        lines += [
            "What bounds the figure: run the same command with `--stages` (its own run folder, never mixed into "
            "a claim) for each stage's share of the fit and the ceiling on what an optimizer-only change can save.",
        ]
    return "\n".join(lines).rstrip()


def _environment_line(env: dict[str, Any]) -> str:
    gpus = env.get("gpu_names") or []
    device = ", ".join(gpus) if gpus else f"CPU {env.get('cpu_model') or 'unknown'}"
    parts = [device]
    if env.get("driver_version"):
        parts.append(f"driver {env['driver_version']}")
    parts.append(
        f"torch {env.get('torch')}" + (f" (CUDA {env['cuda_runtime']})" if env.get("cuda_runtime") else "")
    )
    parts.append(f"Python {env.get('python')}")
    if env.get("ultralytics"):
        parts.append(f"ultralytics {env['ultralytics']}")
    if env.get("git_revision"):
        parts.append(
            f"revision {str(env['git_revision'])[:10]}" + (" (dirty)" if env.get("git_dirty") else "")
        )
    return "Environment: " + ", ".join(parts) + "."


def claim_text(folder: RunFolder, plan: Plan, summaries: Summaries) -> str:
    """The claim of a paired run (or the stage shares of a stages run), as plain text."""
    from harness.formatting import format_interval, format_limit
    from harness.report import claim_sentence

    settings = FitSettings.from_options(plan.options)
    env = folder.read_json(ENV) or {}
    lines: list[str] = []
    if settings.stages:
        table = stage_table(plan, summaries.trials)
        lines += ["Stages diagnostic (not a claim):"] + stage_findings(plan, table)
    elif summaries.claims.empty:
        lines.append("No complete pair: no claim.")
    for _, claim in summaries.claims.iterrows():
        case, arm = str(claim["case"]), str(claim["arm"])
        if settings.stages:
            continue
        kind = "A/A control (noise floor): " if plan.control else ""
        verdict = (
            "no bar set (--bar), so no verdict"
            if plan.bar is None
            else f"{'A/A ' if plan.control else ''}verdict against {format_limit(plan.bar, plan.control)}: "
            f"{claim['verdict']}"
        )
        lines.append(f"{kind}{claim_sentence(plan, summaries, case, arm)}")
        lines.append(
            f"{100 * float(claim['ci_level']):.0f}% interval of the median reduction "
            f"{format_interval(claim['ci_low'], claim['ci_high'])} ({claim['ci_method']}, {int(claim['pairs'])} "
            f"pairs); {verdict}." + _nominal_note(int(claim["pairs"]), float(claim["ci_level"]))
        )
    lines.append(
        f"Protocol: {plan.warmup} warm-up fit(s) discarded, then {plan.pairs} pair(s) in {plan.order} order "
        f"(AB, BA, …), {settings.steps} steps each ({settings.epochs} epochs × {settings.iterations_per_epoch}); "
        f"isolation: {plan.isolation}; timed region: {plan.timed_region}."
    )
    lines.append(_environment_line(env))
    return "\n".join(lines) + "\n"


def _nominal_note(pairs: int, level: float) -> str:
    """What a small number of pairs does to the stated level (empty where it can be attained)."""
    from harness.stats import range_coverage

    coverage = range_coverage(pairs)
    if coverage >= level:
        return ""
    return (
        f" With {pairs} pairs the interval is nominal: even the range of the reductions covers the true median "
        f"with probability only {100 * coverage:.1f}% (distribution-free)."
    )


def write_claim(folder: RunFolder, plan: Plan, summaries: Summaries) -> str:
    """Write ``claim.txt`` (atomically) from the run's plan and summaries, and return its text."""
    text = claim_text(folder, plan, summaries)
    path = folder.file(CLAIM_FILE)
    tmp = path.with_suffix(".txt.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return text


def finish(folder: RunFolder, echo: Any = print) -> Path:
    """Write ``claim.txt`` into the run folder and show it (called when a ``bench pair`` command ends)."""
    echo(write_claim(folder, *summarize(folder)).rstrip())
    return folder.file(CLAIM_FILE)
