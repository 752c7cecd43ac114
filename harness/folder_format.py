"""The run folder's format, declared once: its files, its tables' columns and the doc made of them.

``docs/run-folder.md`` is ``format_reference()``'s text; a test keeps the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.present.model import Section, Table, markdown

PLAN = "plan.json"
ENV = "env.json"
LOG = "trials.jsonl"
LOCK = "run.lock"
TRIALS_CSV = "trials.csv"
ARMS_CSV = "arms.csv"
PAIRS_CSV = "pairs.csv"
CLAIMS_CSV = "claims.csv"
INTERVALS_CSV = "claim_intervals.csv"
DIAGNOSTICS_CSV = "claim_diagnostics.csv"

FILES = {
    PLAN: "What was asked: the protocol options, the tier and its settings, the cases, arms and schedule.",
    ENV: "Where it ran: host, devices, library versions, the code's commit and the arms' file hashes.",
    LOG: "One JSON row per finished trial, appended and fsynced as each trial ends: the record of the run.",
    LOCK: "The folder's lock, held by a running run (its process id inside).",
    TRIALS_CSV: "The log as a table, one row per trial, in schedule order.",
    ARMS_CSV: "Per case and arm: measured trials, failures, median and range of the figure.",
    PAIRS_CSV: "One row per round and compared arm: both figures and the reduction.",
    CLAIMS_CSV: "One row per claim: the estimate, its interval and the verdict.",
    INTERVALS_CSV: "One row per claim and interval method (long).",
    DIAGNOSTICS_CSV: "One row per claim and figure not in the two tables above (long).",
    "claim.txt": "The answer in one sentence per claim, then the caveats.",
    "report.md": "The report, written from the three files above (plan, env, log) alone.",
}
REGENERATED = (TRIALS_CSV, ARMS_CSV, PAIRS_CSV, CLAIMS_CSV, INTERVALS_CSV, DIAGNOSTICS_CSV, "claim.txt")

FIGURE_LIMIT = 1e30  # a figure beyond this is no measurement; the log's reader refuses it
TRIAL_SECONDS_LIMIT = 1e7  # the longest a trial can have taken, in seconds: about 115 days
UINT64_MAX = 2**64 - 1  # counters and bit masks, as NVML and getrusage give them


@dataclass(frozen=True)
class RowField:
    """A log row's field a report reads: its kind, its range, whether an 'ok' row needs it, what it holds."""

    kind: type = float
    low: float = -FIGURE_LIMIT
    high: float = FIGURE_LIMIT
    needed: bool = False
    doc: str = ""


SECONDS = RowField(float, 0.0, TRIAL_SECONDS_LIMIT)
BYTES = RowField(float, 0.0, FIGURE_LIMIT)
TEXT = RowField(str)
POSITIVE_SECONDS = RowField(float, 1 / FIGURE_LIMIT, TRIAL_SECONDS_LIMIT)  # a time compared by ratio
OOM_FIELDS = tuple(
    f"oom_{name}" for name in ("requested", "total", "free", "allocated", "reserved", "budget")
)

# The log's columns: a ``RowField`` where the log's check reads its kind and range.
TRIAL_COLUMNS: dict[str, str | RowField] = {
    "index": "The trial's place in the schedule (warm-ups added later get numbers past it).",
    "case": "The case (a workload, a scale) the trial ran.",
    "phase": "`measured`, or `warmup` (kept in the log, left out of statistics).",
    "round": "The pair (round) the trial belongs to.",
    "slot": "Its position within the round.",
    "order": "The round's order of arms (AB, BA, …).",
    "arm": "The arm's label.",
    "role": "`baseline` or `candidate`.",
    "spec": "The arm's spec (what was built).",
    "case_*, arm_*": "The case's and the arm's parameters.",
    "status": "`ok`, `error` or `resource_failure` (an out-of-memory).",
    "value": "The trial's figure (seconds or milliseconds, lower is better).",
    "started": "When it started (UTC, ISO 8601).",
    "trial_seconds": RowField(float, 0.0, TRIAL_SECONDS_LIMIT, doc="Its wall time, start to end."),
    "message": RowField(str, doc="What failed (first line), for a failed trial."),
    "concurrent_with": "In a duet round: the indices of the trials that ran at the same time.",
    "warmup_reason": RowField(
        str, doc="Why an extra warm-up ran (a resume, an idle gap); empty in the schedule's own."
    ),
    "peak_allocated": RowField(float, 0.0, FIGURE_LIMIT, doc="The allocator's peak of allocated bytes."),
    "peak_reserved": RowField(float, 0.0, FIGURE_LIMIT, doc="The allocator's peak of reserved bytes."),
    "oom_*": RowField(float, 0.0, FIGURE_LIMIT, doc="The byte figures an out-of-memory reported."),
}
ARM_COLUMNS = {
    "case": "The case.",
    "arm": "The arm's label.",
    "role": "`baseline` or `candidate`.",
    "trials": "Measured trials.",
    "failed": "Of those, failed.",
    "median": "Median figure (failures count as infinitely slow).",
    "min": "Smallest figure.",
    "max": "Largest figure.",
}
PAIR_COLUMNS = {
    "case": "The case.",
    "round": "The round.",
    "order": "The round's order of arms.",
    "baseline_arm": "The case's reference arm.",
    "arm": "The compared arm.",
    "baseline": "The reference arm's figure.",
    "candidate": "The compared arm's figure.",
    "reduction": "(baseline − candidate) / baseline: above 0 is faster.",
    "log_ratio": "log(baseline / candidate).",
    "arm_second": "Whether the arm ran after the reference in this round.",
    "both_failed": "Whether both trials failed (no reduction).",
}
CLAIM_COLUMNS = {
    "case": "The case.",
    "arm": "The compared arm.",
    "baseline_arm": "The arm it is compared with.",
    "kind": "`claim`, or `control` for an A/A arm.",
    "pairs": "Complete pairs.",
    "estimate": "The median reduction (above 0: faster).",
    "ci_low": "The interval's low end.",
    "ci_high": "The interval's high end.",
    "ci_level": "The level stated.",
    "ci_attained": "The level the method attains at this pair count.",
    "bar": "The bar (a fraction) the claim is judged against; empty without one.",
    "verdict": "`clears`, `fails`, `ambiguous`, `insufficient`, `within`, `outside`, … (`harness.verdicts`).",
    "median": "The arm's median figure.",
    "min": "The arm's smallest figure.",
    "max": "The arm's largest figure.",
}
INTERVAL_COLUMNS = {
    "case": "The case.",
    "arm": "The compared arm.",
    "interval": "`primary`, a check's name (statistics.md), `failure rate`, `order effect` or `drift`.",
    "estimate": "Its point estimate.",
    "low": "Its low end.",
    "high": "Its high end.",
    "attained": "The level attained.",
    "sufficient": "Whether the pairs suffice for it.",
    "method": "The method's name (see `docs/statistics.md`).",
    "verdict": "The verdict it gives.",
    "reason": "Why it is missing or unbounded, where it is.",
}
DIAGNOSTIC_COLUMNS = {
    "case": "The case.",
    "arm": "The compared arm.",
    "name": "The figure's name (the claims table's column).",
    "value": "Its value.",
}


def format_reference() -> str:
    """The run folder's format as markdown: its files, then each harness table's columns."""
    head = Section("The run folder", depth=1).add(
        "Generated by `harness.folder_format.format_reference()`; do not edit by hand.\n"
        "A run folder is data: the plan, the environment and the log are the record, the rest is derived.\n"
        f"`bench report --tables` writes {', '.join(f'`{name}`' for name in REGENERATED)} again from the log.\n"
        "A tier may add its own tables beside these.\n"
        "The methods behind the figures are in [statistics.md](statistics.md).",
        Table(["file", "what it holds"], [[f"`{name}`", what] for name, what in FILES.items()]),
    )
    for name, columns in (
        (f"{LOG} and {TRIALS_CSV}", TRIAL_COLUMNS),
        (ARMS_CSV, ARM_COLUMNS),
        (PAIRS_CSV, PAIR_COLUMNS),
        (CLAIMS_CSV, CLAIM_COLUMNS),
        (INTERVALS_CSV, INTERVAL_COLUMNS),
        (DIAGNOSTICS_CSV, DIAGNOSTIC_COLUMNS),
    ):
        rows = [[f"`{k}`", getattr(v, "doc", v)] for k, v in columns.items()]
        head.add(Section(name, depth=2).add(Table(["column", "what it holds"], rows)))
    head.add(
        f"A log row may carry more: the tier's figures and the trial's telemetry (both in `{TRIALS_CSV}` too)."
    )
    return "\n".join(markdown(head)) + "\n"
