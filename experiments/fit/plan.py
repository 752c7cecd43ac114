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
import tempfile
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from experiments.arms import arm_code, checked_optimizer
from experiments.fit.embedded import optimizer_kwargs
from experiments.fit.stages import STAGES, stage_column
from harness.calibration import delay_seconds
from harness.formatting import format_bytes
from harness.isolation import RANK_ENVIRONMENT, WorkerDied, WorkerError, run_in_ranks, run_in_worker
from harness.options import InputError, check_choice, check_non_negative, check_positive
from harness.protocol import Case, Plan, ProtocolOptions, TrialContext, TrialFunction
from harness.safe_fs import fresh_dir, remove_entry
from harness.schema import option
from harness.validation import (
    BYTES,
    POSITIVE_SECONDS,
    SECONDS,
    TEXT,
    TRIAL_SECONDS_LIMIT,
    UINT64_MAX,
    RowField,
    row_fields_problem,
    settings_problem,
    shape_problem,
)

WORKLOADS = ("auto", "ultralytics", "embedded")
AMP_CHOICES = ("auto", "bf16", "fp16", "fp32")
CACHE_CHOICES = ("ram", "disk", "none")
DEFAULT_STEPS = 384
DEFAULT_IMAGES = 256
# The embedded workload on the CPU: 2 epochs × 32 iterations (LR warm-up over the first, then decay; EMA,
# validation and a checkpoint each epoch), so the default job's 14 fits end in about a minute on two cores,
# where each worker's start (importing torch) alone costs seconds. The real trainer and CUDA keep 384 × 256.
CPU_EMBEDDED_STEPS = 64
CPU_EMBEDDED_IMAGES = 128
DEFAULT_IMGSZ = {"ultralytics": 640, "embedded": 32}
# A rough CPU cost of the real trainer, for the pre-run note only (never a figure of a run): seconds per
# 640-px image through a yolo26n-sized model, forward, backward and step, measured on a shared two-core
# machine (about 1 s per 320-px image); validation costs about a third of that per image.
CPU_SECONDS_PER_640PX_IMAGE = 4.0
VALIDATION_SHARE = 1 / 3
LONG_FIT_S = 60.0  # a fit estimated at least this long on the CPU gets the note
YOLO_STRIDE = 32
WORKER_TARGET = "experiments.fit.worker:run_fit"
REAL_TRAINER_ONLY = ("model", "workers", "cache", "close_mosaic")  # refused with the embedded workload
# Bounds of a fit, each refused before anything starts (larger values name a fit that cannot be run):
# 10^7 steps is days even at the embedded workload's pace; the real trainer takes hundreds of ms a step.
MAX_FIT_STEPS = 10_000_000
# Every epoch validates and writes checkpoints: a short fit of more epochs spends its time there, not training.
MAX_EPOCHS = 10_000
# The synthetic set is generated (for the real trainer, written to disk) before the first trial: a million
# images at 640 px is tens of GB.
MAX_IMAGES = 1_000_000
# An image side past 4096 px is past what a detection model trains at; each such image is 48 MiB as floats.
MAX_IMGSZ = 4096
# The embedded workload holds its whole synthetic set in memory as float32 while it builds it.
MAX_EMBEDDED_SET_BYTES = 4 * 2**30
# More dataloader workers than any machine here has cores (upstream caps them at the CPU count anyway).
MAX_WORKERS = 256
# A week: longer is a typo, and past Python's largest timeout every trial would fail.
MAX_TRIAL_TIMEOUT = 7 * 24 * 3600
PREPARE_TARGET = "experiments.fit.worker:prepare_data"
PREPARE_TIMEOUT_S = 1800
RANK_TARGET = "experiments.fit.ddp:run_rank_fit"


@dataclass(frozen=True)
class FitSettings:
    """What one fit does, the same for every trial of a run: the tier's options, each declared once
    (``harness.schema``: the CLI is made from them); ``make_plan`` resolves ``auto`` and ``None``."""

    workload: str = option(
        "auto",
        "auto (the real trainer when ultralytics is importable, else embedded), ultralytics or embedded.",
    )
    steps: int | None = option(
        None,
        "Optimizer steps per fit; a whole number of epochs of images/batch iterations "
        f"(default {DEFAULT_STEPS}; {CPU_EMBEDDED_STEPS} for the embedded workload on the CPU).",
    )
    images: int | None = option(
        None,
        f"Synthetic training images (default {DEFAULT_IMAGES}; {CPU_EMBEDDED_IMAGES} for the embedded workload "
        "on the CPU; with --data, counted from it).",
    )
    val_images: int = option(32, "Synthetic validation images (32 = four validation batches).")
    batch: int = option(4, "Batch size; nbs is set to it so every iteration steps the optimizer.")
    imgsz: int | None = option(None, "Image size in pixels (default 640 real trainer, 32 embedded).")
    amp: str = option("auto", "Precision: auto (bf16 on CUDA, fp32 on cpu), bf16, fp16 or fp32.")
    model: str = option("yolo26n.yaml", "Model yaml for the real trainer (no pretrained weights).")
    data: str | None = option(
        None,
        "A YOLO-format data.yaml (real trainer); default: a generated synthetic set.",
        cli_type=Path | None,
    )
    data_cache: str = option(
        "runs/datasets",
        "Folder for generated synthetic sets (default OUT/datasets).",
        cli_type=Path | None,
        cli_default=None,
    )
    workers: int = option(4, "Real trainer: dataloader workers (0 on cpu, upstream's rule).")
    cache: str = option("ram", "Real trainer: image cache ram, disk or none.")
    close_mosaic: int = option(10, "Real trainer: close mosaic for the final N epochs (upstream's 10).")
    stages: bool = option(
        False,
        "Diagnostic run (own run folder, never a claim): stage shares and the ceiling.",
        flag="--stages",
    )
    trial_timeout: int = option(3600, "Seconds before a worker is killed (its trial fails).")
    keep_checkpoints: bool = option(
        False,
        "Keep each fit's folder, checkpoints included (deleted after each trial by default; its log stays).",
        flag="--keep-checkpoints",
    )
    torchrun: str = option(
        "",
        "With --gpus N, embedded workload: torch.distributed.run's rendezvous options for several nodes, passed "
        "through, e.g. '--nnodes 2 --node-rank 0 --rdzv-backend c10d --rdzv-endpoint HOST:29400 --rdzv-id ID'.",
    )

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


def check_data_cache_used(workload: str, data: str | None) -> None:
    """``--data-cache`` given: it holds the real trainer's generated synthetic sets, so ``InputError`` where
    none is generated (the embedded workload keeps its set in memory; ``--data`` is a set of the user's)."""
    if resolve_workload(workload)[0] != "ultralytics":
        raise InputError(
            "--data-cache holds the real trainer's generated synthetic sets, and the embedded workload keeps "
            "its set in memory: drop --data-cache"
        )
    if data is not None:
        raise InputError(
            "--data-cache holds generated synthetic sets, and --data names your own: drop --data-cache"
        )


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
    if Path(model).is_file():  # one's own: what ultralytics builds a model from, or every fit would fail
        from experiments.fit.dataset import read_yaml_mapping

        try:
            read_yaml_mapping(Path(model), "--model", ("backbone", "head"), "a model yaml")
        except ValueError as exc:
            raise InputError(str(exc)) from None
    return model


def _divisors_around(count: int, value: int) -> tuple[int | None, int | None]:
    """The divisors of ``count`` nearest below and above ``value`` (None where there is none)."""
    divisors = [d for d in range(1, count + 1) if count % d == 0]
    below = [d for d in divisors if d < value]
    above = [d for d in divisors if d > value]
    return (below[-1] if below else None), (above[0] if above else None)


def check_steps(steps: int, images: int, batch: int, counted: bool = False) -> int:
    """Epochs for ``steps`` optimizer steps over ``images`` at ``batch``; ``InputError`` unless whole epochs.

    ``counted``: the images were counted from ``--data``, so the hint changes ``--batch``, never ``--images``.
    """
    check_positive("--steps", steps, MAX_FIT_STEPS)
    check_positive("--batch", batch)
    if images % batch:
        if counted:
            lower, upper = _divisors_around(images, batch)
            options = " or ".join(f"--batch {b}" for b in (lower, upper) if b is not None)
            raise InputError(
                f"--data has {images} training images, not a whole number of batches of {batch}: every epoch "
                f"must be whole batches; use a batch that divides {images} (e.g. {options})"
            )
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
    epochs = steps // per_epoch
    if epochs > MAX_EPOCHS:
        raise InputError(
            f"--steps {steps} is {epochs} epochs of {per_epoch} iterations ({images} images / batch {batch}): "
            f"{epochs} epochs is more than {MAX_EPOCHS}, the most a fit can take (every epoch validates and "
            "writes checkpoints); use more --images per epoch or fewer --steps"
        )
    return epochs


def estimated_cpu_fit_seconds(steps: int, epochs: int, batch: int, imgsz: int, val_images: int) -> float:
    """A rough CPU duration of one real-trainer fit: training images and validation passes (each epoch and
    the final one) at ``imgsz``, from ``CPU_SECONDS_PER_640PX_IMAGE``. For the pre-run note only."""
    per_image = CPU_SECONDS_PER_640PX_IMAGE * (imgsz / 640) ** 2
    return per_image * (steps * batch + VALIDATION_SHARE * (epochs + 1) * val_images)


def _minutes(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes:.0f} minutes" if minutes >= 2 else f"{minutes:.1f} minutes"


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
    for arm in protocol.arms:  # the real trainer passes upstream MuSGD's defaults: these keys too
        checked_optimizer(arm.spec, import_upstream=False, tier_kwargs=optimizer_kwargs())
    if s.stages and protocol.bar is not None:
        raise InputError(
            "--bar with --stages: a stages run is a diagnostic with no verdict; drop --bar (or --stages)"
        )
    chosen, why = resolve_workload(s.workload)
    _check_counts(s)
    amp = resolve_amp(s.amp, protocol.device)
    imgsz = DEFAULT_IMGSZ[chosen] if s.imgsz is None else check_positive("--imgsz", s.imgsz, MAX_IMGSZ)
    if chosen == "ultralytics":
        check_model(s.model)
        if imgsz % YOLO_STRIDE:
            raise InputError(
                f"--imgsz {imgsz} is not a multiple of the YOLO stride {YOLO_STRIDE} (e.g. 640, 320, 64)"
            )
    elif imgsz < 8:
        raise InputError(f"--imgsz {imgsz} is too small for the embedded model; use 8 or more (default 32)")
    images, val_images, data_path = s.images, s.val_images, None
    if chosen != "ultralytics":
        for name in REAL_TRAINER_ONLY:
            if getattr(s, name) != getattr(FitSettings, name):
                flag = "--" + name.replace("_", "-")
                raise InputError(
                    f"{flag} {getattr(s, name)} applies to the real trainer only (--workload ultralytics); the "
                    f"embedded workload has its own model and loop: drop {flag}"
                )
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
    small = chosen == "embedded" and not protocol.device.startswith("cuda")
    smaller: list[str] = []
    if images is None:
        images = CPU_EMBEDDED_IMAGES if small else DEFAULT_IMAGES
        smaller += [f"{images} images"] if small else []
    else:
        images = check_positive("--images", images, MAX_IMAGES)
    steps = s.steps
    if steps is None:
        steps = CPU_EMBEDDED_STEPS if small else DEFAULT_STEPS
        smaller += [f"{steps} steps"] if small else []
    epochs = check_steps(steps, images, s.batch, counted=data_path is not None)
    set_bytes = (images + val_images) * 3 * imgsz**2 * 4
    if chosen == "embedded" and set_bytes > MAX_EMBEDDED_SET_BYTES:
        raise InputError(
            f"the embedded workload holds its whole synthetic set in memory: ({images} + {val_images} images) × 3 × "
            f"{imgsz}² floats = {format_bytes(set_bytes)}, more than {format_bytes(MAX_EMBEDDED_SET_BYTES)}; "
            "use fewer --images or a smaller --imgsz"
        )
    check_ranks(protocol, s, chosen)
    resolved = replace(
        s,
        workload=chosen,
        steps=steps,
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
        if smaller:
            announce(
                f"fit: {steps} steps of {images} images = {epochs} epochs × {images // s.batch} iterations ("
                f"{' and '.join(smaller)}: the embedded workload's CPU default, so that `bench pair` with no "
                f"options ends in about a minute on two quiet cores; on CUDA and with the real trainer the "
                f"defaults are {DEFAULT_STEPS} steps of {DEFAULT_IMAGES} images)"
            )
        if chosen == "ultralytics" and not protocol.device.startswith("cuda"):
            estimate = estimated_cpu_fit_seconds(steps, epochs, s.batch, imgsz, val_images)
            if estimate >= LONG_FIT_S:
                fits = len(protocol.arms) * protocol.initial_pairs + protocol.scheduled_warmup
                announce(
                    f"note: the real trainer on the CPU: an estimated {_minutes(estimate)} per fit ({steps} steps of "
                    f"batch {s.batch} at {imgsz} px, a yolo26n-sized model), about {_minutes(fits * estimate)} for "
                    f"the {fits} fits; --device cuda on a GPU, fewer --steps or a smaller --imgsz, or --workload "
                    "embedded for a quick CPU run"
                )
    ranks = protocol.gpus
    label = (
        f"{Path(resolved.model).stem if chosen == 'ultralytics' else 'embedded'} {imgsz}px b{s.batch} "
        f"{steps} steps ({epochs}×{resolved.iterations_per_epoch})"
        + (f" ×{ranks} ranks" if ranks > 1 else "")
    )
    case_params = {
        "workload": chosen,
        "model": resolved.model,
        "steps": steps,
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
    cases = [Case(label, case_params, protocol.arms)]
    return Plan(
        tier="stages" if s.stages else "pair",
        protocol=protocol,
        cases=cases,
        arm_code=arm_code(cases, protocol.device),
        unit="s",
        metric="whole-fit wall time" + (" with stage marks (diagnostic)" if s.stages else ""),
        settings=asdict(resolved),
        command=command,
        in_process=False,
        isolation=_isolation_text(protocol, chosen)
        + (
            "; before the first trial a preparatory worker builds the data set once (label caches"
            + (", .npy image cache" if s.cache == "disk" else "")
            + "), so every trial starts from the same files"
            if chosen == "ultralytics"
            else ""
        ),
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
                "YOLO(model).train(...) — dataset set-up (its label caches"
                + (" and the .npy image cache" if s.cache == "disk" else "")
                + " made once before the first trial, untimed, by a preparatory worker, so every fit reads the "
                "same files"
                + ("; the RAM image cache built by each fit" if s.cache == "ram" else "")
                + "), augmentation and mosaic closure, LR warm-up and decay, forward/backward, optimizer, EMA, "
                "validation each epoch, checkpoints, final validation"
                if chosen == "ultralytics"
                else "embedded fit — synthetic data, augmentation, LR warm-up and decay, forward/backward, optimizer, "
                "EMA, validation each epoch, checkpoints, a log line per epoch"
            )
            + stage_note
        ),
    )


def _check_counts(s: FitSettings) -> None:
    """The options a plan keeps as given: each within the bound argued where it is defined."""
    check_non_negative("--workers", s.workers, MAX_WORKERS)
    check_choice("--cache", s.cache, CACHE_CHOICES)
    check_non_negative("--close-mosaic", s.close_mosaic, MAX_EPOCHS)
    check_positive("--trial-timeout", s.trial_timeout, MAX_TRIAL_TIMEOUT)
    check_positive("--val-images", s.val_images, MAX_IMAGES)


# What a fit's plan records: its settings as ``make_plan`` resolved them (no ``auto``, no None).
RECORDED_SHAPE = {
    "workload": str,
    "steps": int,
    "images": int,
    "val_images": int,
    "batch": int,
    "imgsz": int,
    "amp": str,
    "model": str,
    "stages": bool,
    "workers": int,
    "cache": str,
    "close_mosaic": int,
}


# What a fit's plan records beside them where it has them (older plans lack some; the first format named two
# otherwise): each of its type, as ``FitSettings`` reads it back for a resume and the report.
OPTIONAL_SHAPE = {
    "data": str | None,
    "data_cache": str,
    "data_root": str,
    "trial_timeout": int,
    "trial_timeout_s": int,
    "keep_checkpoints": bool,
    "torchrun": str,
}


def recorded_settings_problem(plan: Plan) -> str | None:
    """What is wrong with a fit plan's recorded settings (an edited plan.json), or None: a field missing or of
    another type, ``stages`` that disagrees with the tier's name, or a value the options' own checks refuse.
    The machine's part of the checks (the model file, the trainer's import, the devices) is a resume's."""
    problem = settings_problem(plan.settings, RECORDED_SHAPE) or shape_problem(
        plan.settings, OPTIONAL_SHAPE, "settings"
    )
    if problem:
        return problem
    s = FitSettings.from_dict(plan.settings)
    if s.stages != (plan.tier == "stages"):
        return (
            f"settings.stages is {str(s.stages).lower()}, but the plan's tier is '{plan.tier}' (a stages run "
            "records true, a pair false)"
        )
    try:
        check_choice("--workload", s.workload, tuple(w for w in WORKLOADS if w != "auto"))
        check_choice("--amp", s.amp, tuple(a for a in AMP_CHOICES if a != "auto"))
        _check_counts(s)
        check_positive("--imgsz", s.imgsz, MAX_IMGSZ)
        check_positive("--images", s.images, MAX_IMAGES)
        check_steps(s.steps, s.images, s.batch)
        check_ranks(plan.protocol, s, s.workload, machine=False)  # the start's check: --torchrun above all
    except InputError as exc:
        return f"settings: {exc}"
    return None


# What a fit's report reads of its rows (the fit's and its stages' figures, the ranks' sharing), each of its
# type and in its range where present. The steady-state figure is compared by ratio, as the fit's time is:
# positive.
ROW_FIELDS = {
    "steady_s": POSITIVE_SECONDS,
    **{stage_column(stage): SECONDS for stage in STAGES},
    "stage_unattributed_s": RowField(float, -TRIAL_SECONDS_LIMIT, TRIAL_SECONDS_LIMIT),  # a difference
    **{
        key: SECONDS
        for key in (
            "stage_optimizer_first_s",
            "stage_optimizer_step_median_s",
            "stage_optimizer_host_median_s",
            "iteration_sync_median_s",
            "iteration_host_median_s",
        )
    },
    **{key: BYTES for key in ("peak_allocated_sum", "optimizer_plan_bytes", "checkpoint_bytes")},
    **{key: RowField(float) for key in ("train_loss", "val_map50_95", "val_map50", "val_accuracy")},
    **{key: TEXT for key in ("optimizer_class", "optimizer_graphs", "sharing_note")},
    **{
        key: RowField(int, 0, UINT64_MAX)
        for key in ("iterations", "sharing_world", "sharing_matrices_here", "sharing_matrices")
    },
    "rank_matrices_here": RowField(list, 0, UINT64_MAX),  # per rank, null where a rank did not say
    "amp_used": RowField(bool),
}


def recorded_row_problem(row: dict[str, Any]) -> str | None:
    """What is wrong with the fields a fit's report reads of a log row (``ROW_FIELDS``), or None."""
    return row_fields_problem(row, ROW_FIELDS)


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


def check_launcher_options(text: str, words: list[str]) -> None:
    """``--torchrun``'s words read by ``torch.distributed.run``'s own parser, placed as the ranks' launch places
    them: ``InputError`` for a word it does not take (every rank would die at its start, every trial failed)."""
    import argparse
    import contextlib
    import io

    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.exit_on_error = False
    launch = ["--nproc-per-node", "2", *words, "--module", "harness.isolation", "target"]
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            parsed, unknown = parser.parse_known_args(launch)
    except (argparse.ArgumentError, SystemExit) as exc:
        unknown, parsed = [str(exc)], None
    if unknown or parsed is None or parsed.training_script != "harness.isolation":
        left = " ".join(unknown) or "a script of its own"
        raise InputError(
            f"--torchrun '{text}' is not torch.distributed.run's options ({left}); give its rendezvous options, "
            "e.g. '--nnodes 2 --node-rank 0 --rdzv-backend c10d --rdzv-endpoint HOST:29400 --rdzv-id ID'"
        )


def check_ranks(
    protocol: ProtocolOptions, settings: FitSettings, workload: str, machine: bool = True
) -> None:
    """A data-parallel fit splits the global batch evenly; the real trainer's DDP launch needs CUDA devices
    and cloudpickle; ``--torchrun`` options are the embedded workload's, with several ranks. ``machine=False``
    leaves out what this machine has (cloudpickle): a recorded plan is checked by the rest."""
    ranks = protocol.gpus
    if settings.torchrun and (ranks == 1 or workload != "embedded"):
        raise InputError(
            "--torchrun passes rendezvous options to the embedded workload's ranks: it needs --gpus 2 or more "
            "and --workload embedded (Ultralytics' DDP launch runs on one node)"
        )
    try:
        words = shlex.split(settings.torchrun)
    except ValueError as exc:
        raise InputError(f"--torchrun '{settings.torchrun}' is not a command line: {exc}") from None
    if words:
        check_launcher_options(settings.torchrun, words)
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
        if machine and importlib.util.find_spec("cloudpickle") is None:
            raise InputError(
                "--gpus with the real trainer: Ultralytics' DDP launch pickles its trainer with cloudpickle, which "
                "is not importable here; pip install 'cloudpickle>=3.1.1'"
            )


def worker_environment(run_dir: Path) -> dict[str, str]:
    """Environment of every worker: offline, with its own writable Ultralytics config folder (the embedded
    workload needs it too when an arm is ``upstream``, whose import reads settings and probes the network)."""
    from experiments.fit.ultralytics_fit import offline_environment

    return offline_environment(run_dir / "ultralytics-config")


def prepare_data_set(settings: FitSettings, data_yaml: str) -> dict[str, Any]:
    """Make the real trainer's data-set side effects (label caches, a disk image cache) once, untimed, in a
    preparatory worker (the parent never imports ultralytics); ``InputError`` with its last line if it fails."""
    from experiments.fit.ultralytics_fit import offline_environment

    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as config:
        try:
            return run_in_worker(
                PREPARE_TARGET,
                {"settings": asdict(settings), "data_yaml": data_yaml, "parent_pid": os.getpid()},
                timeout_s=PREPARE_TIMEOUT_S,
                env=offline_environment(Path(config)),
            )
        except (WorkerDied, WorkerError) as exc:
            raise InputError(
                f"the data set {data_yaml} could not be prepared by Ultralytics: {exc}"
            ) from None


def trial_function(plan: Plan) -> TrialFunction:
    """The trial function of a fit plan: one worker process per trial, its output in ``trials/<index>.log``.

    For the real trainer the data set is ready before the first trial: generated (synthetic) and built once
    by upstream's dataset builder, so its caches are never made inside a timed fit.
    """
    settings = FitSettings.from_dict(plan.settings)
    ranks = plan.protocol.gpus
    data_yaml = settings.data
    if settings.workload == "ultralytics" and data_yaml is None:
        from experiments.fit.dataset import SyntheticSet, ensure_synthetic_set

        spec = SyntheticSet(settings.images, settings.val_images, settings.imgsz, plan.protocol.seed)
        data_yaml = str(ensure_synthetic_set(spec, Path(settings.data_cache)).resolve())
    if settings.workload == "ultralytics":
        prepared = prepare_data_set(settings, data_yaml)
        from harness.console import console

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
                    cancel=ctx.cancel,
                )
            return run_in_worker(
                WORKER_TARGET,
                payload,
                timeout_s=settings.trial_timeout,
                log_path=log_path,
                env={**worker_environment(ctx.run_dir), **(RANK_ENVIRONMENT if ranks > 1 else {})},
                placement=ctx.placement,
                cancel=ctx.cancel,
            )
        finally:  # the trial's folder keeps its small records (e.g. upstream's results.csv), never a
            # half-written file, and checkpoints only with --keep-checkpoints
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
