"""A fit's trials: one worker process per trial (or N ranks), the data set ready before the first."""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from experiments.fit.dataset import SyntheticSet, ensure_synthetic_set
from experiments.fit.plan import (
    DDP_TARGET,
    PREPARE_TARGET,
    PREPARE_TIMEOUT_S,
    RANK_TARGET,
    WORKER_TARGET,
    FitSettings,
)
from experiments.fit.ultralytics_fit import offline_environment
from harness.calibration import delay_seconds
from harness.console import console
from harness.errors import InputError
from harness.isolation import RANK_ENVIRONMENT, WorkerDied, WorkerError, run_in_ranks, run_in_worker
from harness.plan import Plan
from harness.safe_fs import fresh_dir, remove_entry
from harness.trial import TrialContext, TrialFunction


def trial_function(plan: Plan) -> TrialFunction:
    """The trial function of a fit plan."""
    settings = FitSettings.from_dict(plan.settings)
    ranks = plan.protocol.gpus
    data_yaml = settings.data
    if settings.workload == "ultralytics" and data_yaml is None:
        spec = SyntheticSet(settings.images, settings.val_images, settings.imgsz, plan.protocol.seed)
        data_yaml = str(ensure_synthetic_set(spec, Path(settings.data_cache)).resolve())
    if settings.workload == "ultralytics":  # the real trainer's data-set side effects, made once
        payload = {"settings": asdict(settings), "data_yaml": data_yaml, "parent_pid": os.getpid()}
        with tempfile.TemporaryDirectory(prefix="bench-prepare-") as config:
            try:
                env = offline_environment(Path(config))
                prepared = run_in_worker(PREPARE_TARGET, payload, timeout_s=PREPARE_TIMEOUT_S, env=env)
            except (WorkerDied, WorkerError) as exc:
                raise InputError(
                    f"the data set {data_yaml} could not be prepared by Ultralytics: {exc}"
                ) from None
        console.print(
            f"data: {data_yaml} built once before the first trial (untimed): "
            f"{len(prepared['label_caches'])} label cache(s)"
            + (", an .npy per image (--cache disk)" if prepared["image_cache"] == "disk" else "")
        )

    def trial(ctx: TrialContext) -> dict[str, Any]:
        trials_dir = fresh_dir(ctx.run_dir / "trials")  # a link there is removed, never followed
        trial_dir = trials_dir / f"{ctx.trial.index:03d}"
        remove_entry(trial_dir)  # a link at the trial's folder: removed, so its target is never emptied
        payload = {
            "settings": asdict(settings),
            "data_yaml": data_yaml,
            "arm_spec": ctx.arm.spec,
            "arm_params": ctx.arm.params,
            "delay_s": delay_seconds(ctx.arm, ctx.run_dir, ctx.case.label),  # a calibration arm's
            "device": ctx.device,
            "budget": plan.protocol.budget,
            "data_seed": plan.protocol.seed,
            "seed": ctx.seed,
            "trial_dir": os.path.abspath(trial_dir),  # never resolved: a link is not followed
            "parent_pid": os.getpid(),
            "devices": list(plan.protocol.rank_devices),
        }
        log_path = trials_dir / f"{ctx.trial.index}.log"
        run = dict(
            timeout_s=settings.trial_timeout, log_path=log_path, placement=ctx.placement, cancel=ctx.cancel
        )
        env = offline_environment(ctx.run_dir / "ultralytics-config")  # its own writable config folder
        try:
            if ranks > 1 and settings.workload == "embedded":
                options = shlex.split(settings.torchrun)
                return run_in_ranks(RANK_TARGET, payload, ranks, env=env, launcher_options=options, **run)
            if ranks > 1:
                return run_in_worker(DDP_TARGET, payload, env={**env, **RANK_ENVIRONMENT}, **run)
            return run_in_worker(WORKER_TARGET, payload, env=env, **run)
        finally:  # small records stay; half-written files go, and checkpoints without --keep-checkpoints
            if trial_dir.exists():
                for unfinished in trial_dir.rglob("*.tmp"):
                    unfinished.unlink(missing_ok=True)
                if not settings.keep_checkpoints:
                    for checkpoint in trial_dir.rglob("*.pt"):
                        checkpoint.unlink(missing_ok=True)
                    shutil.rmtree(trial_dir / "fit" / "weights", ignore_errors=True)
                for folder in sorted(trial_dir.rglob("*"), reverse=True) + [trial_dir]:  # deepest first
                    if folder.is_dir() and not any(folder.iterdir()):
                        folder.rmdir()  # nothing left in it: no empty folder either

    return trial
