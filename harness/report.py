"""The markdown report of one or more run folders: what a reviewer reads.

Everything comes from the run folders alone (``plan.json``, ``env.json``, ``trials.jsonl``; the summaries
are recomputed from the log), so a report can be regenerated at any time, and the same folders give the same
markdown byte for byte: no clock is read here (the date is the plan's creation time), every ordering follows
the plan, and every number goes through ``harness.formatting``. The report writes its markdown and figures and
nothing else.

Layout: title, date, command(s); a summary of every claim; the environment (one column per run, side by
side); then one section per run: protocol, results (tables and the claim sentence), verdict, failed trials,
caveats, plots, and the tier's own section (``Tier.section``).

Where it is written: ``write_report([folder])`` writes ``<folder>/report.md``; several folders make one
combined report and need an explicit ``output`` (``bench report A B -o reports/NAME.md``), so a combined
report never overwrites a run's own report. PNGs go in a folder beside the markdown: ``<stem>-figures/``
for one run, ``<stem>-figures-<k>/`` for the k-th of several.

For tier sections (``Tier.section(run) -> str``): draw into ``run.figures_dir`` through ``harness.plots``,
reference images with ``markdown_image(path, caption)``, build tables with ``markdown_table`` and format
numbers with ``format_value`` / ``format_percent`` / ``format_bytes`` so a report reads as one piece. Use
``###`` headings: a run's section is a ``##``.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness import plots, telemetry
from harness.codepaths import WITHHELD, all_same_code, same_code_arms, verdict_shown, what_ran
from harness.formatting import (
    format_bytes,
    format_interval,
    format_limit,
    format_number,
    format_percent,
    format_percent_range,
    format_range,
    format_value,
    is_missing,
)
from harness.options import InputError
from harness.protocol import Plan
from harness.stats import finished, numeric_column, pairs_for_level, range_coverage
from harness.tables import RunFolder, Summaries
from harness.tier import Caveat, Run, TierRegistry

REPORT_NAME = "report.md"
NOT_RECORDED = "not recorded"


def _text(value: Any) -> str:
    return NOT_RECORDED if is_missing(value) or value == "" else str(value)


def _cell(text: Any) -> str:
    """A markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: Any) -> str:
    """Inline code that survives backticks in the text."""
    return "`" + " ".join(str(text).split()).replace("`", "'") + "`"


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "") -> str:
    """A markdown table; ``align`` holds one of 'l', 'r', 'c' per column (left by default)."""
    marks = {"l": "---", "r": "---:", "c": ":---:"}
    rule = [marks.get(align[i] if i < len(align) else "l", "---") for i in range(len(columns))]
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_image(path: Path, caption: str) -> str:
    """An image in a figures folder beside the markdown, referenced relative to the markdown's folder."""
    target = f"{Path(path).parent.name}/{Path(path).name}"
    if any(ch in target for ch in " ()<>"):
        target = f"<{target}>"
    return f"![{caption}]({target})"


def _time(iso: Any) -> str:
    """``2026-11-29T21:11:28+00:00`` → ``2026-11-29 21:11:28 UTC``."""
    if is_missing(iso) or not iso:
        return NOT_RECORDED
    try:
        moment = _dt.datetime.fromisoformat(str(iso))
    except ValueError:
        return str(iso)
    if moment.tzinfo is not None:
        moment = moment.astimezone(_dt.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S") + (" UTC" if moment.tzinfo is not None else "")


# --- one run, loaded --------------------------------------------------------------------------------------


@dataclass
class LoadedRun(Run):
    """A run as one report shows it: numbered among the report's runs, read by its tier."""

    number: int = 1
    several: bool = False
    tiers: TierRegistry | None = None

    @property
    def tier(self):
        return (self.tiers or TierRegistry()).reader(self.plan.tier)

    @property
    def name(self) -> str:
        return self.folder.path.name

    @property
    def title(self) -> str:
        kind = " (A/A control)" if self.plan.protocol.control else ""
        return (
            f"Run {self.number}: {self.plan.tier}{kind}" if self.several else f"Run: {self.plan.tier}{kind}"
        )

    @property
    def tag(self) -> str:
        """How the summary names this run."""
        return f"{self.number}" + (" (A/A control)" if self.plan.protocol.control else "")

    def case_order(self) -> dict[str, int]:
        return {c.label: i for i, c in enumerate(self.plan.cases)}

    def arm_order(self) -> dict[str, int]:
        return {label: i for i, label in enumerate(self.plan.arm_labels())}


def _sorted(frame: pd.DataFrame, run: LoadedRun) -> pd.DataFrame:
    """Rows in plan order of case, then arm (the statistics' order follows the first round's order)."""
    if frame.empty:
        return frame
    cases, arms = run.case_order(), run.arm_order()
    keys = [
        (cases.get(str(c), len(cases)), arms.get(str(a), len(arms)))
        for c, a in zip(frame["case"], frame["arm"], strict=True)
    ]
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    return frame.iloc[order].reset_index(drop=True)


def peak_median(trials: pd.DataFrame, case: str, arm: str, column: str) -> float | None:
    """Median of a per-trial byte figure (``peak_allocated``/``peak_reserved``) over measured, finished
    trials of one arm; None where the trials carry no such figure (e.g. on the CPU)."""
    rows = finished(trials)
    if rows.empty:
        return None
    values = numeric_column(rows[(rows["case"] == case) & (rows["arm"] == arm)], column)
    return float(values.median()) if len(values) else None


def _sentence_label(label: str) -> str:
    """An arm label at the start of a sentence: plain words get a capital, specs stay verbatim."""
    return label[:1].upper() + label[1:] if label.replace("-", "").replace("_", "").isalpha() else label


def _claim_row(summaries: Summaries, case: str, arm: str) -> pd.Series:
    claims = summaries.claims
    match = claims[(claims["case"].astype(str) == case) & (claims["arm"].astype(str) == arm)]
    if match.empty:
        raise KeyError(f"no claim for case '{case}' and arm '{arm}' (no complete pair)")
    return match.iloc[0]


def _arm_row(summaries: Summaries, case: str, arm: str) -> pd.Series:
    arms = summaries.arms
    return arms[(arms["case"].astype(str) == case) & (arms["arm"].astype(str) == arm)].iloc[0]


def claim_sentence(plan: Plan, summaries: Summaries, case: str, arm: str) -> str:
    """The claim of one arm against its case's baseline, in the project's words:

    "Baseline median 89.448 s (88.765–89.646); candidate 79.183 s (77.799–79.660). The paired reduction
    median is 11.19% (10.88–13.22%), with the same 809.9 MiB peak allocated."
    """
    claim = _claim_row(summaries, case, arm)
    base_label = str(claim["baseline_arm"])
    base, mine = _arm_row(summaries, case, base_label), _arm_row(summaries, case, arm)
    text = (
        f"{_sentence_label(base_label)} median {format_value(base['median'], plan.unit)} "
        f"({format_range(base['min'], base['max'])}); {arm} {format_value(mine['median'], plan.unit)} "
        f"({format_range(mine['min'], mine['max'])}). The paired reduction median is "
        f"{format_percent(claim['median'])} ({format_percent_range(claim['min'], claim['max'])})"
    )
    base_peak = peak_median(summaries.trials, case, base_label, "peak_allocated")
    arm_peak = peak_median(summaries.trials, case, arm, "peak_allocated")
    if base_peak is not None and arm_peak is not None:
        if format_bytes(base_peak) == format_bytes(arm_peak):
            text += f", with the same {format_bytes(base_peak)} peak allocated"
        else:
            change = (arm_peak - base_peak) / base_peak if base_peak else math.inf
            change_text = f"{100 * change:+.1f}%" if math.isfinite(change) else "from zero"
            text += (
                f", with peak allocated {format_bytes(base_peak)} vs {format_bytes(arm_peak)} ({change_text})"
            )
    text += "."
    for label, row in ((base_label, base), (arm, mine)):
        if int(row["failed"]):
            text += f" {int(row['failed'])} of {int(row['trials'])} {label} trials failed and count as infinitely slow."
    return text


# --- what the data says about the run ----------------------------------------------------------------------


def completed_pairs(plan: Plan, trials: pd.DataFrame) -> int:
    """Measured rounds (over all cases) in which every arm has a row in the log."""
    if trials.empty:
        return 0
    measured = trials[trials["phase"] == "measured"]
    done = 0
    for case in plan.cases:
        rows = measured[measured["case"] == case.label]
        for _, in_round in rows.groupby("round"):
            if set(in_round["arm"]) >= {a.label for a in case.arms}:
                done += 1
    return done


def is_interrupted(plan: Plan, trials: pd.DataFrame) -> bool:
    return len(trials) < len(plan.schedule)


def _bar_text(plan: Plan) -> str:
    """The bar as the tables show it; an A/A control's is a tolerance, ±bar."""
    if plan.protocol.bar is None:
        return "none"
    return f"±{plan.protocol.bar:g}%" if plan.protocol.control else f"{plan.protocol.bar:g}%"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def caveats(run: LoadedRun) -> list[Caveat]:
    """Caveats derived from the tier and the data, most important first."""
    plan, trials, claims = run.plan, run.summaries.trials, run.summaries.claims
    out: list[Caveat] = []
    same = same_code_arms(plan)
    if same:
        out.append(
            Caveat(
                ("an A/A in effect" if all_same_code(plan) else "partly an A/A in effect")
                + f": {', '.join(same)} ran the baseline's code on {plan.protocol.device}; "
                + ("its verdict is" if len(same) == 1 else "their verdicts are")
                + " withheld.",
                "; ".join(f"{label}: {reason}" for label, reason in same.items())
                + ". Name an arm that runs other code there (on the CPU, candidate-cpu routes CPU tensors "
                "through the candidate's batched path).",
            )
        )
    out += list(run.tier.caveats(run))
    if plan.protocol.control:
        out.append(Caveat("A/A control: it measures the noise floor, not a speed-up.", _control_text(run)))
    if is_interrupted(plan, trials):
        planned = plan.protocol.pairs * len(plan.cases)
        out.append(
            Caveat(
                f"interrupted: {completed_pairs(plan, trials)} of {planned} pairs.",
                f"{len(trials)} of {len(plan.schedule)} scheduled trials are in the log; the figures cover only what "
                "ran. `--resume` with this run folder continues it.",
            )
        )
    if not trials.empty:
        failed = trials[trials["status"] != "ok"]
        measured_failed = int((failed["phase"] == "measured").sum())
        warmup_failed = int((failed["phase"] == "warmup").sum())
        if measured_failed:
            out.append(
                Caveat(
                    f"failures: {_plural(measured_failed, 'measured trial')} failed and "
                    f"{'counts' if measured_failed == 1 else 'count'} as infinitely slow.",
                    "A pair whose arm failed has reduction -∞ (whose baseline failed, +100%); no failure is dropped.",
                )
            )
        if warmup_failed:
            out.append(
                Caveat(
                    f"{_plural(warmup_failed, 'warm-up trial')} failed.",
                    "Warm-ups are discarded from the statistics anyway.",
                )
            )
    if plan.protocol.device == "cpu" and run.tier.paired:
        out.append(Caveat("device cpu: timings on the CPU say nothing about speed on a GPU."))
    if run.env.get("git_dirty") is True:
        out.append(
            Caveat(
                "uncommitted changes: the code differed from its git revision.",
                f"The working tree had changes against {_code(run.env.get('git_revision'))} when the run started.",
            )
        )
    if not run.tier.paired:  # pairs, intervals and bars mean nothing to it
        return out
    if not claims.empty:
        few, level = int(claims["pairs"].min()), float(claims["ci_level"].iloc[0])
        if range_coverage(few) < level:
            out.append(
                Caveat(
                    f"few pairs: {few} per claim, so the stated {100 * level:.0f}% interval is nominal.",
                    "A bootstrap interval of the median never leaves the range of the observed reductions, and with "
                    f"{few} pairs even that range covers the true median with probability only "
                    f"{100 * range_coverage(few):.1f}% (1 − 2·0.5^{few}, distribution-free); {pairs_for_level(level)} "
                    f"pairs are the fewest that can reach {100 * level:.0f}%.",
                )
            )
    if plan.protocol.bar is None:
        out.append(Caveat("no bar set (`--bar`): the claims carry no verdict."))
    return out


def _control_text(run: LoadedRun) -> str:
    """What an A/A control is, with its figure where it has one."""
    text = (
        "The first arm ran against itself through the same machinery; its paired reductions measure the noise "
        "floor of this protocol on this machine"
    )
    claims = run.summaries.claims
    if not claims.empty:
        parts = [
            f"{format_percent(c['median'])} (range {format_percent_range(c['min'], c['max'])}, "
            f"{100 * float(c['ci_level']):.0f}% interval {format_interval(c['ci_low'], c['ci_high'])})"
            + (f" in case {_code(c['case'])}" if len(run.plan.cases) > 1 else "")
            for _, c in _sorted(claims, run).iterrows()
        ]
        text += ": median difference " + "; ".join(parts)
    return text + "."


# --- sections ---------------------------------------------------------------------------------------------


def _same_code_tag(plan: Plan) -> str:
    """What the title calls a run whose compared arms ran the baseline's code."""
    if all_same_code(plan):
        return f" (an A/A in effect: the arms ran the same code on {plan.protocol.device})"
    if same_code_arms(plan):
        return f" (partly an A/A in effect: some arms ran the baseline's code on {plan.protocol.device})"
    return ""


def _title(runs: list[LoadedRun]) -> list[str]:
    kinds: list[str] = []
    for run in runs:
        kind = (
            run.plan.tier + (" A/A control" if run.plan.protocol.control else "") + _same_code_tag(run.plan)
        )
        if kind not in kinds:
            kinds.append(kind)
    first = runs[0]
    lines = [f"# musgd-bench report: {' + '.join(kinds)}", ""]
    first_start = _time(min(str(r.plan.created) for r in runs))
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
            f"Run folder {_code(first.name)}; tier {_code(plan.tier)}; primary figure: {plan.metric}"
            + (f" in {plan.unit}" if plan.unit else "")
            + f" (lower is better); {len(trials)} of {len(plan.schedule)} scheduled trials in the log."
        )
        lines += ["", "Command:", "", "```sh", plan.command or "# not recorded (started from Python)", "```"]
        return lines
    rows = [
        [
            r.number,
            _code(r.name),
            r.plan.tier,
            "A/A control" if r.plan.protocol.control else "claim",
            f"{r.plan.metric} ({r.plan.unit})",
            _time(r.plan.created),
            f"{len(r.summaries.trials)} of {len(r.plan.schedule)}",
        ]
        for r in runs
    ]
    lines.append(
        markdown_table(["run", "folder", "tier", "kind", "figure", "started", "trials logged"], rows, "rllll")
    )
    lines += ["", "Commands:", "", "```sh"]
    for r in runs:
        lines += [f"# run {r.number} ({r.name})", r.plan.command or "# not recorded (started from Python)"]
    lines.append("```")
    return lines


def _summary(runs: list[LoadedRun]) -> list[str]:
    several = len(runs) > 1
    columns = (["run"] if several else []) + [
        "case",
        "arm vs baseline",
        "pairs",
        "baseline median",
        "arm median",
        "reduction median (min–max)",
        "interval",
        "bar",
        "verdict",
    ]
    rows = []
    for run in (r for r in runs if r.tier.paired):
        summaries = run.summaries
        for _, claim in _sorted(summaries.claims, run).iterrows():
            case, arm, base = str(claim["case"]), str(claim["arm"]), str(claim["baseline_arm"])
            base_row, arm_row = _arm_row(summaries, case, base), _arm_row(summaries, case, arm)
            rows.append(
                ([run.tag] if several else [])
                + [
                    case,
                    f"{arm} vs {base}",
                    f"{int(claim['pairs'])} of {run.plan.protocol.pairs}",
                    format_value(base_row["median"], run.plan.unit),
                    format_value(arm_row["median"], run.plan.unit),
                    f"{format_percent(claim['median'])} ({format_percent_range(claim['min'], claim['max'])})",
                    format_interval(claim["ci_low"], claim["ci_high"]),
                    _bar_text(run.plan),
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
        level = _level(runs)
        lines += [markdown_table(columns, rows, ("r" if several else "") + "llrrrrrll"), ""]
        lines.append(
            f"Reduction = (baseline − arm) / baseline per pair: higher is faster. Interval: {level}, over pairs."
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
        if run.plan.protocol.control and several:
            lines += [
                "",
                f"Run {run.number} is an A/A control. {_control_text(run)} Read the other runs' "
                "reductions against it.",
            ]
    caveat_lines = [
        f"- {f'run {run.number}: ' if several else ''}{caveat.headline}"
        for run in runs
        for caveat in caveats(run)
    ]
    if caveat_lines:
        lines += ["", "Caveats (details in each run's section):", ""] + caveat_lines
    return lines


def _level(runs: list[LoadedRun]) -> str:
    for run in runs:
        claims = run.summaries.claims
        if not claims.empty:
            return f"{100 * float(claims['ci_level'].iloc[0]):.0f}% {claims['ci_method'].iloc[0]}"
    return "bootstrap interval"


def _cudnn(value: Any) -> str:
    if is_missing(value):
        return NOT_RECORDED
    v = int(value)
    major, rest = (v // 10000, v % 10000) if v >= 10000 else (v // 1000, v % 1000)
    return f"{major}.{rest // 100}.{rest % 100} ({v})"


def _on_off(value: Any) -> str:
    return NOT_RECORDED if is_missing(value) else ("on" if value else "off")


def _gpus(env: dict[str, Any]) -> str:
    names = env.get("gpu_names")
    if names is None:
        return NOT_RECORDED
    if not names:
        return "none (CUDA not available)" if env.get("cuda_available") is False else "none"
    memory = env.get("gpu_memory_bytes") or []
    groups: list[list[Any]] = []
    for i, name in enumerate(names):
        label = name + (f" ({format_bytes(memory[i])})" if i < len(memory) else "")
        if groups and groups[-1][0] == label:
            groups[-1][1] += 1
        else:
            groups.append([label, 1])
    return ", ".join(f"{count} × {label}" for label, count in groups)


def _clocks(snapshot: Any) -> str:
    if snapshot is None:
        return NOT_RECORDED
    if not snapshot:
        return f"{NOT_RECORDED} (nvidia-smi did not answer)"

    def figure(value: Any, unit: str, name: str = "") -> str:
        if is_missing(value):
            return f"{name} {NOT_RECORDED}".strip()
        return f"{float(value):g} {unit}"

    return "<br>".join(
        f"GPU {g.get('index')}: SM {figure(g.get('sm_clock_mhz'), 'MHz')}, memory "
        f"{figure(g.get('mem_clock_mhz'), 'MHz')}, {figure(g.get('temperature_c'), '°C', 'temperature')}, "
        f"{figure(g.get('power_w'), 'W', 'power')}"
        for g in snapshot
    )


def _git(env: dict[str, Any]) -> str:
    revision = env.get("git_revision")
    if is_missing(revision):
        return NOT_RECORDED
    dirty = env.get("git_dirty")
    state = {True: "dirty (uncommitted changes)", False: "clean"}.get(dirty, f"dirty flag {NOT_RECORDED}")
    return f"`{revision}`, {state}"


def _environment_rows(env: dict[str, Any]) -> list[tuple[str, str]]:
    cpu = env.get("cpu_model")
    cpu_text = (
        NOT_RECORDED
        if is_missing(cpu)
        else str(cpu)
        + (f" ({env['cpu_count']} logical cores)" if not is_missing(env.get("cpu_count")) else "")
    )
    speed = (
        f"TF32 matmul {_on_off(env.get('tf32_matmul'))}, TF32 cuDNN {_on_off(env.get('tf32_cudnn'))}, "
        f"float32 matmul precision {_text(env.get('float32_matmul_precision'))}, cudnn.benchmark "
        f"{_on_off(env.get('cudnn_benchmark'))}, deterministic algorithms {_on_off(env.get('deterministic_algorithms'))}"
    )
    rows = [
        ("GPU", _gpus(env)),
        ("driver", _text(env.get("driver_version"))),
        ("CUDA runtime (torch build)", _text(env.get("cuda_runtime"))),
        ("cuDNN", _cudnn(env.get("cudnn"))),
        ("torch", _text(env.get("torch"))),
        ("Python", _text(env.get("python"))),
        ("OS", _text(env.get("os"))),
        ("CPU", cpu_text),
        ("git revision", _git(env)),
        ("musgd-bench", _text(env.get("musgd_bench"))),
        ("ultralytics", _text(env.get("ultralytics"))),
        ("speed settings", speed),
        ("recorded", _time(env.get("recorded"))),
        ("GPU clocks, temperature, power at start", _clocks(env.get("gpus_start"))),
        ("… at end", _clocks(env.get("gpus_end"))),
    ]
    for k, resume in enumerate(env.get("resumes") or [], start=1):
        rows.append((f"… at resume {k} ({_time(resume.get('recorded'))})", _clocks(resume.get("gpus"))))
    return rows


def _environment(runs: list[LoadedRun]) -> list[str]:
    tables = [_environment_rows(r.env) for r in runs]
    fields: list[str] = []
    for table in tables:
        for field, _ in table:
            if field not in fields:
                fields.append(field)
    values = [dict(t) for t in tables]
    header = ["field"] + ([f"run {r.number}" for r in runs] if len(runs) > 1 else ["value"])
    rows = [[field] + [v.get(field, "—") for v in values] for field in fields]
    lines = ["## Environment", ""]
    if any(not r.env for r in runs):
        lines += ["A run folder without env.json: its fields read 'not recorded'.", ""]
    lines.append(markdown_table(header, rows))
    return lines


def _describe_arms(plan: Plan) -> str:
    seen: dict[str, Any] = {}
    for case in plan.cases:
        for arm in case.arms:
            seen.setdefault(arm.label, arm)
    parts = []
    for arm in seen.values():
        params = ", ".join(f"{k}={json.dumps(v)}" for k, v in arm.params.items())
        parts.append(
            f"{_code(arm.label)} ({arm.role}, spec {_code(arm.spec)}" + (f", {params})" if params else ")")
        )
    return "; ".join(parts)


def _describe_cases(plan: Plan) -> str:
    parts = []
    for case in plan.cases:
        params = ", ".join(f"{k}={json.dumps(v)}" for k, v in case.params.items())
        parts.append(_code(case.label) + (f" ({params})" if params else ""))
    return ", ".join(parts)


def _log_span(trials: pd.DataFrame) -> str | None:
    if trials.empty or "started" not in trials:
        return None
    starts = [
        (_dt.datetime.fromisoformat(str(s)), float(d))
        for s, d in zip(trials["started"], trials["trial_seconds"], strict=True)
        if not is_missing(s) and not is_missing(d)
    ]
    if not starts:
        return None
    first = min(s for s, _ in starts)
    last = max(s + _dt.timedelta(seconds=d) for s, d in starts)
    seconds = (last - first).total_seconds()
    duration = f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
    return (
        f"The first trial started {_time(first.isoformat())} and the last ended {_time(last.isoformat())} "
        f"({duration})."
    )


def _protocol(run: LoadedRun) -> list[str]:
    plan = run.plan
    arms_per_case = max(len(c.arms) for c in plan.cases) if plan.cases else 2
    unit_word = (
        ("pair" if plan.protocol.pairs == 1 else "pairs")
        if arms_per_case == 2
        else f"rounds (each of the {arms_per_case} arms once per round)"
    )
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:arms_per_case]
    order = (
        f"counterbalanced order ({letters}, {letters[::-1]}, {letters}, …), so slow drift favours neither arm"
        if plan.protocol.order == "alternate"
        else f"an order shuffled within each round by a generator seeded with {plan.protocol.seed}"
    )
    budget = (
        f"{format_bytes(plan.protocol.budget)} (device memory capped through the per-process memory fraction)"
        if plan.protocol.budget is not None
        else "none"
    )
    level = _level([run])
    if plan.protocol.bar is None:
        bar = "no bar was set, so there is no verdict"
    elif plan.protocol.control:
        bar = (
            f"the A/A verdict against {format_limit(plan.protocol.bar, True)} is `within` when the whole interval lies "
            "inside it, `outside` when it lies wholly beyond it, `ambiguous` otherwise"
        )
    else:
        bar = (
            f"the verdict against {format_limit(plan.protocol.bar, False)} is `clears` when the whole interval lies above "
            "it, `fails` when it lies wholly below, `ambiguous` when it straddles it"
        )
    design = [
        f"Arms: {_describe_arms(plan)}.",
        f"Cases: {_describe_cases(plan)}.",
        f"Per case, first {_plural(plan.protocol.warmup, 'warm-up trial')} (cycling through the arms; kept in the log as "
        f"`phase=warmup`, discarded from every statistic), then {plan.protocol.pairs} {unit_word}, in {order}.",
        f"Isolation: {plan.isolation or NOT_RECORDED}.",
        f"Timed region: {plan.timed_region or 'not stated by the tier'}.",
        f"Device: {_code(plan.protocol.device)}; memory budget: {budget}; seed {plan.protocol.seed} (shared by the arms of a pair "
        "for their data; it also seeds the bootstrap"
        + (" and the order)." if plan.protocol.order == "random" else ")."),
    ]
    if plan.settings:
        options = ", ".join(f"{k}={json.dumps(v, sort_keys=True)}" for k, v in plan.settings.items())
        design.append(f"Tier options: {_code(options)}.")
    statistics = [
        f"Primary figure: {plan.metric} in {plan.unit}, lower is better; a failed trial counts as infinitely slow, "
        "never dropped. The paired reduction of a pair is (baseline − arm) / baseline; the interval is a "
        f"{level} (resampling pairs); {bar}.",
    ]
    log = []
    resumes = run.env.get("resumes") or []
    if resumes:
        indices = run.summaries.trials["index"] if not run.summaries.trials.empty else []
        repeated = len(indices) - len(set(indices))
        log.append(
            f"The run was resumed {_plural(len(resumes), 'time')}; "
            + (
                "the log holds each scheduled trial at most once (none re-run)."
                if repeated == 0
                else f"**{repeated} row(s) of the log repeat a trial already logged** (re-run after a resume)."
            )
        )
    span = _log_span(run.summaries.trials)
    if span:
        log.append(span)
    lines = ["### Protocol", "", " ".join(design), "", " ".join(statistics)]
    return lines + (["", " ".join(log)] if log else [])


def _results(run: LoadedRun) -> list[str]:
    plan, summaries = run.plan, run.summaries
    arms = _sorted(summaries.arms, run)
    trials = summaries.trials
    has_peaks = (
        {
            column: column in trials
            and pd.to_numeric(finished(trials)[column], errors="coerce").notna().any()
            for column in ("peak_allocated", "peak_reserved")
        }
        if not trials.empty
        else {"peak_allocated": False, "peak_reserved": False}
    )
    lines = ["### Results", ""]
    if arms.empty:
        return lines + ["No measured trial in the log: nothing to report yet."]
    columns = [
        "case",
        "arm",
        "role",
        "measured trials",
        "failed",
        f"median ({plan.unit})",
        f"min–max ({plan.unit})",
    ]
    columns += [f"peak {c.split('_')[1]} (median)" for c, present in has_peaks.items() if present]
    rows = []
    for _, arm in arms.iterrows():
        row = [
            arm["case"],
            arm["arm"],
            arm["role"],
            int(arm["trials"]),
            int(arm["failed"]),
            format_number(arm["median"]),
            format_range(arm["min"], arm["max"]),
        ]
        row += [
            format_bytes(peak_median(trials, str(arm["case"]), str(arm["arm"]), c))
            for c, present in has_peaks.items()
            if present
        ]
        rows.append(row)
    lines += [f"Per arm, measured trials only ({plan.metric}; failed trials count as infinitely slow):", ""]
    lines += [markdown_table(columns, rows, "lllrrrr" + "r" * sum(has_peaks.values())), ""]
    claims = _sorted(summaries.claims, run)
    if claims.empty:
        return lines + ["No complete pair: no paired reduction yet."]
    rows = [
        [
            c["case"],
            f"{c['arm']} vs {c['baseline_arm']}",
            f"{int(c['pairs'])} of {plan.protocol.pairs}",
            format_percent(c["median"]),
            format_percent_range(c["min"], c["max"]),
            format_interval(c["ci_low"], c["ci_high"]),
            _bar_text(plan),
            f"**{verdict_shown(plan, str(c['arm']), str(c['verdict']))}**",
        ]
        for _, c in claims.iterrows()
    ]
    lines += ["Paired reductions (higher is faster):", ""]
    lines += [
        markdown_table(
            [
                "case",
                "arm vs baseline",
                "pairs",
                "median",
                "min–max",
                f"{_level([run]).split(' ')[0]} interval",
                "bar",
                "verdict",
            ],
            rows,
            "lllrrrll",
        ),
        "",
    ]
    lines.append(f"Interval method: {_level([run])}.")
    for _, c in claims.iterrows():
        case, arm = str(c["case"]), str(c["arm"])
        where = f"case {_code(case)}, " if len(plan.cases) > 1 else ""
        kind = "Diagnostic, not a claim" if run.tier.diagnostic else "Claim"
        lines += [
            "",
            f"**{kind} ({where}{arm} vs {c['baseline_arm']}).** {claim_sentence(plan, summaries, case, arm)}",
        ]
    return lines


def _verdict(run: LoadedRun) -> list[str]:
    plan = run.plan
    claims = _sorted(run.summaries.claims, run)
    lines = ["### Verdict", ""]
    if claims.empty:
        return lines + ["No complete pair: no verdict."]
    if run.tier.diagnostic:
        return lines + ["A diagnostic run (synchronized inside the timed region): no verdict."]
    for _, c in claims.iterrows():
        interval = (
            f"the {100 * float(c['ci_level']):.0f}% interval {format_interval(c['ci_low'], c['ci_high'])}"
        )
        verdict = verdict_shown(plan, str(c["arm"]), str(c["verdict"]))
        limit = (
            "no bar" if plan.protocol.bar is None else format_limit(plan.protocol.bar, plan.protocol.control)
        )
        explanation = {
            "clears": f"{interval} lies wholly above {limit}",
            "fails": f"{interval} lies wholly below {limit}",
            "within": f"{interval} lies inside {limit}: the noise floor is within it",
            "outside": f"{interval} lies wholly beyond {limit}: the arms differ by more than it",
            "ambiguous": f"{interval} straddles {limit}: more pairs or less noise are needed to decide",
            "no bar": f"no bar was set (`--bar`); {interval} is shown for reference",
            "no pairs": "no complete pair",
            WITHHELD: f"{c['arm']} ran the baseline's code ({same_code_arms(plan).get(str(c['arm']))}), so "
            f"{interval} measures noise, not a speed-up",
        }.get(verdict, interval)
        where = f"case {_code(c['case'])}, " if len(plan.cases) > 1 else ""
        lines.append(f"- {where}{c['arm']} vs {c['baseline_arm']}: **{verdict}** — {explanation}.")
    if plan.protocol.control:
        lines += ["", "This run is an A/A control: its verdict is about the noise floor, not a speed-up."]
    return lines


OOM_FIELDS = ("requested", "total", "free", "allocated", "reserved", "budget")
TELEMETRY_FIGURES = (  # (column, what it is) plotted against each trial's figure, where the log has them
    ("cpu_busy_share", "machine CPU busy share"),
    ("cpu_steal_share", "machine CPU steal share"),
    ("load1_start", "1-minute load at the start"),
    ("worker_involuntary_switches", "involuntary context switches"),
    ("gpu0_sm_clock_mhz_end", "GPU 0 SM clock at the end (MHz)"),
    ("gpu0_temperature_c_end", "GPU 0 temperature at the end (°C)"),
)


def _failures(run: LoadedRun) -> list[str]:
    trials = run.summaries.trials
    lines = ["### Failed trials", ""]
    failed = trials[trials["status"] != "ok"] if not trials.empty else trials
    if failed.empty:
        return lines + ["None: every logged trial finished."]
    lines.append(f"{_plural(len(failed), 'failed trial')}; measured ones count as infinitely slow.")
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
            f"`{r['status']}`): {_code(r['message'] or 'no message')}"
            for _, r in other.iterrows()
        ]
    return lines


def _telemetry(run: LoadedRun) -> list[str]:
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
            f"worker on cores {_cell(placement.get('worker_cores'))}, parent on {_cell(placement.get('parent_cores'))}, "
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


def _caveats(run: LoadedRun) -> list[str]:
    items = caveats(run)
    return ["### Caveats", ""] + (
        [f"- {c}" for c in items] if items else ["None derived from the tier or the data."]
    )


def _plots(run: LoadedRun) -> list[str]:
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
        _sorted(summaries.pairs, run),
        _sorted(summaries.claims, run),
        plan,
        run.figures_dir / "reductions.png",
    )
    lines += [
        "",
        markdown_image(reductions, f"{plan.tier}: paired reductions"),
        "",
        "Paired reductions: one point per pair (its arm's marker), the black tick is the median, the thick grey "
        "line the bootstrap interval (an arrowhead where it runs past the axis); a pair far beyond the rest is "
        "drawn at the axis edge with its value"
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


def _tier_section(run: LoadedRun) -> list[str]:
    """The tier's own section."""
    text = run.tier.section(run)
    return [str(text).strip()] if text and str(text).strip() else []


def _run_section(run: LoadedRun) -> list[str]:
    lines = [f"## {run.title}", "", f"Run folder {_code(run.name)}; started {_time(run.plan.created)}."]
    parts = (_protocol, _results, _verdict, _failures, _telemetry, _caveats, _plots, _tier_section)
    if not run.tier.paired:  # a tier whose rows are not paired trials reads them in its own section
        parts = (_tier_section, _failures, _caveats)
    for part in parts:
        body = part(run)
        if body:
            lines += [""] + body
    return lines


# --- the report -------------------------------------------------------------------------------------------


def resolve_output(folders: Sequence[RunFolder], output: Path | None) -> Path:
    """Where the report goes; ``InputError`` (one line) for what cannot be right."""
    if not folders:
        raise InputError("no run folder given; use: bench report RUN_DIR [RUN_DIR …] [-o reports/NAME.md]")
    seen: set[Path] = set()
    for folder in folders:
        key = folder.path.resolve()
        if key in seen:
            raise InputError(f"run folder '{folder.path}' is given twice; name each run folder once")
        seen.add(key)
    if output is None:
        if len(folders) > 1:
            raise InputError(
                f"{len(folders)} run folders make one combined report: name it with -o, e.g. -o reports/NAME.md"
            )
        return folders[0].path / REPORT_NAME
    output = Path(output)
    if output.suffix.lower() != ".md":
        raise InputError(
            f"-o '{output}' is not a markdown file; give a path ending in .md, e.g. reports/NAME.md"
        )
    if output.is_dir():
        raise InputError(
            f"-o '{output}' is a directory; give a file path ending in .md, e.g. reports/NAME.md"
        )
    return output


def _load(folders: Sequence[RunFolder], output: Path, tiers: TierRegistry) -> list[LoadedRun]:
    several = len(folders) > 1
    runs = []
    for number, folder in enumerate(folders, start=1):
        run = Run.load(folder, output.parent / (f"{output.stem}-figures" + (f"-{number}" if several else "")))
        runs.append(LoadedRun(**vars(run), number=number, several=several, tiers=tiers))
    return runs


def render(runs: list[LoadedRun]) -> str:
    """The markdown of the report (and, as it goes, its PNGs in each run's figures folder)."""
    for run in runs:
        run.figures_dir.mkdir(parents=True, exist_ok=True)
    lines = _title(runs) + [""] + _summary(runs) + [""] + _environment(runs)
    for run in runs:
        lines += [""] + _run_section(run)
    return "\n".join(lines).rstrip() + "\n"


def write_report(
    folders: list[RunFolder], tiers: TierRegistry | None = None, output: Path | None = None
) -> Path:
    """Write the report of ``folders`` (one, or several side by side) and return the markdown's path.

    One folder: ``<folder>/report.md`` unless ``output`` says otherwise. Several: ``output`` is required
    (``InputError`` otherwise). ``tiers`` reads each run's tier (its section, caveats); an unknown tier gets
    the defaults. Every input is checked before anything is written; the markdown is written through a
    temporary file and a rename.
    """
    folders = [RunFolder.open(f.path) for f in folders]
    path = resolve_output(folders, output)
    runs = _load(folders, path, tiers or TierRegistry())
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render(runs)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
