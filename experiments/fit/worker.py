"""What runs inside a fit's worker process (a one-device worker, each rank): its set-up, the fit and its figures.

A data-parallel fit's ranks share one synchronized bracket (``RankBracket``) and their records."""

from __future__ import annotations

import math
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from experiments.arms import make_optimizer
from experiments.finite import first_named, non_finite
from experiments.fit import embedded, ultralytics_fit
from experiments.fit.plan import FitSettings
from experiments.fit.stages import epoch_spans, host_iteration_median, stage_figures, steady_seconds
from experiments.ranks import backend_of, barrier, gather_records, init_group, rank_device
from harness.injected import inject
from harness.isolation import die_with_parent
from harness.safe_fs import remove_tree
from harness.timing import (
    StageClock,
    SyncTimer,
    apply_budget,
    read_peaks,
    reset_peaks,
    synchronize,
)


def arm_optimizer_factory(spec: str):
    """``(groups, kwargs) -> optimizer`` of the arm's class, through the one arm resolver."""
    return lambda groups, kwargs: make_optimizer(spec, groups, kwargs)


def fresh_trial_dir(payload: dict[str, Any]) -> Path:
    """The payload's trial folder, emptied: a resumed trial starts clean."""
    trial_dir = Path(payload["trial_dir"])
    remove_tree(trial_dir)
    trial_dir.mkdir(parents=True)
    return trial_dir


def stage_clock(settings: FitSettings, device: str, rank: int = 0) -> StageClock:
    """A ``--stages`` fit's clock on rank 0; a clock that marks nothing elsewhere."""
    return StageClock(device, enabled=settings.stages and rank == 0)


def embedded_fit(
    payload: dict[str, Any],
    settings: FitSettings,
    device: str,
    clock: StageClock,
    rank: int = 0,
    world: int = 1,
) -> dict[str, Any]:
    """The embedded workload's whole fit, sized by ``settings`` and seeded by the payload."""
    return embedded.fit(
        arm_optimizer_factory(payload["arm_spec"]),
        settings,
        device=device,
        data_seed=int(payload["data_seed"]),
        seed=int(payload["seed"]),
        trial_dir=Path(payload["trial_dir"]),
        clock=clock,
        rank=rank,
        world=world,
    )


def prepare_device(device: str, budget: int | None) -> None:
    """Select a CUDA device and apply the memory budget; nothing on the CPU."""
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device).index or 0)  # "cuda" alone names no index
        torch.cuda.init()
        apply_budget(budget, device)


def non_finite_results(figures: dict[str, Any], trained: dict[str, torch.nn.Module]) -> list[str]:
    """What is not finite at the end of a fit: its loss, its validation figures, its models' parameters."""
    problems = [
        f"{name} {value}"
        for name, value in figures.items()
        if (name == "train_loss" or name.startswith("val_"))
        and isinstance(value, float)
        and not math.isfinite(value)
    ]
    for module_name, module in trained.items():
        bad = non_finite(module.named_parameters(), " entries") if module is not None else []
        if bad:
            problems.append(f"{module_name} parameter{'s' if len(bad) > 1 else ''} {first_named(bad)}")
    return problems


def finite_checked(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` without its trained modules and with its loss a number."""
    trained = result.pop("trained", None) or {}
    if isinstance(result.get("train_loss"), torch.Tensor):
        result["train_loss"] = float(result["train_loss"])
    problems = non_finite_results(result, trained)
    if problems:
        raise FloatingPointError("non-finite results after the fit: " + "; ".join(problems))
    return result


def fit_figures(
    settings: FitSettings,
    result: dict[str, Any],
    seconds: float,
    peak_allocated: int | None,
    peak_reserved: int | None,
    clock: StageClock,
) -> dict[str, Any]:
    """The row's figures of one finished fit: checks that it did what was asked, then the derived figures."""
    if result["iterations"] != settings.steps:
        raise RuntimeError(
            f"the fit ran {result['iterations']} iterations, not the {settings.steps} steps asked "
            f"({settings.epochs} epochs of {settings.iterations_per_epoch}); its figure would not be comparable"
        )
    result = finite_checked(result)
    stamps = result.pop("iteration_stamps")
    per_epoch = result.pop("iterations_per_epoch")
    spans = [round(span, 6) for span in epoch_spans(result.pop("epoch_start_stamps"), stamps, per_epoch)]
    sharing = result.pop("optimizer_sharing", None) or {}
    graphs = result.pop("optimizer_graphs", None)  # how each step's core ran, as one line
    figures: dict[str, Any] = {
        "value": round(seconds, 6),
        "iteration_host_median_s": host_iteration_median(stamps, per_epoch),
        "steady_s": steady_seconds(spans),
        "epoch_train_s": spans,
        "peak_allocated": peak_allocated,
        "peak_reserved": peak_reserved,
        **result,
        **{f"sharing_{key}": sharing.get(key) for key in ("world", "matrices_here", "matrices", "note")},
        "optimizer_graphs": ", ".join(f"{how} {n}" for how, n in sorted(graphs.items())) if graphs else None,
        "worker_torch": torch.__version__,
        "worker_cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
    }
    if clock.enabled:
        figures.update(stage_figures(clock, seconds, per_epoch))
    return figures


def prepare_data(payload: dict[str, Any]) -> dict[str, Any]:
    """The preparatory worker's target: the real trainer's data-set side effects, made once before any trial."""
    die_with_parent(payload.get("parent_pid"))
    return ultralytics_fit.prepare_dataset(FitSettings.from_dict(payload["settings"]), payload["data_yaml"])


def run_fit(payload: dict[str, Any]) -> dict[str, Any]:
    """One whole fit of the payload's arm; returns the trial's figures (``value`` = wall seconds)."""
    die_with_parent(payload.get("parent_pid"))
    settings = FitSettings.from_dict(payload["settings"])
    device = payload["device"]
    trial_dir = fresh_trial_dir(payload)
    clock = stage_clock(settings, device)
    prepare_device(device, payload.get("budget"))
    if settings.workload == "ultralytics":
        make = arm_optimizer_factory(payload["arm_spec"])
        fit = ultralytics_fit.prepare_fit(
            settings, payload["data_yaml"], make, device, int(payload["seed"]), trial_dir, clock
        )
    else:
        fit = partial(embedded_fit, payload, settings, device, clock)
    reset_peaks(device)
    with SyncTimer(device) as timer:
        clock.start()
        result = fit()
        clock.mark("other")
        # A calibration arm's delay, after the last checkpoint (a sync).
        injected = inject(payload.get("delay_s"))
    peak_allocated, peak_reserved = read_peaks(device)
    return {**fit_figures(settings, result, timer.seconds, peak_allocated, peak_reserved, clock), **injected}


class RankBracket:
    """The fit's synchronized bracket on every rank."""

    def __init__(self, device: str, clock: StageClock | None = None) -> None:
        self.device = device
        self.clock = clock if clock is not None else StageClock(enabled=False)
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
