"""The complete-fit tier's plan: its settings, their checks and the plan; whole epochs only (docs/tiers.md)."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import shlex
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from experiments.arms import arm_code, checked_optimizer
from experiments.fit.dataset import describe_user_set, read_yaml_mapping
from experiments.fit.embedded import optimizer_kwargs
from harness.errors import InputError
from harness.formatting import format_bytes
from harness.plan import Plan
from harness.protocol_options import ProtocolOptions
from harness.schedule import Case
from harness.schema import check_fields, flag_of, option

WORKLOADS = ("auto", "ultralytics", "embedded")
AMP_CHOICES = ("auto", "bf16", "fp16", "fp32")
DEFAULTS = {"steps": 384, "images": 256}
# The embedded workload's CPU default (2 epochs × 32 iterations): the default job's 14 fits end in about a minute.
CPU_EMBEDDED = {"images": 128, "steps": 64}
DEFAULT_IMGSZ = {"ultralytics": 640, "embedded": 32}
# The real trainer's rough CPU cost per 640-px image (yolo26n, measured on two shared cores), for the pre-run
# note only; validation costs about a third of that per image.
CPU_SECONDS_PER_640PX_IMAGE = 4.0
VALIDATION_SHARE = 1 / 3
LONG_FIT_S = 60.0  # a fit estimated at least this long on the CPU gets the note
YOLO_STRIDE = 32
WORKER_TARGET = "experiments.fit.worker:run_fit"
PREPARE_TARGET = "experiments.fit.worker:prepare_data"
RANK_TARGET = "experiments.fit.worker:run_rank_fit"
DDP_TARGET = "experiments.fit.ultralytics_ddp:launch_fit"  # imports ultralytics: a real-trainer DDP fit only
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
TORCHRUN_EXAMPLE = "'--nnodes 2 --node-rank 0 --rdzv-backend c10d --rdzv-endpoint HOST:29400 --rdzv-id ID'"


@dataclass(frozen=True)
class FitSettings:
    """What one fit does, the same for every trial of a run; ``make_plan`` resolves ``auto`` and ``None``."""

    workload: str = option(
        "auto",
        "auto (the real trainer if importable, else embedded), ultralytics or embedded.",
        choices=WORKLOADS,
    )
    steps: int | None = option(
        None,
        f"Optimizer steps per fit, whole epochs (default {DEFAULTS['steps']}; "
        f"{CPU_EMBEDDED['steps']} embedded on the CPU).",
        low=1,
        high=MAX_FIT_STEPS,
    )
    images: int | None = option(
        None,
        f"Synthetic training images (default {DEFAULTS['images']}; {CPU_EMBEDDED['images']} embedded on the "
        "CPU; counted from --data).",
        low=1,
        high=MAX_IMAGES,
    )
    val_images: int = option(
        32, "Synthetic validation images (four validation batches).", low=1, high=MAX_IMAGES
    )
    batch: int = option(4, "Batch size; nbs is set to it so every iteration steps the optimizer.", low=1)
    imgsz: int | None = option(
        None, "Image size in px (default 640 real trainer, 32 embedded).", low=1, high=MAX_IMGSZ
    )
    amp: str = option(
        "auto", "Precision: auto (bf16 on CUDA, fp32 on cpu), bf16, fp16 or fp32.", choices=AMP_CHOICES
    )
    model: str = option("yolo26n.yaml", "Model yaml for the real trainer (no pretrained weights).")
    data: str | None = option(
        None, "A YOLO data.yaml (real trainer); default: a synthetic set.", cli_type=Path | None
    )
    data_cache: str = option(
        "runs/datasets",
        "Folder for generated synthetic sets (default OUT/datasets).",
        cli_type=Path | None,
        cli_default=None,
    )
    workers: int = option(4, "Real trainer: dataloader workers (0 on cpu).", low=0, high=MAX_WORKERS)
    cache: str = option(
        "ram", "Real trainer: image cache ram, disk or none.", choices=("ram", "disk", "none")
    )
    close_mosaic: int = option(
        10, "Real trainer: close mosaic for the final N epochs.", low=0, high=MAX_EPOCHS
    )
    stages: bool = option(
        False, "Diagnostic run, never a claim: stage shares and the ceiling.", flag="--stages"
    )
    trial_timeout: int = option(3600, "Seconds before a worker is killed.", low=1, high=MAX_TRIAL_TIMEOUT)
    keep_checkpoints: bool = option(
        False, "Keep each fit's folder with its checkpoints (deleted by default).", flag="--keep-checkpoints"
    )
    torchrun: str = option(
        "", f"With --gpus N, embedded: rendezvous options for torch.distributed.run, e.g. {TORCHRUN_EXAMPLE}."
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
    """``--data-cache`` given: ``InputError`` where no synthetic set is generated."""
    if resolve_workload(workload)[0] != "ultralytics":
        raise InputError(
            "--data-cache holds the real trainer's generated sets; the embedded workload keeps its set in "
            "memory: drop --data-cache"
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


def check_model(model: str) -> str:
    """``model`` if it is a model yaml that exists or ultralytics ships (``yolo26n.yaml`` → ``yolo26.yaml``)."""
    if Path(model).suffix.lower() not in (".yaml", ".yml"):
        raise InputError(
            f"--model '{model}' is not a model yaml; fits start from scratch: give e.g. yolo26n.yaml or a path"
        )
    if Path(model).is_file():  # one's own: what ultralytics builds a model from, or every fit would fail
        try:
            read_yaml_mapping(Path(model), "--model", ("backbone", "head"), "a model yaml")
        except ValueError as exc:
            raise InputError(str(exc)) from None
        return model
    spec = importlib.util.find_spec("ultralytics")
    stem = Path(model).stem
    unscaled = stem[:-1] if stem and stem[-1] in "nslmx" and stem[:-1][-1:].isdigit() else stem
    if spec is not None and spec.submodule_search_locations:
        models = Path(next(iter(spec.submodule_search_locations))) / "cfg" / "models"
        if any(p.stem in (stem, unscaled) for p in models.rglob("*.yaml")):
            return model
    raise InputError(
        f"--model '{model}': no such file, and ultralytics ships no such model yaml (e.g. yolo26n.yaml)"
    )


def _nearest(flag: str, value: int, unit: int) -> str:
    """The multiples of ``unit`` around ``value``, as ``(e.g. --steps 64 or 32)``."""
    lower = value - value % unit
    return f"(e.g. {flag} {lower + unit}" + (f" or {lower})" if lower else ")")


def check_steps(steps: int, images: int, batch: int, counted: bool = False) -> int:
    """Epochs for ``steps`` optimizer steps over ``images`` at ``batch``; ``InputError`` unless whole epochs."""
    if images % batch and counted:
        divisors = [d for d in range(1, images + 1) if images % d == 0]
        near = [
            max((d for d in divisors if d < batch), default=None),
            min((d for d in divisors if d > batch), default=None),
        ]
        options = " or ".join(f"--batch {b}" for b in near if b is not None)
        raise InputError(
            f"--data has {images} training images, not a whole number of batches of {batch}: every epoch "
            f"must be whole batches; use a batch that divides {images} (e.g. {options})"
        )
    if images % batch:
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
            f"--steps {steps} is {epochs} epochs of {per_epoch} iterations ({images} images / batch {batch}), "
            f"more than {MAX_EPOCHS} (each validates and checkpoints); use more --images or fewer --steps"
        )
    return epochs


def check_ranks(protocol: ProtocolOptions, settings: Any, workload: str, machine: bool = True) -> None:
    """Refuse --gpus, --batch or --torchrun settings a data-parallel fit cannot run (``InputError``)."""
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
        _check_launcher_options(settings.torchrun, words)
    if ranks > 1 and settings.batch % ranks:
        raise InputError(
            f"--batch {settings.batch} is the global batch, split evenly over --gpus {ranks}; use a multiple of "
            f"{ranks} (e.g. --batch {settings.batch + ranks - settings.batch % ranks})"
        )
    if ranks > 1 and workload == "ultralytics" and not protocol.device.startswith("cuda"):
        raise InputError(
            f"--gpus {ranks} with the real trainer: Ultralytics' DDP launch needs CUDA devices; use --device "
            "cuda, or --workload embedded for CPU ranks on gloo"
        )
    if (
        ranks > 1
        and workload == "ultralytics"
        and machine
        and importlib.util.find_spec("cloudpickle") is None
    ):
        raise InputError(
            "--gpus with the real trainer: Ultralytics' DDP launch pickles its trainer with cloudpickle, which "
            "is not importable here; pip install 'cloudpickle>=3.1.1'"
        )


def _check_launcher_options(text: str, words: list[str]) -> None:
    """``--torchrun``'s words read by ``torch.distributed.run``'s own parser."""
    from torch.distributed.run import get_args_parser  # the elastic launcher: a worker's start needs none

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
            f"e.g. {TORCHRUN_EXAMPLE}"
        )


def estimated_cpu_fit_seconds(steps: int, epochs: int, batch: int, imgsz: int, val_images: int) -> float:
    """A rough CPU duration of one real-trainer fit (training, then validation each epoch and at the end)."""
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
    """``auto`` as bf16 on CUDA and fp32 elsewhere; fp16 only on CUDA."""
    if amp == "auto":
        return "bf16" if device.startswith("cuda") else "fp32"
    if amp == "fp16" and not device.startswith("cuda"):
        raise InputError(
            "--amp fp16 needs a CUDA device (fp16 autocast with a grad scaler); use bf16 or fp32 on cpu"
        )
    return amp


def _check_workload_options(s: FitSettings, real: bool, imgsz: int) -> None:
    """The options that depend on the workload chosen: model, image size, real-trainer-only options."""
    if real:
        check_model(s.model)
        if imgsz % YOLO_STRIDE:
            raise InputError(
                f"--imgsz {imgsz} is not a multiple of the YOLO stride {YOLO_STRIDE} (e.g. 640, 320, 64)"
            )
        return
    if imgsz < 8:
        raise InputError(f"--imgsz {imgsz} is too small for the embedded model; use 8 or more (default 32)")
    for name in REAL_TRAINER_ONLY:
        if getattr(s, name) != getattr(FitSettings, name):
            flag = flag_of(name)
            raise InputError(
                f"{flag} {getattr(s, name)} applies to the real trainer only (--workload ultralytics); the "
                f"embedded workload has its own model and loop: drop {flag}"
            )


def make_plan(protocol: ProtocolOptions, s: FitSettings, command: str = "", announce: Any = None) -> Plan:
    """The plan from the fit's checked settings (``InputError`` where they do not fit); nothing is written."""
    for arm in protocol.arms:  # the real trainer passes upstream MuSGD's defaults: these keys too
        checked_optimizer(arm.spec, import_upstream=False, tier_kwargs=optimizer_kwargs())
    if s.stages and protocol.bar is not None:
        raise InputError(
            "--bar with --stages: a stages run is a diagnostic with no verdict; drop --bar (or --stages)"
        )
    chosen, why = resolve_workload(s.workload)
    real = chosen == "ultralytics"
    imgsz = DEFAULT_IMGSZ[chosen] if s.imgsz is None else s.imgsz
    resolved = replace(s, workload=chosen, imgsz=imgsz, amp=resolve_amp(s.amp, protocol.device))
    _check_workload_options(s, real, imgsz)
    if s.data is not None:
        resolved = replace(resolved, **_user_set(s, real))
    # Each size not given: the embedded workload's CPU default, or the tier's.
    small = chosen == "embedded" and not protocol.device.startswith("cuda")
    unset = [name for name in CPU_EMBEDDED if getattr(resolved, name) is None]
    resolved = replace(resolved, **{name: (CPU_EMBEDDED if small else DEFAULTS)[name] for name in unset})
    smaller = [f"{getattr(resolved, name)} {name}" for name in unset] if small else []
    epochs = check_steps(resolved.steps, resolved.images, s.batch, counted=s.data is not None)
    set_bytes = (resolved.images + resolved.val_images) * 3 * imgsz**2 * 4
    if not real and set_bytes > MAX_EMBEDDED_SET_BYTES:
        raise InputError(
            f"the embedded workload holds its whole synthetic set in memory: ({resolved.images} + "
            f"{resolved.val_images} images) × 3 × {imgsz}² floats = {format_bytes(set_bytes)}, more than "
            f"{format_bytes(MAX_EMBEDDED_SET_BYTES)}; use fewer --images or a smaller --imgsz"
        )
    check_ranks(protocol, s, chosen)
    resolved = replace(
        resolved, model=s.model if real else "embedded SmallConvNet", data_cache=str(s.data_cache)
    )
    if announce is not None:
        _announce(announce, protocol, resolved, epochs, why, smaller)
    return _plan(protocol, resolved, epochs, command)


def _plan(protocol: ProtocolOptions, r: FitSettings, epochs: int, command: str) -> Plan:
    """The plan of resolved settings: one case of both arms."""
    real, ranks = r.workload == "ultralytics", protocol.gpus
    label = (
        f"{Path(r.model).stem if real else 'embedded'} {r.imgsz}px b{r.batch} {r.steps} steps "
        f"({epochs}×{r.iterations_per_epoch})" + (f" ×{ranks} ranks" if ranks > 1 else "")
    )
    shares = {"ranks": ranks, "batch_per_rank": r.batch // ranks, "backend": protocol.backend}
    params = dict(
        workload=r.workload, model=r.model, steps=r.steps, epochs=epochs, images=r.images, batch=r.batch
    )
    params.update(imgsz=r.imgsz, amp=r.amp, **(shares if ranks > 1 else {}))
    cases = [Case(label, params, protocol.arms)]
    disk = ", .npy image cache" if r.cache == "disk" else ""
    prepared = (
        f"; before the first trial a preparatory worker builds the data set once (label caches{disk}), so every "
        "trial starts from the same files"
    )
    return Plan(
        tier="stages" if r.stages else "pair",
        protocol=protocol,
        cases=cases,
        arm_code=arm_code(cases, protocol.device),
        unit="s",
        metric="whole-fit wall time" + (" with stage marks (diagnostic)" if r.stages else ""),
        settings=asdict(r),
        command=command,
        in_process=False,
        isolation=_isolation(protocol, r.workload) + (prepared if real else ""),
        timed_region=_timed_region(r, real, ranks, protocol.backend),
    )


def _user_set(s: FitSettings, real: bool) -> dict[str, Any]:
    """The images, val images and resolved path of ``--data``; ``InputError`` where the fit cannot use it."""
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
    return {"images": counted, "val_images": val_images, "data": str(Path(s.data).resolve())}


def _announce(
    announce: Any, protocol: ProtocolOptions, r: FitSettings, epochs: int, why: str, smaller: list[str]
) -> None:
    """The pre-run lines: the workload chosen, a CPU default used, a long CPU fit's estimate."""
    announce(f"workload: {r.workload} ({why})")
    if smaller:
        announce(
            f"fit: {r.steps} steps of {r.images} images = {epochs} epochs × {r.iterations_per_epoch} iterations ("
            f"{' and '.join(smaller)}: the embedded workload's CPU default, about a minute on two cores; "
            f"otherwise {DEFAULTS['steps']} steps of {DEFAULTS['images']} images)"
        )
    if r.workload != "ultralytics" or protocol.device.startswith("cuda"):
        return
    estimate = estimated_cpu_fit_seconds(r.steps, epochs, r.batch, r.imgsz, r.val_images)
    if estimate >= LONG_FIT_S:
        fits = len(protocol.arms) * protocol.initial_pairs + protocol.scheduled_warmup
        announce(
            f"note: the real trainer on the CPU: an estimated {_minutes(estimate)} per fit ({r.steps} steps of "
            f"batch {r.batch} at {r.imgsz} px, a yolo26n-sized model), about {_minutes(fits * estimate)} for "
            f"the {fits} fits; use --device cuda, fewer --steps, a smaller --imgsz or --workload embedded"
        )


def _isolation(protocol: ProtocolOptions, workload: str) -> str:
    """How a trial is isolated, in words."""
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


def _timed_region(s: FitSettings, real: bool, ranks: int, backend: str) -> str:
    """The timed region in words: the bracket, then what the fit does inside it."""
    bracket = "the whole fit, synchronized at both ends: "
    if ranks > 1:
        built = "; Ultralytics builds its trainer in each rank before it" if real else ""
        bracket = (
            f"the whole fit on rank 0 of {ranks} ({backend}), one bracket between two barriers of every rank "
            f"(process group and devices set up before it{built}), synchronized at both ends: "
        )
    disk = " and the .npy image cache" if s.cache == "disk" else ""
    ram = "; the RAM image cache built by each fit" if s.cache == "ram" else ""
    inside = (
        f"YOLO(model).train(...) — dataset set-up (label caches{disk} made once before the first trial, "
        f"untimed{ram}), augmentation, mosaic closure, LR schedule, forward/backward, optimizer, EMA, "
        "validation each epoch, checkpoints, final validation"
        if real
        else "embedded fit — synthetic data, augmentation, LR schedule, forward/backward, optimizer, "
        "EMA, validation each epoch, checkpoints, a log line per epoch"
    )
    stage_note = (
        "; --stages: synchronized marks at every stage boundary inside it (diagnostic only)"
        if s.stages
        else "; the harness adds no synchronization, profiler or callback inside it (the workload's own loss "
        "reads for logging are timed, for both arms alike)"
    )
    return bracket + inside + stage_note
