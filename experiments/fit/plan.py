"""The complete-fit tier's plan: its settings, their checks and the plan; whole epochs only (docs/tiers.md)."""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from experiments.arms import arm_code, checked_optimizer
from experiments.fit.dataset import describe_user_set, read_yaml_mapping
from experiments.fit.embedded import optimizer_kwargs
from experiments.fit.ranks_check import check_ranks, isolation_text
from harness.errors import InputError
from harness.formatting import format_bytes
from harness.plan import Plan
from harness.protocol_options import ProtocolOptions
from harness.schedule import Case
from harness.schema import check_fields, option

WORKLOADS = ("auto", "ultralytics", "embedded")
AMP_CHOICES = ("auto", "bf16", "fp16", "fp32")
CACHE_CHOICES = ("ram", "disk", "none")
DEFAULT_STEPS = 384
DEFAULT_IMAGES = 256
# The embedded workload's CPU default (2 epochs × 32 iterations): the default job's 14 fits end in about a minute.
CPU_EMBEDDED_STEPS = 64
CPU_EMBEDDED_IMAGES = 128
DEFAULT_IMGSZ = {"ultralytics": 640, "embedded": 32}
# The real trainer's rough CPU cost per 640-px image (yolo26n, measured on two shared cores), for the pre-run
# note only; validation costs about a third of that per image.
CPU_SECONDS_PER_640PX_IMAGE = 4.0
VALIDATION_SHARE = 1 / 3
LONG_FIT_S = 60.0  # a fit estimated at least this long on the CPU gets the note
YOLO_STRIDE = 32
WORKER_TARGET = "experiments.fit.worker:run_fit"
PREPARE_TARGET = "experiments.fit.worker:prepare_data"
RANK_TARGET = "experiments.fit.ddp:run_rank_fit"
PREPARE_TIMEOUT_S = 1800
REAL_TRAINER_ONLY = ("model", "workers", "cache", "close_mosaic")  # refused with the embedded workload
# Bounds refused before anything starts, each past any fit that can run:
MAX_FIT_STEPS = 10_000_000  # days even at the embedded workload's pace
MAX_EPOCHS = 10_000  # every epoch validates and writes checkpoints
MAX_IMAGES = 1_000_000  # generated before the first trial: tens of GB at 640 px
MAX_IMGSZ = 4096  # past what a detection model trains at (48 MiB an image as floats)
MAX_EMBEDDED_SET_BYTES = 4 * 2**30  # the embedded workload holds its whole set in memory as float32
MAX_WORKERS = 256  # upstream caps dataloader workers at the CPU count anyway
MAX_TRIAL_TIMEOUT = 7 * 24 * 3600  # a week: longer is a typo


@dataclass(frozen=True)
class FitSettings:
    """What one fit does, the same for every trial of a run: the tier's options, each declared once
    (``harness.schema``: the CLI is made from them); ``make_plan`` resolves ``auto`` and ``None``."""

    workload: str = option(
        "auto",
        "auto (the real trainer when ultralytics is importable, else embedded), ultralytics or embedded.",
        choices=WORKLOADS,
    )
    steps: int | None = option(
        None,
        "Optimizer steps per fit; a whole number of epochs of images/batch iterations "
        f"(default {DEFAULT_STEPS}; {CPU_EMBEDDED_STEPS} for the embedded workload on the CPU).",
        low=1,
        high=MAX_FIT_STEPS,
    )
    images: int | None = option(
        None,
        f"Synthetic training images (default {DEFAULT_IMAGES}; {CPU_EMBEDDED_IMAGES} for the embedded workload "
        "on the CPU; with --data, counted from it).",
        low=1,
        high=MAX_IMAGES,
    )
    val_images: int = option(
        32, "Synthetic validation images (32 = four validation batches).", low=1, high=MAX_IMAGES
    )
    batch: int = option(4, "Batch size; nbs is set to it so every iteration steps the optimizer.", low=1)
    imgsz: int | None = option(
        None, "Image size in pixels (default 640 real trainer, 32 embedded).", low=1, high=MAX_IMGSZ
    )
    amp: str = option(
        "auto", "Precision: auto (bf16 on CUDA, fp32 on cpu), bf16, fp16 or fp32.", choices=AMP_CHOICES
    )
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
    workers: int = option(
        4, "Real trainer: dataloader workers (0 on cpu, upstream's rule).", low=0, high=MAX_WORKERS
    )
    cache: str = option("ram", "Real trainer: image cache ram, disk or none.", choices=CACHE_CHOICES)
    close_mosaic: int = option(
        10, "Real trainer: close mosaic for the final N epochs (upstream's 10).", low=0, high=MAX_EPOCHS
    )
    stages: bool = option(
        False,
        "Diagnostic run (own run folder, never a claim): stage shares and the ceiling.",
        flag="--stages",
    )
    trial_timeout: int = option(
        3600, "Seconds before a worker is killed (its trial fails).", low=1, high=MAX_TRIAL_TIMEOUT
    )
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


def _nearest(flag: str, value: int, unit: int) -> str:
    """The multiples of ``unit`` around ``value``, as ``(e.g. --steps 64 or 32)``."""
    lower = value - value % unit
    return f"(e.g. {flag} {lower + unit}" + (f" or {lower})" if lower else ")")


def check_steps(steps: int, images: int, batch: int, counted: bool = False) -> int:
    """Epochs for ``steps`` optimizer steps over ``images`` at ``batch``; ``InputError`` unless whole epochs."""
    if images % batch:
        if counted:
            lower, upper = _divisors_around(images, batch)
            options = " or ".join(f"--batch {b}" for b in (lower, upper) if b is not None)
            raise InputError(
                f"--data has {images} training images, not a whole number of batches of {batch}: every epoch "
                f"must be whole batches; use a batch that divides {images} (e.g. {options})"
            )
        raise InputError(
            f"{images} training images are not a whole number of batches of {batch}: every epoch must be whole "
            f"batches; use a multiple of --batch {_nearest('--images', images, batch)}"
        )
    per_epoch = images // batch
    if steps % per_epoch:
        raise InputError(
            f"--steps {steps} is not a whole number of epochs of {per_epoch} iterations ({images} images / batch "
            f"{batch}); use a multiple of {per_epoch} {_nearest('--steps', steps, per_epoch)}"
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


def trial_seconds(plan: Plan) -> float | None:
    """A real-trainer fit's rough CPU duration, the tier's estimate before any trial (None elsewhere)."""
    s, epochs = plan.settings, plan.cases[0].params["epochs"]
    if s["workload"] != "ultralytics" or plan.protocol.device.startswith("cuda"):
        return None
    return estimated_cpu_fit_seconds(s["steps"], epochs, s["batch"], s["imgsz"], s["val_images"])


def _minutes(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes:.0f} minutes" if minutes >= 2 else f"{minutes:.1f} minutes"


def resolve_amp(amp: str, device: str) -> str:
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
    s = check_fields(settings)
    for arm in protocol.arms:  # the real trainer passes upstream MuSGD's defaults: these keys too
        checked_optimizer(arm.spec, import_upstream=False, tier_kwargs=optimizer_kwargs())
    if s.stages and protocol.bar is not None:
        raise InputError(
            "--bar with --stages: a stages run is a diagnostic with no verdict; drop --bar (or --stages)"
        )
    chosen, why = resolve_workload(s.workload)
    real, cuda = chosen == "ultralytics", protocol.device.startswith("cuda")
    amp = resolve_amp(s.amp, protocol.device)
    imgsz = DEFAULT_IMGSZ[chosen] if s.imgsz is None else s.imgsz
    if real:
        check_model(s.model)
        if imgsz % YOLO_STRIDE:
            raise InputError(
                f"--imgsz {imgsz} is not a multiple of the YOLO stride {YOLO_STRIDE} (e.g. 640, 320, 64)"
            )
    elif imgsz < 8:
        raise InputError(f"--imgsz {imgsz} is too small for the embedded model; use 8 or more (default 32)")
    for name in REAL_TRAINER_ONLY if not real else ():
        if getattr(s, name) != getattr(FitSettings, name):
            flag = "--" + name.replace("_", "-")
            raise InputError(
                f"{flag} {getattr(s, name)} applies to the real trainer only (--workload ultralytics); the "
                f"embedded workload has its own model and loop: drop {flag}"
            )
    images, val_images, data_path = s.images, s.val_images, None
    if s.data is not None:
        images, val_images, data_path = _user_set(s, real)
    small = chosen == "embedded" and not cuda  # the embedded workload's CPU defaults
    smaller: list[str] = []
    if images is None:
        images = CPU_EMBEDDED_IMAGES if small else DEFAULT_IMAGES
        smaller += [f"{images} images"] if small else []
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
    model = s.model if real else "embedded SmallConvNet"
    resolved = replace(
        s,
        workload=chosen,
        steps=steps,
        images=images,
        val_images=val_images,
        imgsz=imgsz,
        amp=amp,
        data=data_path,
        model=model,
        data_cache=str(s.data_cache),
    )
    if announce is not None:
        _announce(announce, protocol, resolved, epochs, why, smaller)
    ranks = protocol.gpus
    label = (
        f"{Path(model).stem if real else 'embedded'} {imgsz}px b{s.batch} {steps} steps "
        f"({epochs}×{resolved.iterations_per_epoch})" + (f" ×{ranks} ranks" if ranks > 1 else "")
    )
    shares = {"ranks": ranks, "batch_per_rank": s.batch // ranks, "backend": protocol.backend}
    params = dict(workload=chosen, model=model, steps=steps, epochs=epochs, images=images, batch=s.batch)
    params.update(imgsz=imgsz, amp=amp, **(shares if ranks > 1 else {}))
    cases = [Case(label, params, protocol.arms)]
    disk = ", .npy image cache" if s.cache == "disk" else ""
    prepared = (
        f"; before the first trial a preparatory worker builds the data set once (label caches{disk}), so every "
        "trial starts from the same files"
    )
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
        isolation=isolation_text(protocol, chosen) + (prepared if real else ""),
        timed_region=_timed_region(s, real, ranks, protocol.backend),
    )


def _user_set(s: FitSettings, real: bool) -> tuple[int, int, str]:
    """(train images, val images, path) of ``--data``; ``InputError`` where the fit cannot use it."""
    if not real:
        raise InputError(
            "--data needs the real trainer (--workload ultralytics); the embedded workload makes its own data"
        )
    try:
        counted, val_images = describe_user_set(Path(s.data))
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if s.images is not None and s.images != counted:
        raise InputError(
            f"--images {s.images} disagrees with --data, which has {counted} training images; drop --images"
        )
    check_fields(replace(s, images=counted))  # the count --data holds
    return counted, val_images, str(Path(s.data).resolve())


def _announce(
    announce: Any, protocol: ProtocolOptions, r: FitSettings, epochs: int, why: str, smaller: list[str]
) -> None:
    """The pre-run lines: the workload chosen, a CPU default used, a long CPU fit's estimate."""
    announce(f"workload: {r.workload} ({why})")
    if smaller:
        announce(
            f"fit: {r.steps} steps of {r.images} images = {epochs} epochs × {r.iterations_per_epoch} iterations ("
            f"{' and '.join(smaller)}: the embedded workload's CPU default, so that `bench pair` with no "
            f"options ends in about a minute on two quiet cores; on CUDA and with the real trainer the "
            f"defaults are {DEFAULT_STEPS} steps of {DEFAULT_IMAGES} images)"
        )
    if r.workload != "ultralytics" or protocol.device.startswith("cuda"):
        return
    estimate = estimated_cpu_fit_seconds(r.steps, epochs, r.batch, r.imgsz, r.val_images)
    if estimate >= LONG_FIT_S:
        fits = len(protocol.arms) * protocol.initial_pairs + protocol.scheduled_warmup
        announce(
            f"note: the real trainer on the CPU: an estimated {_minutes(estimate)} per fit ({r.steps} steps of "
            f"batch {r.batch} at {r.imgsz} px, a yolo26n-sized model), about {_minutes(fits * estimate)} for "
            f"the {fits} fits; --device cuda on a GPU, fewer --steps or a smaller --imgsz, or --workload "
            "embedded for a quick CPU run"
        )


def _timed_region(s: FitSettings, real: bool, ranks: int, backend: str) -> str:
    """The timed region in words: the bracket, then what the fit does inside it."""
    bracket = "the whole fit, synchronized at both ends: "
    if ranks > 1:
        built = "; Ultralytics builds its trainer in each rank before it" if real else ""
        bracket = (
            f"the whole fit on rank 0 of {ranks} ({backend}), one bracket opened after a barrier of every rank "
            f"and closed after another (the process group and devices are set up before it{built}), "
            "synchronized at both ends: "
        )
    disk = " and the .npy image cache" if s.cache == "disk" else ""
    ram = "; the RAM image cache built by each fit" if s.cache == "ram" else ""
    inside = (
        f"YOLO(model).train(...) — dataset set-up (its label caches{disk} made once before the first trial, "
        f"untimed, by a preparatory worker, so every fit reads the same files{ram}), augmentation and mosaic "
        "closure, LR warm-up and decay, forward/backward, optimizer, EMA, validation each epoch, checkpoints, "
        "final validation"
        if real
        else "embedded fit — synthetic data, augmentation, LR warm-up and decay, forward/backward, optimizer, "
        "EMA, validation each epoch, checkpoints, a log line per epoch"
    )
    stage_note = (
        "; --stages: synchronized marks at every stage boundary inside it (diagnostic only, never a claim)"
        if s.stages
        else "; the harness adds no synchronization, profiler or callback inside it (the workload's "
        "own reads of the loss for logging are part of what is timed, for both arms alike)"
    )
    return bracket + inside + stage_note
