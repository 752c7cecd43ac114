"""What runs inside a fit trial's fresh worker process: one whole fit, timed, sized and checked.

``run_fit(payload)`` is the target ``harness.isolation`` calls. Around the fit it does only what must happen
outside the timed bracket: tie the worker's life to the parent's, import the workload, initialize the
device and apply any memory budget, reset the peak-memory counters. The bracket itself is one
``SyncTimer`` (synchronize, clock, fit, synchronize, clock); nothing inside it synchronizes unless this is a
``--stages`` diagnostic run. After it: peaks, checks that the fit did what was asked and that its loss,
parameters and validation figures are finite (a NaN fit is a failed trial, never a fast one), the row's
figures.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from experiments.fit.plan import FitSettings
from experiments.fit.stages import epoch_spans, host_iteration_median, stage_figures, steady_seconds
from harness.isolation import die_with_parent
from harness.safe_fs import remove_tree
from harness.timing import NullClock, StageClock, SyncTimer, apply_budget, read_peaks, reset_peaks


def arm_optimizer_factory(spec: str):
    """``(groups, kwargs) -> optimizer`` of the arm's class, through the one arm resolver."""
    from experiments.arms import make_optimizer

    return lambda groups, kwargs: make_optimizer(spec, groups, kwargs)


def _prepare_device(device: str, budget: int | None) -> None:
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device).index or 0)  # "cuda" alone names no index
        torch.cuda.init()
        apply_budget(budget, device)


NAMED_PER_MODULE = 3  # non-finite parameters named in the message before "and N more"


def non_finite_results(figures: dict[str, Any], trained: dict[str, torch.nn.Module]) -> list[str]:
    """What is not finite at the end of a fit: the training loss, the validation figures (``val_*``) and every
    floating-point parameter of the trained modules (the model and its EMA); empty when all are finite."""
    problems = [
        f"{name} {value}"
        for name, value in figures.items()
        if (name == "train_loss" or name.startswith("val_"))
        and isinstance(value, float)
        and not math.isfinite(value)
    ]
    for module_name, module in trained.items():
        if module is None:
            continue
        bad = []
        with torch.no_grad():
            for name, parameter in module.named_parameters():
                if parameter.is_floating_point():
                    finite = int(torch.isfinite(parameter).sum())
                    if finite < parameter.numel():
                        bad.append(f"{name} ({parameter.numel() - finite} of {parameter.numel()} entries)")
        named = ", ".join(bad[:NAMED_PER_MODULE]) + (
            f" and {len(bad) - NAMED_PER_MODULE} more" if len(bad) > NAMED_PER_MODULE else ""
        )
        if bad:
            problems.append(f"{module_name} parameter{'s' if len(bad) > 1 else ''} {named}")
    return problems


def finite_checked(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` without its trained modules and with its loss a number, once every figure and parameter was
    found finite (``FloatingPointError`` naming what is not); a result already checked passes as it is."""
    trained = result.pop("trained", None) or {}
    if isinstance(result.get("train_loss"), torch.Tensor):
        result["train_loss"] = float(result["train_loss"])
    problems = non_finite_results(result, trained)
    if problems:
        raise FloatingPointError("non-finite results after the fit: " + "; ".join(problems))
    return result


def graph_counts(stats: dict[str, int] | None) -> str | None:
    """An optimizer's ``graph_stats`` (how each step's core ran) as one line, e.g. 'captured 1, replayed 383';
    None for an optimizer that keeps no such counts."""
    if not stats:
        return None
    return ", ".join(f"{how} {count}" for how, count in sorted(stats.items()))


def prepare_data(payload: dict[str, Any]) -> dict[str, Any]:
    """The preparatory worker's target: the real trainer's data-set side effects, made once before any trial."""
    die_with_parent(payload.get("parent_pid"))
    from experiments.fit import ultralytics_fit

    return ultralytics_fit.prepare_dataset(FitSettings.from_dict(payload["settings"]), payload["data_yaml"])


def run_fit(payload: dict[str, Any]) -> dict[str, Any]:
    """One whole fit of the payload's arm; returns the trial's figures (``value`` = wall seconds).

    With several ranks on the real trainer this worker only launches Ultralytics' DDP fit (its ranks time
    the fit); the embedded workload's ranks run ``experiments.fit.ddp.run_rank_fit`` instead.
    """
    die_with_parent(payload.get("parent_pid"))
    settings = FitSettings.from_dict(payload["settings"])
    if int(payload.get("ranks", 1)) > 1:
        from experiments.fit import ultralytics_ddp

        return ultralytics_ddp.launch_fit(payload, settings)
    device, seed = payload["device"], int(payload["seed"])
    trial_dir = Path(payload["trial_dir"])
    remove_tree(trial_dir)  # a resumed trial starts clean
    trial_dir.mkdir(parents=True)
    make_optimizer = arm_optimizer_factory(payload["arm_spec"])
    clock = StageClock(device) if settings.stages else NullClock()
    _prepare_device(device, payload.get("budget"))

    if settings.workload == "ultralytics":
        from experiments.fit import ultralytics_fit

        fit = ultralytics_fit.prepare_fit(
            settings, payload["data_yaml"], make_optimizer, device, seed, trial_dir, clock
        )
    else:
        from experiments.fit import embedded

        def fit() -> dict[str, Any]:
            return embedded.fit(
                make_optimizer,
                device=device,
                **embedded.sized_by(settings),
                data_seed=int(payload["data_seed"]),
                seed=seed,
                trial_dir=trial_dir,
                clock=clock,
            )

    reset_peaks(device)
    with SyncTimer(device) as timer:
        clock.start()
        result = fit()
        clock.mark("other")
    peak_allocated, peak_reserved = read_peaks(device)
    return fit_figures(settings, result, timer.seconds, peak_allocated, peak_reserved, clock)


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
