"""What a fit plan and its rows record, and the check of each read back (an edited plan.json, a log row)."""

from __future__ import annotations

import typing
from dataclasses import fields
from typing import Any

from experiments.fit.plan import AMP_CHOICES, WORKLOADS, FitSettings, check_ranks, check_steps
from experiments.fit.stages import STAGES, stage_column
from harness.errors import InputError
from harness.folder_format import (
    BYTES,
    POSITIVE_SECONDS,
    SECONDS,
    TEXT,
    TRIAL_SECONDS_LIMIT,
    UINT64_MAX,
    RowField,
)
from harness.plan import Plan
from harness.schema import check_choice, check_fields
from harness.validation import row_fields_problem, settings_problem, shape_problem

# What a fit's plan records: its settings as ``make_plan`` resolved them (these three never None).
_TYPES = {**typing.get_type_hints(FitSettings), **dict.fromkeys(("steps", "images", "imgsz"), int)}
# Recorded where a plan has them: older plans lack these (a new setting joins them), or use two older names.
OPTIONAL = ("data", "data_cache", "trial_timeout", "keep_checkpoints", "torchrun")
RECORDED_SHAPE = {f.name: _TYPES[f.name] for f in fields(FitSettings) if f.name not in OPTIONAL}
OPTIONAL_SHAPE = {**{name: _TYPES[name] for name in OPTIONAL}, "data_root": str, "trial_timeout_s": int}


def recorded_settings_problem(plan: Plan) -> str | None:
    """What is wrong with a fit plan's recorded settings (an edited plan.json), or None."""
    problem = settings_problem(plan.settings, RECORDED_SHAPE) or shape_problem(
        plan.settings, OPTIONAL_SHAPE, "settings"
    )
    if problem:
        return problem
    s = FitSettings.from_dict(plan.settings)
    if s.stages != (plan.tier == "stages"):
        return (
            f"settings.stages is {str(s.stages).lower()}, but the plan's tier is '{plan.tier}' (a stages run "
            "records true, a pair false)"
        )
    try:
        check_choice("--workload", s.workload, tuple(w for w in WORKLOADS if w != "auto"))
        check_choice("--amp", s.amp, tuple(a for a in AMP_CHOICES if a != "auto"))
        check_fields(s)
        check_steps(s.steps, s.images, s.batch)
        check_ranks(plan.protocol, s, s.workload, machine=False)  # the start's check: --torchrun above all
    except InputError as exc:
        return f"settings: {exc}"
    return None


# What a fit's report reads of its rows; the steady-state figure is compared by ratio, so positive.
ROW_FIELDS = {
    "steady_s": POSITIVE_SECONDS,
    **{stage_column(stage): SECONDS for stage in STAGES},
    "stage_unattributed_s": RowField(float, -TRIAL_SECONDS_LIMIT, TRIAL_SECONDS_LIMIT),  # a difference
    **{
        key: SECONDS
        for key in (
            "stage_optimizer_first_s",
            "stage_optimizer_step_median_s",
            "stage_optimizer_host_median_s",
            "iteration_sync_median_s",
            "iteration_host_median_s",
        )
    },
    **{key: BYTES for key in ("peak_allocated_sum", "optimizer_plan_bytes", "checkpoint_bytes")},
    **{key: RowField(float) for key in ("train_loss", "val_map50_95", "val_map50", "val_accuracy")},
    **{key: TEXT for key in ("optimizer_class", "optimizer_graphs", "sharing_note")},
    **{
        key: RowField(int, 0, UINT64_MAX)
        for key in ("iterations", "sharing_world", "sharing_matrices_here", "sharing_matrices")
    },
    "rank_matrices_here": RowField(list, 0, UINT64_MAX),  # per rank, null where a rank did not say
    "amp_used": RowField(bool),
}


def recorded_row_problem(row: dict[str, Any]) -> str | None:
    """What is wrong with the fields a fit's report reads of a log row (``ROW_FIELDS``), or None."""
    return row_fields_problem(row, ROW_FIELDS)
