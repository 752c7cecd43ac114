"""The real-trainer adapter: an Ultralytics YOLO fit with the arm's optimizer, fully offline.

Ultralytics and matplotlib are imported where used: the embedded workload's worker imports this module without them."""

from __future__ import annotations

import csv
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiments.fit.embedded import optimizer_figures

CLOSED_PORT_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens, a connection is refused at once
FONT_NAMES = ("Arial.ttf", "Arial.Unicode.ttf")
INTEGRATIONS_OFF = {
    k: False for k in ("sync", "clearml", "comet", "dvc", "mlflow", "raytune", "tensorboard", "wandb")
}
AMP_ARGUMENT = {"bf16": "bf16", "fp16": True, "fp32": False}


def offline_environment(config_dir: Path) -> dict[str, str]:
    """Environment variables that keep an Ultralytics worker offline and writing only where it is told."""
    return {
        "YOLO_OFFLINE": "1",
        "YOLO_CONFIG_DIR": str(Path(config_dir).resolve()),
        "MPLBACKEND": "Agg",
        **dict.fromkeys(("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"), CLOSED_PORT_PROXY),
        **dict.fromkeys(("NO_PROXY", "no_proxy"), ""),
    }


def prepare_config_dir(config_dir: Path) -> None:
    """Put a TTF where Ultralytics looks for Arial (its font check would otherwise try to download one)."""
    from matplotlib import font_manager

    target = Path(config_dir) / "Ultralytics"
    target.mkdir(parents=True, exist_ok=True)
    source = Path(font_manager.findfont("DejaVu Sans", fallback_to_default=True))
    for name in FONT_NAMES:
        if not (target / name).is_file():
            staging = target / f".{name}.{os.getpid()}.tmp"
            shutil.copyfile(source, staging)
            os.replace(staging, target / name)


def configure_ultralytics() -> None:
    """Its font in place first, then Ultralytics' integrations off, before any trainer is built."""
    prepare_config_dir(Path(os.environ["YOLO_CONFIG_DIR"]))
    from ultralytics.utils import SETTINGS

    SETTINGS.update(INTEGRATIONS_OFF)


def read_results_csv(path: Path) -> dict[str, list[Any]]:
    """``results.csv`` as {column: values}, numbers as floats — what upstream builds with polars."""
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            header, *rows = list(csv.reader(handle)) or [[]]
    except OSError:
        return {}
    header = [name.strip() for name in header]
    columns: dict[str, list[Any]] = {name: [] for name in header}
    for row in rows:
        for name, cell in zip(header, row, strict=False):  # a short row leaves columns short
            try:
                columns[name].append(float(cell))
            except ValueError:
                columns[name].append(cell.strip())
    return columns


def device_argument(device: str) -> str:
    """The harness's ``cpu`` / ``cuda`` / ``cuda:N`` as Ultralytics' ``cpu`` / ``N``."""
    if device.startswith("cuda"):
        return device.split(":")[1] if ":" in device else "0"
    return "cpu"


def make_trainer_class(
    make_optimizer: Callable[..., Any],
    clock: Any,
    stamps: list[float],
    epoch_starts: list[float],
    base: type | None = None,
) -> type:
    """A ``DetectionTrainer`` (or ``base``, a subclass of it) whose optimizer is the arm's."""
    if base is None:
        from ultralytics.models.yolo.detect import DetectionTrainer as base

    class ArmTrainer(base):
        """Upstream's trainer, with the arm's optimizer and a polars-free ``read_results_csv``."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # Host timestamps (no synchronization added): each iteration's end, after the trainer has read its
            # losses back for the progress bar, and each epoch's start, after the last epoch's checkpoint.
            self.add_callback("on_train_batch_end", lambda _trainer: stamps.append(time.perf_counter()))
            self.add_callback(
                "on_train_epoch_start", lambda _trainer: epoch_starts.append(time.perf_counter())
            )

        def build_optimizer(self, model, name="auto", lr=0.001, momentum=0.9, decay=1e-5, iterations=1e5):
            upstream = super().build_optimizer(model, name, lr, momentum, decay, iterations)
            if not hasattr(upstream, "muon"):
                raise RuntimeError(
                    f"upstream built {type(upstream).__name__}, not MuSGD: the fit passes optimizer='MuSGD'"
                )
            groups = [dict(group) for group in upstream.param_groups]  # same params and hyperparameters
            kwargs = {**upstream.defaults, "muon": upstream.muon, "sgd": upstream.sgd}
            return make_optimizer(groups, kwargs)

        def read_results_csv(self):
            return read_results_csv(self.csv)

    class StagedTrainer(ArmTrainer):
        """The ``--stages`` diagnostic: a synchronized mark at every stage boundary (never in a claim)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.add_callback("on_train_epoch_start", lambda _trainer: clock.mark("other"))
            self.add_callback("on_train_batch_start", lambda _trainer: clock.iteration())
            self.add_callback("on_train_batch_end", lambda _trainer: clock.mark("other"))
            self.add_callback("on_pretrain_routine_end", self._time_ema)
            for method, stage in (
                ("validate", "validation"),
                ("save_model", "checkpoint"),
                ("final_eval", "validation"),
            ):
                setattr(self, method, clock.wrap(getattr(self, method), "other", stage))

        def build_optimizer(self, *args: Any, **kwargs: Any):
            optimizer = super().build_optimizer(*args, **kwargs)
            optimizer.register_step_pre_hook(lambda *_: clock.mark("step_overhead"))
            optimizer.register_step_post_hook(lambda *_: clock.mark("optimizer"))
            return optimizer

        def _time_ema(self, _trainer: Any) -> None:
            self.ema.update = clock.wrap(self.ema.update, "step_overhead", "ema")

        def preprocess_batch(self, batch):
            batch = super().preprocess_batch(batch)
            clock.mark("data")
            return batch

        def optimizer_step(self):
            clock.mark("forward_backward")
            super().optimizer_step()

    return StagedTrainer if clock.enabled else ArmTrainer


def prepare_dataset(settings: Any, data_yaml: str) -> dict[str, Any]:
    """Build the train and val splits of ``data_yaml`` once with upstream's dataset builder."""
    configure_ultralytics()
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    data = check_det_dataset(data_yaml)
    disk = settings.cache == "disk"  # a RAM cache is per process: nothing to make ahead
    cfg = get_cfg(
        overrides={
            "data": data_yaml,
            "imgsz": settings.imgsz,
            "batch": settings.batch,
            "cache": "disk" if disk else False,
            "workers": 0,
        }
    )
    images: dict[str, int] = {}
    caches: list[str] = []
    for mode in ("train", "val"):
        dataset = build_yolo_dataset(
            cfg, data[mode], settings.batch, data, mode=mode, rect=mode == "val", stride=32
        )
        images[mode] = len(dataset)
        # Where upstream keeps a split's label cache: beside its labels folder (unwritable folders get none).
        cache = Path(dataset.label_files[0]).parent.with_suffix(".cache") if dataset.label_files else None
        if cache is not None and cache.is_file():
            caches.append(str(cache))
    return {"images": images, "label_caches": caches, "image_cache": "disk" if disk else "none"}


def prepare_fit(
    settings: Any,
    data_yaml: str,
    make_optimizer: Callable[..., Any],
    device: str,
    seed: int,
    trial_dir: Path,
    clock: Any,
) -> Callable[[], dict[str, Any]]:
    """Import and configure Ultralytics (outside the timed bracket); return the fit to time."""
    configure_ultralytics()
    from ultralytics import YOLO

    stamps: list[float] = []
    epoch_starts: list[float] = []
    trainer_class = make_trainer_class(make_optimizer, clock, stamps, epoch_starts)
    model = YOLO(settings.model, task="detect")
    arguments = train_arguments(settings, data_yaml, device_argument(device), seed, trial_dir)

    def fit() -> dict[str, Any]:
        model.train(trainer=trainer_class, **arguments)
        trainer = model.trainer
        if trainer.batch_size != settings.batch:
            # Upstream halves the batch after an out-of-memory in the first epoch: a different workload.
            raise RuntimeError(
                f"CUDA out of memory at batch {settings.batch}: the trainer fell back to batch {trainer.batch_size}"
            )
        return fit_result(trainer, stamps, epoch_starts)

    return fit


def fit_result(trainer: Any, stamps: list[float], epoch_starts: list[float]) -> dict[str, Any]:
    """The figures a finished trainer holds (on rank 0 of a data-parallel fit)."""
    metrics = trainer.metrics or {}
    weights = Path(trainer.wdir)
    return {
        "iterations": len(stamps),
        "iteration_stamps": stamps,
        "epoch_start_stamps": epoch_starts,
        "iterations_per_epoch": len(trainer.train_loader),
        "val_map50_95": _number(metrics.get("metrics/mAP50-95(B)")),
        "val_map50": _number(metrics.get("metrics/mAP50(B)")),
        "checkpoint_bytes": sum(p.stat().st_size for p in weights.glob("*.pt")),
        **optimizer_figures(trainer.optimizer),
        "amp_used": bool(trainer.amp),
        "train_loss": trainer.loss,  # the last batch's loss tensor, read after the bracket
        "trained": {"model": trainer.model, "ema": getattr(trainer.ema, "ema", None)},
    }


def train_arguments(settings: Any, data_yaml: str, device: str, seed: int, trial_dir: Path) -> dict[str, Any]:
    """``YOLO.train``'s arguments for one fit (``device`` in Ultralytics' form: ``cpu``, ``0`` or ``0,1``)."""
    return {
        "data": data_yaml,
        "epochs": settings.epochs,
        "imgsz": settings.imgsz,
        "batch": settings.batch,
        "nbs": settings.batch,
        "optimizer": "MuSGD",
        "amp": AMP_ARGUMENT[settings.amp],
        "workers": settings.workers,
        "device": device,
        "project": str(trial_dir),
        "name": "fit",
        "exist_ok": True,
        "plots": False,
        "val": True,
        "save": True,
        "seed": upstream_seed(seed),
        "deterministic": False,
        "verbose": False,
        "pretrained": False,
        "close_mosaic": settings.close_mosaic,
        "cache": False if settings.cache == "none" else settings.cache,
    }


# Upstream seeds numpy's legacy generator with seed + 1 + rank, which must stay below 2**32.
UPSTREAM_SEED_LIMIT = 2**32 - 1024


def upstream_seed(seed: int) -> int:
    """The trial's seed as upstream can take it."""
    return seed % UPSTREAM_SEED_LIMIT


def _number(value: Any) -> float | None:
    try:
        return round(float(value), 6)
    except (TypeError, ValueError):
        return None
