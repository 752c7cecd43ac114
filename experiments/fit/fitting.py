"""What every process running a fit shares (a one-device worker, each rank): its set-up, checks and figures."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from experiments.arms import make_optimizer
from experiments.finite import first_named, non_finite
from experiments.fit import embedded
from experiments.fit.plan import FitSettings
from experiments.fit.stages import epoch_spans, host_iteration_median, stage_figures, steady_seconds
from harness.safe_fs import remove_tree
from harness.timing import NullClock, StageClock, apply_budget


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
    return StageClock(device) if settings.stages and rank == 0 else NullClock()


def embedded_fit(
    payload: dict[str, Any],
    settings: FitSettings,
    device: str,
    clock: StageClock,
    rank: int = 0,
    world: int = 1,
) -> dict[str, Any]:
    """The embedded workload's whole fit, sized by ``settings`` and seeded by the payload."""
    sizes = {
        name: getattr(settings, name) for name in ("images", "val_images", "imgsz", "batch", "epochs", "amp")
    }
    return embedded.fit(
        arm_optimizer_factory(payload["arm_spec"]),
        device=device,
        **sizes,
        data_seed=int(payload["data_seed"]),
        seed=int(payload["seed"]),
        trial_dir=Path(payload["trial_dir"]),
        clock=clock,
        rank=rank,
        world=world,
    )


def prepare_device(device: str, budget: int | None) -> None:
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device).index or 0)  # "cuda" alone names no index
        torch.cuda.init()
        apply_budget(budget, device)


def non_finite_results(figures: dict[str, Any], trained: dict[str, torch.nn.Module]) -> list[str]:
    """What is not finite at the end of a fit."""
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


def graph_counts(stats: dict[str, int] | None) -> str | None:
    """An optimizer's ``graph_stats`` (how each step's core ran) as one line, or None."""
    if not stats:
        return None
    return ", ".join(f"{how} {count}" for how, count in sorted(stats.items()))


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
    graphs = result.pop("optimizer_graphs", None)
    figures: dict[str, Any] = {
        "value": round(seconds, 6),
        "iteration_host_median_s": host_iteration_median(stamps, per_epoch),
        "steady_s": steady_seconds(spans),
        "epoch_train_s": spans,
        "peak_allocated": peak_allocated,
        "peak_reserved": peak_reserved,
        **result,
        **{f"sharing_{key}": sharing.get(key) for key in ("world", "matrices_here", "matrices", "note")},
        "optimizer_graphs": graph_counts(graphs),
        "worker_torch": torch.__version__,
        "worker_cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
    }
    if clock.enabled:
        figures.update(stage_figures(clock, seconds, per_epoch))
    return figures
