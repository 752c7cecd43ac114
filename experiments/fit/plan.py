"""The complete-fit tier's plan: its settings, their checks, and the trial function that starts each worker.

One trial is one whole short training run in a fresh worker process (``harness.isolation.run_in_worker``);
the parent only schedules, writes the payload and collects the row. It never touches the GPU: it does not
even import ultralytics (``--workload auto`` only asks whether the package could be imported).

Steps and epochs. Every iteration steps the optimizer (``nbs`` = batch), so a fit of ``--steps S`` with
``--images N`` training images at ``--batch B`` is ``S / (N / B)`` epochs of ``N / B`` iterations: the
default 384 steps of 256 images at batch 4 are 6 epochs of 64 iterations. Only whole epochs are run (the
trainer's schedule, validation and checkpoints are per epoch), so ``N`` must be a multiple of ``B`` and ``S``
a multiple of ``N / B``; anything else is refused with one line saying what would work.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from experiments.arms import checked_optimizer
from harness.console import console
from harness.isolation import run_in_worker
from harness.options import InputError, check_choice, check_non_negative, check_positive, protocol_options
from harness.protocol import Case, Plan, TrialContext, TrialFunction
from harness.tables import RunFolder

WORKLOADS = ("auto", "ultralytics", "embedded")
AMP_CHOICES = ("auto", "bf16", "fp16", "fp32")
CACHE_CHOICES = ("ram", "disk", "none")
DEFAULT_STEPS, DEFAULT_IMAGES, DEFAULT_VAL_IMAGES, DEFAULT_BATCH = 384, 256, 32, 4
DEFAULT_IMGSZ = {"ultralytics": 640, "embedded": 32}
DEFAULT_MODEL = "yolo26n.yaml"
DEFAULT_TRIAL_TIMEOUT_S = 3600
YOLO_STRIDE = 32
WORKER_TARGET = "experiments.fit.worker:run_fit"


@dataclass(frozen=True)
class FitSettings:
    """What one fit does, the same for every trial of a run (saved in ``plan.options``)."""

    workload: str
    steps: int
    epochs: int
    images: int
    val_images: int
    batch: int
    imgsz: int
    amp: str
    model: str
    data: str | None
    data_root: str
    data_seed: int
    workers: int
    cache: str
    close_mosaic: int
    stages: bool
    trial_timeout_s: int
    keep_checkpoints: bool

    @property
    def iterations_per_epoch(self) -> int:
        return self.images // self.batch

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> FitSettings:
        return cls(**{k: options[k] for k in cls.__dataclass_fields__})


def ultralytics_importable() -> bool:
    """Whether the real trainer could run here (ultralytics and its torchvision), without importing them."""
    return all(importlib.util.find_spec(name) is not None for name in ("ultralytics", "torchvision"))


def resolve_workload(workload: str) -> tuple[str, str]:
    """(workload, why): ``auto`` picks the real trainer when it is importable, else the embedded one."""
    check_choice("--workload", workload, WORKLOADS)
    importable = ultralytics_importable()
    if workload == "auto":
        if importable:
            return "ultralytics", "auto: ultralytics is importable, so the real Ultralytics trainer"
        return "embedded", "auto: ultralytics is not importable here, so the embedded workload"
    if workload == "ultralytics" and not importable:
        raise InputError(
            "--workload ultralytics: ultralytics (with torchvision) is not importable here; install the extra "
            "(pip install -e '.[ultralytics]') or use --workload embedded"
        )
    return workload, f"--workload {workload}"


def _model_known(model: str) -> bool:
    """A model yaml that exists as a path, or one ultralytics ships (``yolo26n.yaml`` → ``yolo26.yaml``, scale n)."""
    if Path(model).is_file():
        return True
    spec = importlib.util.find_spec("ultralytics")
    if spec is None or not spec.submodule_search_locations:
        return False
    models = Path(next(iter(spec.submodule_search_locations))) / "cfg" / "models"
    stem = Path(model).stem
    unscaled = stem[:-1] if stem and stem[-1] in "nslmx" and stem[:-1][-1:].isdigit() else stem
    return any(p.stem in (stem, unscaled) for p in models.rglob("*.yaml"))


def check_model(model: str) -> str:
    if Path(model).suffix.lower() not in (".yaml", ".yml"):
        raise InputError(
            f"--model '{model}' is not a model yaml; fits start from scratch (no pretrained weights): "
            "give a yaml such as yolo26n.yaml or path/to/model.yaml"
        )
    if not _model_known(model):
        raise InputError(
            f"--model '{model}': no such file, and ultralytics ships no such model yaml (e.g. yolo26n.yaml)"
        )
    return model


def check_steps(steps: int, images: int, batch: int) -> int:
    """Epochs for ``steps`` optimizer steps over ``images`` at ``batch``; ``InputError`` unless whole epochs."""
    check_positive("--steps", steps)
    check_positive("--batch", batch)
    if images % batch:
        lower, upper = images - images % batch, images - images % batch + batch
        raise InputError(
            f"{images} training images are not a whole number of batches of {batch}: every epoch must be whole "
            f"batches; use a multiple of --batch (e.g. --images {upper}" + (f" or {lower})" if lower else ")")
        )
    per_epoch = images // batch
    if steps % per_epoch:
        lower, upper = steps - steps % per_epoch, steps - steps % per_epoch + per_epoch
        raise InputError(
            f"--steps {steps} is not a whole number of epochs of {per_epoch} iterations ({images} images / batch "
            f"{batch}); use a multiple of {per_epoch} (e.g. --steps {upper}"
            + (f" or {lower})" if lower else ")")
        )
    return steps // per_epoch


def resolve_amp(amp: str, device: str) -> str:
    check_choice("--amp", amp, AMP_CHOICES)
    if amp == "auto":
        return "bf16" if device.startswith("cuda") else "fp32"
    if amp == "fp16" and not device.startswith("cuda"):
        raise InputError(
            "--amp fp16 needs a CUDA device (fp16 autocast with a grad scaler); use bf16 or fp32 on cpu"
        )
    return amp


def make_plan(
    *,
    arms: str = "baseline,candidate",
    warmup: int = 2,
    pairs: int = 5,
    order: str = "alternate",
    seed: int = 0,
    bar: float | None = None,
    device: str = "cpu",
    budget: str | None = None,
    control: bool = False,
    workload: str = "auto",
    steps: int = DEFAULT_STEPS,
    images: int | None = None,
    val_images: int = DEFAULT_VAL_IMAGES,
    batch: int = DEFAULT_BATCH,
    imgsz: int | None = None,
    amp: str = "auto",
    model: str = DEFAULT_MODEL,
    data: Path | None = None,
    data_cache: Path = Path("runs/datasets"),
    workers: int = 4,
    cache: str = "ram",
    close_mosaic: int = 10,
    stages: bool = False,
    trial_timeout: int = DEFAULT_TRIAL_TIMEOUT_S,
    keep_checkpoints: bool = False,
    command: str = "",
    announce: Any = None,
) -> Plan:
    """Check every option (``InputError`` on the first bad one) and build the plan; nothing is written."""
    protocol = protocol_options(arms, warmup, pairs, order, seed, bar, device, budget, control)
    for arm in protocol.arms:
        checked_optimizer(arm.spec, import_upstream=False)
    if stages and protocol.bar is not None:
        raise InputError(
            "--bar with --stages: a stages run is a diagnostic with no verdict; drop --bar (or --stages)"
        )
    chosen, why = resolve_workload(workload)
    check_non_negative("--workers", workers)
    check_choice("--cache", cache, CACHE_CHOICES)
    check_non_negative("--close-mosaic", close_mosaic)
    check_positive("--trial-timeout", trial_timeout)
    check_positive("--val-images", val_images)
    amp = resolve_amp(amp, protocol.device)
    imgsz = DEFAULT_IMGSZ[chosen] if imgsz is None else check_positive("--imgsz", imgsz)
    if chosen == "ultralytics":
        check_model(model)
        if imgsz % YOLO_STRIDE:
            raise InputError(
                f"--imgsz {imgsz} is not a multiple of the YOLO stride {YOLO_STRIDE} (e.g. 640, 320, 64)"
            )
    elif imgsz < 8:
        raise InputError(f"--imgsz {imgsz} is too small for the embedded model; use 8 or more (default 32)")
    data_path: str | None = None
    if data is not None:
        if chosen != "ultralytics":
            raise InputError(
                "--data needs the real trainer (--workload ultralytics); the embedded workload makes its own data"
            )
        from experiments.fit.dataset import describe_user_set

        try:
            counted, val_images = describe_user_set(Path(data))
        except ValueError as exc:
            raise InputError(str(exc)) from None
        if images is not None and images != counted:
            raise InputError(
                f"--images {images} disagrees with --data, which has {counted} training images; drop --images"
            )
        images, data_path = counted, str(Path(data).resolve())
    images = DEFAULT_IMAGES if images is None else check_positive("--images", images)
    epochs = check_steps(steps, images, batch)
    settings = FitSettings(
        workload=chosen,
        steps=steps,
        epochs=epochs,
        images=images,
        val_images=val_images,
        batch=batch,
        imgsz=imgsz,
        amp=amp,
        model=model if chosen == "ultralytics" else "embedded SmallConvNet",
        data=data_path,
        data_root=str(data_cache),
        data_seed=seed,
        workers=workers,
        cache=cache,
        close_mosaic=close_mosaic,
        stages=stages,
        trial_timeout_s=trial_timeout,
        keep_checkpoints=keep_checkpoints,
    )
    if announce is not None:
        announce(f"workload: {chosen} ({why})")
        if chosen == "ultralytics" and not protocol.device.startswith("cuda"):
            announce(
                f"note: the real trainer on the CPU at {imgsz} px runs for many minutes per fit; "
                "--device cuda on a GPU, or --workload embedded for a quick CPU run"
            )
    label = (
        f"{Path(settings.model).stem if chosen == 'ultralytics' else 'embedded'} {imgsz}px b{batch} "
        f"{steps} steps ({epochs}×{settings.iterations_per_epoch})"
    )
    case_params = {
        "workload": chosen,
        "model": settings.model,
        "steps": steps,
        "epochs": epochs,
        "images": images,
        "batch": batch,
        "imgsz": imgsz,
        "amp": amp,
    }
    stage_note = (
        "; --stages: synchronized marks at every stage boundary inside it (diagnostic only, never a claim)"
        if stages
        else "; the harness adds no synchronization, profiler or callback inside it (the workload's "
        "own reads of the loss for logging are part of what is timed, for both arms alike)"
    )
    return Plan(
        tier="stages" if stages else "pair",
        factory="experiments.fit.plan:trial_factory",
        unit="s",
        metric="whole-fit wall time" + (" with stage marks (diagnostic)" if stages else ""),
        cases=[Case(label, case_params, protocol.arms)],
        warmup=protocol.warmup,
        pairs=protocol.pairs,
        order=protocol.order,
        seed=protocol.seed,
        bar=protocol.bar,
        device=protocol.device,
        budget=protocol.budget,
        control=protocol.control,
        options=asdict(settings),
        command=command,
        in_process=False,
        isolation="a fresh worker process per trial (python -m harness.isolation); the parent schedules and "
        "collects rows and never touches the GPU",
        timed_region=(
            "the whole fit, synchronized at both ends: "
            + (
                "YOLO(model).train(...) — dataset and cache set-up, augmentation and mosaic closure, LR warm-up and "
                "decay, forward/backward, optimizer, EMA, validation each epoch, checkpoints, final validation"
                if chosen == "ultralytics"
                else "embedded fit — synthetic data, augmentation, LR warm-up and decay, forward/backward, optimizer, "
                "EMA, validation each epoch, checkpoints"
            )
            + stage_note
        ),
        sections="experiments.fit.report:sections",
    )


def worker_environment(run_dir: Path) -> dict[str, str]:
    """Environment of every worker: offline, with its own writable Ultralytics config folder (the embedded
    workload needs it too when an arm is ``upstream``, whose import reads settings and probes the network)."""
    from experiments.fit.ultralytics_fit import offline_environment

    return offline_environment(run_dir / "ultralytics-config")


class PlannedStop(KeyboardInterrupt):
    """A clean stop between trials (``--stop-after``): the protocol lets it through like Ctrl-C, the log keeps
    every finished trial, and ``--resume`` continues with the next one."""


_command_deadline: float | None = None  # monotonic clock; set per command (not part of the plan)


def stop_after(seconds: int | None) -> None:
    """Stop this command before any trial that would not finish within ``seconds`` from now."""
    global _command_deadline
    _command_deadline = (
        None if seconds is None else time.monotonic() + check_positive("--stop-after", seconds)
    )


def _check_deadline(ctx: TrialContext) -> None:
    """Raise ``PlannedStop`` when the next trial, estimated from the log, would end past the deadline."""
    if _command_deadline is None:
        return
    rows = [r for r in RunFolder(ctx.run_dir).rows() if r.get("trial_seconds") is not None]
    same_arm = [r["trial_seconds"] for r in rows if r["arm"] == ctx.arm.label]
    estimate = max(same_arm or [r["trial_seconds"] for r in rows] or [0.0])
    left = _command_deadline - time.monotonic()
    if estimate > left:
        console.print(
            f"stopping before trial {ctx.trial.index + 1} of {len(ctx.plan.schedule)} ({ctx.arm.label}, about "
            f"{estimate:.0f} s by the log; {max(left, 0):.0f} s left of --stop-after); continue with "
            f"bench pair --resume {ctx.run_dir} (with --stop-after again to slice the rest)"
        )
        raise PlannedStop


def trial_factory(plan: Plan) -> TrialFunction:
    """The trial function of a fit plan: one worker process per trial, its output in ``trials/<index>.log``."""
    settings = FitSettings.from_options(plan.options)
    data_yaml = settings.data
    if settings.workload == "ultralytics" and data_yaml is None:
        from experiments.fit.dataset import SyntheticSet, ensure_synthetic_set

        spec = SyntheticSet(settings.images, settings.val_images, settings.imgsz, settings.data_seed)
        data_yaml = str(ensure_synthetic_set(spec, Path(settings.data_root)).resolve())

    def trial(ctx: TrialContext) -> dict[str, Any]:
        _check_deadline(ctx)
        trials_dir = ctx.run_dir / "trials"
        trials_dir.mkdir(exist_ok=True)
        trial_dir = trials_dir / f"{ctx.trial.index:03d}"
        payload = {
            "settings": asdict(settings),
            "data_yaml": data_yaml,
            "arm_spec": ctx.arm.spec,
            "arm_params": ctx.arm.params,
            "device": ctx.device,
            "budget": plan.budget,
            "seed": ctx.seed,
            "trial_dir": str(trial_dir.resolve()),
            "parent_pid": os.getpid(),
        }
        try:
            return run_in_worker(
                WORKER_TARGET,
                payload,
                timeout_s=settings.trial_timeout_s,
                log_path=trials_dir / f"{ctx.trial.index}.log",
                env=worker_environment(ctx.run_dir),
            )
        finally:
            if not settings.keep_checkpoints and trial_dir.exists():
                for checkpoint in trial_dir.rglob("*.pt"):
                    checkpoint.unlink()
                shutil.rmtree(trial_dir / "fit" / "weights", ignore_errors=True)

    return trial
