"""Data-parallel fits: what every rank does around its share of the fit, and the embedded rank program."""

from __future__ import annotations

import time
from typing import Any

import torch.distributed as dist

from experiments.fit.plan import FitSettings
from experiments.fit.worker import embedded_fit, fit_figures, fresh_trial_dir, prepare_device, stage_clock
from experiments.ranks import backend_of, barrier, gather_records, init_group, rank_device
from harness.timing import NullClock, StageClock, read_peaks, reset_peaks, synchronize


class RankBracket:
    """The fit's synchronized bracket on every rank."""

    def __init__(self, device: str, clock: StageClock | None = None) -> None:
        self.device = device
        self.clock = clock if clock is not None else NullClock()
        self.start_ns = self.stop_ns = 0

    def __enter__(self) -> RankBracket:
        synchronize(self.device)
        barrier(self.device)
        synchronize(self.device)
        self.start_ns = time.perf_counter_ns()
        self.clock.start()
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is not None:
            return
        synchronize(self.device)
        barrier(self.device)
        self.clock.mark("other")
        self.stop_ns = time.perf_counter_ns()

    @property
    def seconds(self) -> float:
        return (self.stop_ns - self.start_ns) / 1e9


def rank_record(rank: int, seconds: float, device: str, sharing: dict[str, Any] | None) -> dict[str, Any]:
    """What one rank contributes to the row, read after its bracket closed."""
    allocated, reserved = read_peaks(device)
    return {
        "rank": rank,
        "seconds": round(seconds, 6),
        "peak_allocated": allocated,
        "peak_reserved": reserved,
        "matrices_here": (sharing or {}).get("matrices_here"),
    }


def rank_columns(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The row's per-rank columns: each rank's bracket and peaks, the peaks' max and sum."""
    out: dict[str, Any] = {"ranks": len(records), "rank_seconds": [r["seconds"] for r in records]}
    for peak in ("peak_allocated", "peak_reserved"):
        values = out[f"rank_{peak}"] = [r[peak] for r in records]
        known = None not in values
        out[peak], out[f"{peak}_sum"] = (max(values), sum(values)) if known else (None, None)
    out["rank_matrices_here"] = [r["matrices_here"] for r in records]
    return out


def import_ahead() -> None:
    """Import what the DistributedDataParallel constructor imports."""
    import torch._dynamo  # noqa: F401
    from torch.nn.parallel import DistributedDataParallel  # noqa: F401


def run_rank_fit(payload: dict[str, Any]) -> dict[str, Any]:
    """One rank of an embedded data-parallel fit."""
    rank, world, device = rank_device(payload["devices"])
    settings = FitSettings.from_dict(payload["settings"])
    if settings.batch % world:
        raise ValueError(f"the global batch {settings.batch} is not a multiple of the {world} ranks")
    prepare_device(device, payload.get("budget"))
    import_ahead()
    init_group(device)
    try:
        if rank == 0:
            fresh_trial_dir(payload)
        barrier(device)
        clock = stage_clock(settings, device, rank)
        reset_peaks(device)
        with RankBracket(device, clock) as bracket:
            result = embedded_fit(payload, settings, device, clock, rank, world)
        records = gather_records(rank_record(rank, bracket.seconds, device, result.get("optimizer_sharing")))
    finally:
        dist.destroy_process_group()
    figures = fit_figures(settings, result, bracket.seconds, None, None, clock)
    figures.update(rank_columns(records))
    figures["backend"] = backend_of(device)
    return figures
