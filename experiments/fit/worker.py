"""What runs inside a fit trial's fresh worker process: one whole fit, timed, sized and checked."""

from __future__ import annotations

from functools import partial
from typing import Any

from experiments.fit import ultralytics_fit
from experiments.fit.fitting import (
    arm_optimizer_factory,
    embedded_fit,
    fit_figures,
    fresh_trial_dir,
    prepare_device,
    stage_clock,
)
from experiments.fit.plan import FitSettings
from harness.injected import inject
from harness.isolation import die_with_parent
from harness.timing import SyncTimer, read_peaks, reset_peaks


def prepare_data(payload: dict[str, Any]) -> dict[str, Any]:
    """The preparatory worker's target: the real trainer's data-set side effects, made once before any trial."""
    die_with_parent(payload.get("parent_pid"))
    return ultralytics_fit.prepare_dataset(FitSettings.from_dict(payload["settings"]), payload["data_yaml"])


def run_fit(payload: dict[str, Any]) -> dict[str, Any]:
    """One whole fit of the payload's arm; returns the trial's figures (``value`` = wall seconds)."""
    die_with_parent(payload.get("parent_pid"))
    settings = FitSettings.from_dict(payload["settings"])
    if int(payload.get("ranks", 1)) > 1:
        # Imports ultralytics at its top: only a real-trainer DDP fit needs it.
        from experiments.fit import ultralytics_ddp

        return ultralytics_ddp.launch_fit(payload, settings)
    device = payload["device"]
    trial_dir = fresh_trial_dir(payload)
    clock = stage_clock(settings, device)
    prepare_device(device, payload.get("budget"))
    fit = partial(embedded_fit, payload, settings, device, clock)
    if settings.workload == "ultralytics":
        make_optimizer, seed = arm_optimizer_factory(payload["arm_spec"]), int(payload["seed"])
        fit = ultralytics_fit.prepare_fit(
            settings, payload["data_yaml"], make_optimizer, device, seed, trial_dir, clock
        )
    reset_peaks(device)
    with SyncTimer(device) as timer:
        clock.start()
        result = fit()
        clock.mark("other")
        # A calibration arm's delay, after the last checkpoint (a sync).
        injected = inject(payload.get("delay_s"))
    peak_allocated, peak_reserved = read_peaks(device)
    return {**fit_figures(settings, result, timer.seconds, peak_allocated, peak_reserved, clock), **injected}
