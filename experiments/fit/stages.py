"""Stage attribution for ``--stages``: where the time of one whole fit goes."""

from __future__ import annotations

import statistics
from itertools import pairwise

from harness.timing import StageClock

STAGES = tuple("data forward_backward optimizer step_overhead ema validation checkpoint other".split())
OPTIMIZER_STAGE = "optimizer"


def stage_column(stage: str) -> str:
    """The trial-log column holding one stage's seconds."""
    return f"stage_{stage}_s"


def stage_figures(clock: StageClock, whole_seconds: float, iterations_per_epoch: int) -> dict[str, float]:
    """Per-stage seconds of a ``--stages`` fit, their sum's gap to the whole bracket."""
    totals = clock.totals(STAGES)
    out = {stage_column(s): round(v, 6) for s, v in totals.items()}
    out["stage_unattributed_s"] = round(whole_seconds - sum(totals.values()), 6)
    gaps = within_epoch_gaps(clock.iteration_starts(), iterations_per_epoch)
    if gaps:
        out["iteration_sync_median_s"] = round(statistics.median(gaps), 6)
    steps = [seconds for stage, seconds in clock.intervals() if stage == OPTIMIZER_STAGE]
    if len(steps) > 1:  # the first step apart (an optimizer may plan and capture there), the rest's median
        out["stage_optimizer_first_s"] = round(steps[0], 6)
        out["stage_optimizer_step_median_s"] = round(statistics.median(steps[1:]), 6)
    # Of each step, the host's own time: the device was idle when the step began (the mark before it
    # synchronized), so the rest of the step is the device finishing what the host queued.
    hosts = [seconds for stage, seconds in clock.host_intervals() if stage == OPTIMIZER_STAGE]
    if len(hosts) > 1:
        out["stage_optimizer_host_median_s"] = round(statistics.median(hosts[1:]), 6)
    return out


def within_epoch_gaps(stamps: list[float], iterations_per_epoch: int) -> list[float]:
    """Gaps between consecutive per-iteration timestamps, leaving out each gap across an epoch end."""
    return [b - a for i, (a, b) in enumerate(pairwise(stamps)) if (i + 1) % iterations_per_epoch != 0]


def host_iteration_median(stamps: list[float], iterations_per_epoch: int) -> float | None:
    """Median gap between consecutive iteration-end host timestamps within an epoch (no synchronization)."""
    gaps = within_epoch_gaps(stamps, iterations_per_epoch)
    return round(statistics.median(gaps), 6) if gaps else None


def epoch_spans(
    epoch_starts: list[float], iteration_ends: list[float], iterations_per_epoch: int
) -> list[float]:
    """Each epoch's training time: from its start to the end of its last iteration."""
    return [
        iteration_ends[(epoch + 1) * iterations_per_epoch - 1] - start
        for epoch, start in enumerate(epoch_starts)
        if (epoch + 1) * iterations_per_epoch <= len(iteration_ends)
    ]


def steady_seconds(spans: list[float]) -> float | None:
    """The steady-state figure: the training time of every epoch after the first."""
    return round(sum(spans[1:]), 6) if len(spans) > 1 else None
