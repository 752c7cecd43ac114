"""The complete-fit tier's plan: its settings, their checks, and the trial function that starts each worker.

One trial is one whole short training run in a fresh worker process (``harness.isolation.run_in_worker``);
the parent only schedules, writes the payload and collects the row. It never touches the GPU: it does not
even import ultralytics (``--workload auto`` only asks whether the package could be imported).

Steps and epochs. Every iteration steps the optimizer (``nbs`` = batch), so a fit of ``--steps S`` with
``--images N`` training images at ``--batch B`` is ``S / (N / B)`` epochs of ``N / B`` iterations: the
default 384 steps of 256 images at batch 4 are 6 epochs of 64 iterations. Only whole epochs are run (the
trainer's schedule, validation and checkpoints are per epoch), so ``N`` must be a multiple of ``B`` and ``S``
a multiple of ``N / B``; anything else is refused with one line saying what would work.

Several ranks (``--gpus N``): ``--batch`` is the global batch, split evenly (``B / N`` images per rank and
iteration), so the steps, epochs and images per epoch are those of the one-device fit. The embedded workload's
ranks are started by ``torch.distributed.run`` (``harness.isolation.run_in_ranks``; ``--torchrun`` passes its
rendezvous options through); the real trainer's by Ultralytics' own DDP launch, from one worker.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from experiments.arms import checked_optimizer
from harness.isolation import RANK_ENVIRONMENT, run_in_ranks, run_in_worker
from harness.options import InputError, check_choice, check_non_negative, check_positive
from harness.protocol import Case, Plan, ProtocolOptions, TrialContext, TrialFunction

WORKLOADS = ("auto", "ultralytics", "embedded")
AMP_CHOICES = ("auto", "bf16", "fp16", "fp32")
CACHE_CHOICES = ("ram", "disk", "none")
DEFAULT_IMAGES = 256
DEFAULT_IMGSZ = {"ultralytics": 640, "embedded": 32}
YOLO_STRIDE = 32
WORKER_TARGET = "experiments.fit.worker:run_fit"
RANK_TARGET = "experiments.fit.ddp:run_rank_fit"


@dataclass(frozen=True)
class FitSettings:
    """What one fit does, the same for every trial of a run: the tier's options with their defaults (the CLI
    reads them from here); ``make_plan`` resolves ``auto`` and ``None`` and saves the result in the plan."""

    workload: str = "auto"
    steps: int = 384
    images: int | None = None  # default 256; with ``data``, counted from it
    val_images: int = 32
    batch: int = 4
    imgsz: int | None = None  # default 640 for the real trainer, 32 embedded
    amp: str = "auto"
    model: str = "yolo26n.yaml"
    data: str | None = None
    data_cache: str = "runs/datasets"
    workers: int = 4
    cache: str = "ram"
    close_mosaic: int = 10
    stages: bool = False
    trial_timeout: int = 3600
    keep_checkpoints: bool = False
    torchrun: str = ""  # torch.distributed.run's rendezvous options for several nodes (embedded, --gpus N)

    @property
    def iterations_per_epoch(self) -> int:
        return self.images // self.batch

    @property
    def epochs(self) -> int:
        return self.steps // self.iterations_per_epoch

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> FitSettings:
        """Settings saved in a plan, including those of the first plan format (``data_root``, ``trial_timeout_s``)."""
        renamed = {"data_root": "data_cache", "trial_timeout_s": "trial_timeout"}
        known = {f.name for f in fields(cls)}
        return cls(**{renamed.get(k, k): v for k, v in values.items() if renamed.get(k, k) in known})


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
    protocol: ProtocolOptions, settings: FitSettings, command: str = "", announce: Any = None
) -> Plan:
    """Check the fit's options (``InputError`` on the first bad one) and build the plan; nothing is written."""
    s = settings
    for arm in protocol.arms:
        checked_optimizer(arm.spec, import_upstream=False)
    if s.stages and protocol.bar is not None:
        raise InputError(
            "--bar with --stages: a stages run is a diagnostic with no verdict; drop --bar (or --stages)"
        )
    chosen, why = resolve_workload(s.workload)
    check_non_negative("--workers", s.workers)
    check_choice("--cache", s.cache, CACHE_CHOICES)
    check_non_negative("--close-mosaic", s.close_mosaic)
    check_positive("--trial-timeout", s.trial_timeout)
    check_positive("--val-images", s.val_images)
    amp = resolve_amp(s.amp, protocol.device)
    imgsz = DEFAULT_IMGSZ[chosen] if s.imgsz is None else check_positive("--imgsz", s.imgsz)
    if chosen == "ultralytics":
        check_model(s.model)
        if imgsz % YOLO_STRIDE:
            raise InputError(
                f"--imgsz {imgsz} is not a multiple of the YOLO stride {YOLO_STRIDE} (e.g. 640, 320, 64)"
            )
    elif imgsz < 8:
        raise InputError(f"--imgsz {imgsz} is too small for the embedded model; use 8 or more (default 32)")
    images, val_images, data_path = s.images, s.val_images, None
    if s.data is not None:
        if chosen != "ultralytics":
            raise InputError(
                "--data needs the real trainer (--workload ultralytics); the embedded workload makes its own data"
            )
        from experiments.fit.dataset import describe_user_set

        try:
            counted, val_images = describe_user_set(Path(s.data))
        except ValueError as exc:
            raise InputError(str(exc)) from None
        if images is not None and images != counted:
            raise InputError(
                f"--images {images} disagrees with --data, which has {counted} training images; drop --images"
            )
        images, data_path = counted, str(Path(s.data).resolve())
    images = DEFAULT_IMAGES if images is None else check_positive("--images", images)
    epochs = check_steps(s.steps, images, s.batch)
    check_ranks(protocol, s, chosen)
    resolved = replace(
        s,
        workload=chosen,
        images=images,
        val_images=val_images,
        imgsz=imgsz,
        amp=amp,
        data=data_path,
        model=s.model if chosen == "ultralytics" else "embedded SmallConvNet",
        data_cache=str(s.data_cache),
    )
    if announce is not None:
        announce(f"workload: {chosen} ({why})")
        if chosen == "ultralytics" and not protocol.device.startswith("cuda"):
            announce(
                f"note: the real trainer on the CPU at {imgsz} px runs for many minutes per fit; "
                "--device cuda on a GPU, or --workload embedded for a quick CPU run"
            )
    ranks = protocol.gpus
    label = (
        f"{Path(resolved.model).stem if chosen == 'ultralytics' else 'embedded'} {imgsz}px b{s.batch} "
        f"{s.steps} steps ({epochs}×{resolved.iterations_per_epoch})"
        + (f" ×{ranks} ranks" if ranks > 1 else "")
    )
    case_params = {
        "workload": chosen,
        "model": resolved.model,
        "steps": s.steps,
        "epochs": epochs,
        "images": images,
        "batch": s.batch,
        "imgsz": imgsz,
        "amp": amp,
        **(
            {"ranks": ranks, "batch_per_rank": s.batch // ranks, "backend": protocol.backend}
            if ranks > 1
            else {}
        ),
    }
    stage_note = (
        "; --stages: synchronized marks at every stage boundary inside it (diagnostic only, never a claim)"
        if s.stages
        else "; the harness adds no synchronization, profiler or callback inside it (the workload's "
        "own reads of the loss for logging are part of what is timed, for both arms alike)"
    )
    return Plan(
        tier="stages" if s.stages else "pair",
        protocol=protocol,
        cases=[Case(label, case_params, protocol.arms)],
        unit="s",
        metric="whole-fit wall time" + (" with stage marks (diagnostic)" if s.stages else ""),
        settings=asdict(resolved),
        command=command,
        in_process=False,
        isolation=_isolation_text(protocol, chosen),
        timed_region=(
            (
                f"the whole fit on rank 0 of {ranks} ({protocol.backend}), one bracket opened after a barrier of every "
                "rank and closed after another (the process group and devices are set up before it"
                + (
                    "; Ultralytics builds its trainer in each rank before it"
                    if chosen == "ultralytics"
                    else ""
                )
                + "), synchronized at both ends: "
                if ranks > 1
                else "the whole fit, synchronized at both ends: "
            )
            + (
                "YOLO(model).train(...) — dataset and cache set-up, augmentation and mosaic closure, LR warm-up and "
                "decay, forward/backward, optimizer, EMA, validation each epoch, checkpoints, final validation"
                if chosen == "ultralytics"
                else "embedded fit — synthetic data, augmentation, LR warm-up and decay, forward/backward, optimizer, "
                "EMA, validation each epoch, checkpoints"
            )
            + stage_note
        ),
    )


def _isolation_text(protocol: ProtocolOptions, workload: str) -> str:
    if protocol.gpus == 1:
        return (
            "a fresh worker process per trial (python -m harness.isolation); the parent schedules and "
            "collects rows and never touches the GPU"
        )
    launch = (
        "one worker per trial launches Ultralytics' own DDP fit (torch.distributed.run over a generated file)"
        if workload == "ultralytics"
        else "each trial's ranks started fresh by torch.distributed.run (python -m harness.isolation in each)"
    )
    return (
        f"{protocol.gpus} ranks per trial, data-parallel ({protocol.backend}, devices "
        f"{', '.join(protocol.rank_devices)}): {launch}; the parent schedules and collects rank 0's row and "
        "never touches the GPU; a rank that dies fails the trial"
    )


def check_ranks(protocol: ProtocolOptions, settings: FitSettings, workload: str) -> None:
    """A data-parallel fit splits the global batch evenly; the real trainer's DDP launch needs CUDA devices
    and cloudpickle; ``--torchrun`` options are the embedded workload's, with several ranks."""
    ranks = protocol.gpus
    if settings.torchrun and (ranks == 1 or workload != "embedded"):
        raise InputError(
            "--torchrun passes rendezvous options to the embedded workload's ranks: it needs --gpus 2 or more "
            "and --workload embedded (Ultralytics' DDP launch runs on one node)"
        )
    try:
        shlex.split(settings.torchrun)
    except ValueError as exc:
        raise InputError(f"--torchrun '{settings.torchrun}' is not a command line: {exc}") from None
    if ranks == 1:
        return
    if settings.batch % ranks:
        raise InputError(
            f"--batch {settings.batch} is the global batch, split evenly over --gpus {ranks}; use a multiple of "
            f"{ranks} (e.g. --batch {settings.batch + ranks - settings.batch % ranks})"
        )
    if workload == "ultralytics":
        if not protocol.device.startswith("cuda"):
            raise InputError(
                f"--gpus {ranks} with the real trainer: Ultralytics' DDP launch needs CUDA devices; use --device "
                "cuda, or --workload embedded for CPU ranks on gloo"
            )
        if importlib.util.find_spec("cloudpickle") is None:
            raise InputError(
                "--gpus with the real trainer: Ultralytics' DDP launch pickles its trainer with cloudpickle, which "
                "is not importable here; pip install 'cloudpickle>=3.1.1'"
            )


def worker_environment(run_dir: Path) -> dict[str, str]:
    """Environment of every worker: offline, with its own writable Ultralytics config folder (the embedded
    workload needs it too when an arm is ``upstream``, whose import reads settings and probes the network)."""
    from experiments.fit.ultralytics_fit import offline_environment

    return offline_environment(run_dir / "ultralytics-config")


def trial_function(plan: Plan) -> TrialFunction:
    """The trial function of a fit plan: one worker process per trial, its output in ``trials/<index>.log``."""
    settings = FitSettings.from_dict(plan.settings)
    ranks = plan.protocol.gpus
    data_yaml = settings.data
    if settings.workload == "ultralytics" and data_yaml is None:
        from experiments.fit.dataset import SyntheticSet, ensure_synthetic_set

        spec = SyntheticSet(settings.images, settings.val_images, settings.imgsz, plan.protocol.seed)
        data_yaml = str(ensure_synthetic_set(spec, Path(settings.data_cache)).resolve())

    def trial(ctx: TrialContext) -> dict[str, Any]:
        trials_dir = ctx.run_dir / "trials"
        trials_dir.mkdir(exist_ok=True)
        trial_dir = trials_dir / f"{ctx.trial.index:03d}"
        payload = {
            "settings": asdict(settings),
            "data_yaml": data_yaml,
            "arm_spec": ctx.arm.spec,
            "arm_params": ctx.arm.params,
            "device": ctx.device,
            "budget": plan.protocol.budget,
            "data_seed": plan.protocol.seed,
            "seed": ctx.seed,
            "trial_dir": str(trial_dir.resolve()),
            "parent_pid": os.getpid(),
            "ranks": ranks,
            "devices": list(plan.protocol.rank_devices),
        }
        log_path = trials_dir / f"{ctx.trial.index}.log"
        try:
            if ranks > 1 and settings.workload == "embedded":
                return run_in_ranks(
                    RANK_TARGET,
                    payload,
                    ranks,
                    timeout_s=settings.trial_timeout,
                    log_path=log_path,
                    env=worker_environment(ctx.run_dir),
                    launcher_options=shlex.split(settings.torchrun),
                    placement=ctx.placement,
                )
            return run_in_worker(
                WORKER_TARGET,
                payload,
                timeout_s=settings.trial_timeout,
                log_path=log_path,
                env={**worker_environment(ctx.run_dir), **(RANK_ENVIRONMENT if ranks > 1 else {})},
                placement=ctx.placement,
            )
        finally:
            if not settings.keep_checkpoints and trial_dir.exists():
                for checkpoint in trial_dir.rglob("*.pt"):
                    checkpoint.unlink()
                shutil.rmtree(trial_dir / "fit" / "weights", ignore_errors=True)

    return trial
