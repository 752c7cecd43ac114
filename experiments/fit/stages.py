"""Stage attribution for the ``--stages`` diagnostic: where the time of one whole fit goes.

A ``StageClock`` keeps one cursor. Each ``mark(stage)`` synchronizes the device, reads the clock and charges
the time since the previous mark to ``stage``; the fit calls it at every stage boundary (batch fetched,
backward done, optimizer step entered and left, EMA updated, validation and checkpoint done), so the stages
add up exactly to the whole bracket. Those synchronizations change what they measure a little, which is why
this runs only in its own diagnostic run folder and never inside a claim (GUIDE §3). The claim runs use
``NullClock``, whose marks do nothing.

Stages (both workloads use the same names):

* ``data``: fetching the batch (loader, augmentation), moving it to the device and normalizing it
* ``forward_backward``: forward, loss and backward (the warm-up learning-rate interpolation, microseconds,
  falls in this stage in the embedded loop and in ``data`` in the real trainer, whose loop runs it first)
* ``optimizer``: ``optimizer.step()`` alone — the only stage an optimizer-only change can shorten
* ``step_overhead``: gradient unscale and clipping, scaler update, ``zero_grad``
* ``ema``: the EMA update of the weights
* ``validation``: validation each epoch and the final validation
* ``checkpoint``: writing checkpoints
* ``other``: the rest: set-up (model, dataset and image cache, loaders), per-epoch scheduling, logging
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from itertools import pairwise
from typing import Any

from harness.timing import synchronize

STAGES = (
    "data",
    "forward_backward",
    "optimizer",
    "step_overhead",
    "ema",
    "validation",
    "checkpoint",
    "other",
)
OPTIMIZER_STAGE = "optimizer"


def stage_column(stage: str) -> str:
    """The trial-log column holding one stage's seconds."""
    return f"stage_{stage}_s"


class NullClock:
    """The clock of a claim run: every call is a no-op, so nothing is added inside the timed bracket."""

    enabled = False

    def start(self) -> None:
        pass

    def mark(self, stage: str) -> None:
        pass

    def iteration(self) -> None:
        pass

    def wrap(self, function: Callable[..., Any], before: str, after: str) -> Callable[..., Any]:
        return function


class StageClock(NullClock):
    """Synchronized stage attribution (diagnostic runs only)."""

    enabled = True

    def __init__(self, device: str) -> None:
        self.device = device
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.iteration_starts: list[float] = []
        self._last = 0.0

    def start(self) -> None:
        synchronize(self.device)
        self._last = time.perf_counter()

    def mark(self, stage: str) -> None:
        """Charge the time since the previous mark to ``stage``."""
        synchronize(self.device)
        now = time.perf_counter()
        self.seconds[stage] += now - self._last
        self._last = now

    def iteration(self) -> None:
        """Mark the start of a training iteration (its fetch is charged to ``data``)."""
        self.mark("data")
        self.iteration_starts.append(self._last)

    def wrap(self, function: Callable[..., Any], before: str, after: str) -> Callable[..., Any]:
        """``function`` bracketed: time up to its call goes to ``before``, its own time to ``after``."""

        def bracketed(*args: Any, **kwargs: Any) -> Any:
            self.mark(before)
            try:
                return function(*args, **kwargs)
            finally:
                self.mark(after)

        return bracketed

    def figures(self, whole_seconds: float, iterations_per_epoch: int) -> dict[str, float]:
        """Per-stage seconds, their sum's gap to the whole bracket, and the synchronized median iteration."""
        out = {stage_column(s): round(v, 6) for s, v in self.seconds.items()}
        out["stage_unattributed_s"] = round(whole_seconds - sum(self.seconds.values()), 6)
        gaps = within_epoch_gaps(self.iteration_starts, iterations_per_epoch)
        if gaps:
            out["iteration_sync_median_s"] = round(statistics.median(gaps), 6)
        return out


def within_epoch_gaps(stamps: list[float], iterations_per_epoch: int) -> list[float]:
    """Gaps between consecutive per-iteration timestamps, leaving out each gap across an epoch end
    (which holds validation and checkpoints, not an iteration)."""
    return [b - a for i, (a, b) in enumerate(pairwise(stamps)) if (i + 1) % iterations_per_epoch != 0]


def host_iteration_median(stamps: list[float], iterations_per_epoch: int) -> float | None:
    """Median gap between consecutive iteration-end host timestamps within an epoch (no synchronization).

    Work on a GPU is queued asynchronously, so these are host-side cadences; the trainer reads the loss back
    every iteration, which keeps the host close to the device, but the figure is a diagnostic, not a claim.
    """
    gaps = within_epoch_gaps(stamps, iterations_per_epoch)
    return round(statistics.median(gaps), 6) if gaps else None
