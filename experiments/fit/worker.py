"""What runs inside a fit trial's fresh worker process: one whole fit, timed, sized and checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.fit import embedded, ultralytics_fit
from experiments.fit.fitting import arm_optimizer_factory, fit_figures, prepare_device
from experiments.fit.plan import FitSettings
from harness.injected import inject
from harness.isolation import die_with_parent
from harness.safe_fs import remove_tree
from harness.timing import NullClock, StageClock, SyncTimer, read_peaks, reset_peaks


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
    device, seed = payload["device"], int(payload["seed"])
    trial_dir = Path(payload["trial_dir"])
    remove_tree(trial_dir)  # a resumed trial starts clean
    trial_dir.mkdir(parents=True)
    make_optimizer = arm_optimizer_factory(payload["arm_spec"])
    clock = StageClock(device) if settings.stages else NullClock()
    prepare_device(device, payload.get("budget"))

    if settings.workload == "ultralytics":
        fit = ultralytics_fit.prepare_fit(
            settings, payload["data_yaml"], make_optimizer, device, seed, trial_dir, clock
        )
    else:

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
        # A calibration arm's delay, after the last checkpoint (a sync).
        injected = inject(payload.get("delay_s"))
    peak_allocated, peak_reserved = read_peaks(device)
    return {**fit_figures(settings, result, timer.seconds, peak_allocated, peak_reserved, clock), **injected}
