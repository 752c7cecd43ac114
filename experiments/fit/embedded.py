"""The embedded workload: a small convolutional classifier trained through the elements of a real fit."""

from __future__ import annotations

import io
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import distributed as dist
from torch import nn
from torch.nn import functional as F

from harness.timing import StageClock

CLASSES = 10
DEFAULT_IMGSZ = 32
LR0, LRF, MOMENTUM, WEIGHT_DECAY = 0.01, 0.01, 0.937, 5e-4
WARMUP_EPOCHS, WARMUP_MOMENTUM, WARMUP_BIAS_LR = 3, 0.8, 0.1
MUON_SCALE, SGD_SCALE = 0.2, 1.0  # what the Ultralytics trainer passes to MuSGD
CLIP_NORM = 10.0
EMA_DECAY, EMA_TAU = 0.9999, 2000.0

OptimizerFactory = Callable[[list[dict[str, Any]], dict[str, Any]], torch.optim.Optimizer]


def conv_block(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.SiLU())


class SmallConvNet(nn.Module):
    """Five conv blocks (conv, BN, SiLU) and a linear head: 4-D and 2-D weights for Muon, BN and biases for SGD."""

    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        shapes = ((3, 16, 1), (16, 32, 2), (32, 32, 1), (32, 64, 2), (64, 64, 1))
        self.features = nn.Sequential(*(conv_block(*shape) for shape in shapes))
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


def build_param_groups(model: nn.Module, lr: float, momentum: float, decay: float) -> list[dict[str, Any]]:
    """MuSGD groups the way the trainer builds them: muon (2-D/4-D weights), bn, bias; empty groups dropped."""
    norms = tuple(m for name, m in vars(nn).items() if "Norm" in name and isinstance(m, type))
    muon, bn, bias, weight = [], [], [], []
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if param.ndim in (2, 4):
                muon.append(param)
            elif name == "bias":
                bias.append(param)
            elif isinstance(module, norms):
                bn.append(param)
            else:
                weight.append(param)
    common = {"lr": lr, "momentum": momentum, "nesterov": True}
    groups = {"weight": (weight, decay, False), "bn": (bn, 0.0, False), "bias": (bias, 0.0, False)}
    groups["muon"] = (muon, decay, True)
    return [
        {"params": params, **common, "weight_decay": wd, "use_muon": use_muon, "param_group": name}
        for name, (params, wd, use_muon) in groups.items()
        if params
    ]


def optimizer_kwargs() -> dict[str, Any]:
    """Constructor defaults for the optimizer (the groups carry their own values)."""
    return dict(
        lr=LR0,
        momentum=MOMENTUM,
        weight_decay=0.0,
        nesterov=True,
        use_muon=False,
        muon=MUON_SCALE,
        sgd=SGD_SCALE,
    )


def optimizer_figures(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's class and what it says of itself: sharing, how its core ran, memory kept between steps."""
    return {
        "optimizer_class": f"{type(optimizer).__module__}.{type(optimizer).__qualname__}",
        "optimizer_sharing": getattr(optimizer, "sharing", None),
        "optimizer_graphs": getattr(optimizer, "graph_stats", None),
        "optimizer_plan_bytes": getattr(optimizer, "plan_bytes", None),
    }


def synthetic_images(count: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` uint8 images (N, 3, size, size) and labels: a smooth template per class plus noise."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(CLASSES, 3, 4, 4, generator=generator)
    templates = F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    labels = torch.randint(0, CLASSES, (count,), generator=generator)
    noise = torch.randn(count, 3, size, size, generator=generator) * 0.15
    images = (templates[labels] + noise).clamp(0, 1)
    return (images * 255).round().to(torch.uint8), labels


def augment(images: torch.Tensor, generator: torch.Generator, pad: int = 2) -> torch.Tensor:
    """Float images in [0, 1]: random horizontal flips, padded random crops, brightness and contrast jitter."""
    x = images.float() / 255
    n, _, h, w = x.shape
    flip = torch.rand(n, generator=generator) < 0.5
    x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    padded = F.pad(x, (pad, pad, pad, pad), mode="reflect")
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=generator).tolist()
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=generator).tolist()
    x = torch.stack([padded[i, :, dy[i] : dy[i] + h, dx[i] : dx[i] + w] for i in range(n)])
    brightness = 1 + (torch.rand(n, 1, 1, 1, generator=generator) - 0.5) * 0.4
    contrast = 1 + (torch.rand(n, 1, 1, 1, generator=generator) - 0.5) * 0.4
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    return ((x - mean) * contrast + mean * brightness).clamp(0, 1)


class WeightEMA:
    """An exponential moving average of a model's floating-point state, with a warming decay."""

    def __init__(self, model: nn.Module) -> None:
        self.model = SmallConvNet(model.head.out_features).to(next(model.parameters()).device)
        self.model.load_state_dict(model.state_dict())
        self.model.eval().requires_grad_(False)
        self.updates = 0

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.updates += 1
        decay = EMA_DECAY * (1 - math.exp(-self.updates / EMA_TAU))
        ema_values = [v for v in self.model.state_dict().values() if v.dtype.is_floating_point]
        model_values = [v for v in model.state_dict().values() if v.dtype.is_floating_point]
        torch._foreach_lerp_(ema_values, model_values, 1 - decay)


def _save_atomic(state: dict[str, Any], path: Path) -> None:
    """A checkpoint through a temporary file and a rename, serialized in memory first."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_bytes(buffer.getbuffer())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _autocast(device: torch.device, amp: str):
    if amp == "fp32":
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=torch.bfloat16 if amp == "bf16" else torch.float16)


@torch.no_grad()
def _validate(
    ema: WeightEMA, images: torch.Tensor, labels: torch.Tensor, batch: int, device: torch.device, amp: str
) -> tuple[float, float]:
    """(mean loss, accuracy) of the EMA model over the validation set, in batches of twice the train batch."""
    loss_sum, correct = torch.zeros((), device=device), torch.zeros((), device=device)
    for start in range(0, len(images), 2 * batch):
        x = (images[start : start + 2 * batch].float() / 255).to(device, non_blocking=True)
        y = labels[start : start + 2 * batch].to(device, non_blocking=True)
        with _autocast(device, amp):
            logits = ema.model(x)
        loss_sum += F.cross_entropy(logits.float(), y, reduction="sum")
        correct += (logits.argmax(1) == y).sum()
    return float(loss_sum) / len(images), float(correct) / len(images)


def fit(
    make_optimizer: OptimizerFactory,
    settings: Any,
    *,
    device: str,
    data_seed: int,
    seed: int,
    trial_dir: Path,
    clock: StageClock,
    rank: int = 0,
    world: int = 1,
) -> dict[str, Any]:
    """Train from scratch for ``settings.epochs`` epochs of ``images // batch`` iterations (its sizes and amp)."""
    images, val_images, imgsz, batch, epochs, amp = (
        getattr(settings, name) for name in ("images", "val_images", "imgsz", "batch", "epochs", "amp")
    )
    dev = torch.device(device)
    torch.manual_seed(seed)
    all_x, all_y = synthetic_images(images + val_images, imgsz, data_seed)  # one set of class templates
    train_x, train_y, val_x, val_y = all_x[:images], all_y[:images], all_x[images:], all_y[images:]
    model = SmallConvNet().to(dev)
    learner: nn.Module = model
    if world > 1:
        # torch._dynamo comes with it: a one-rank worker never pays; ranks import it ahead (fit/worker.py).
        from torch.nn.parallel import DistributedDataParallel

        learner = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    optimizer = make_optimizer(build_param_groups(model, LR0, MOMENTUM, WEIGHT_DECAY), optimizer_kwargs())
    for group in optimizer.param_groups:
        group["initial_lr"] = group["lr"]
    if clock.enabled:
        optimizer.register_step_pre_hook(lambda *_: clock.mark("step_overhead"))
        optimizer.register_step_post_hook(lambda *_: clock.mark("optimizer"))
    scaler = torch.amp.GradScaler(dev.type, enabled=amp == "fp16" and dev.type == "cuda")
    ema = WeightEMA(model)
    generator = torch.Generator().manual_seed(seed)
    # One generator on one rank; with several, the epoch's order is shared and each rank augments its own share.
    augmenter = generator if world == 1 else torch.Generator().manual_seed(seed * 7919 + rank + 1)
    local = batch // world
    per_epoch = images // batch
    warmup = round(min(WARMUP_EPOCHS, max(epochs - 1, 0)) * per_epoch)
    decay = lambda epoch: max(1 - epoch / epochs, 0) * (1 - LRF) + LRF  # noqa: E731 - the schedule, named
    stamps: list[float] = []
    epoch_starts: list[float] = []
    best_accuracy, final, last_loss = -1.0, (math.nan, math.nan), math.nan
    checkpoint_bytes = 0
    name = optimizer_figures(optimizer)["optimizer_class"]
    print(
        f"embedded fit: {epochs} epochs × {per_epoch} iterations of batch {batch} at {imgsz} px, {amp}, {name}",
        flush=True,
    )
    fit_start = time.perf_counter()
    for epoch in range(epochs):
        epoch_starts.append(time.perf_counter())  # after the last epoch's checkpoint, which synchronized
        loss_sum = 0.0
        model.train()
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * decay(epoch)
        order = torch.randperm(images, generator=generator)
        clock.mark("other")
        for i in range(per_epoch):
            index = order[i * batch + rank * local : i * batch + (rank + 1) * local]
            x = augment(train_x[index], augmenter).to(dev, non_blocking=True)
            y = train_y[index].to(dev, non_blocking=True)
            clock.iteration()
            step = i + per_epoch * epoch
            if warmup and step <= warmup:
                for group in optimizer.param_groups:
                    start = WARMUP_BIAS_LR if group.get("param_group") == "bias" else 0.0
                    group["lr"] = start + (group["initial_lr"] * decay(epoch) - start) * step / warmup
                    group["momentum"] = WARMUP_MOMENTUM + (MOMENTUM - WARMUP_MOMENTUM) * step / warmup
            with _autocast(dev, amp):
                loss = F.cross_entropy(learner(x).float(), y)
            scaler.scale(loss).backward()
            clock.mark("forward_backward")
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            clock.mark("step_overhead")
            ema.update(model)
            clock.mark("ema")
            last_loss = loss.item()
            if not math.isfinite(last_loss):
                raise FloatingPointError(f"loss is {last_loss} at step {step}")
            loss_sum += last_loss
            stamps.append(time.perf_counter())
        clock.mark("other")
        if rank != 0:  # rank 0 validates and checkpoints; the others wait for it
            dist.barrier()
            continue
        final = _validate(ema, val_x, val_y, batch, dev, amp)
        clock.mark("validation")
        state = {
            "epoch": epoch,
            "model": model.state_dict(),
            "ema": ema.model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "val_loss": final[0],
            "val_accuracy": final[1],
        }
        _save_atomic(state, trial_dir / "last.pt")
        if final[1] > best_accuracy:
            best_accuracy = final[1]
            _save_atomic(state, trial_dir / "best.pt")
        checkpoint_bytes = sum(p.stat().st_size for p in trial_dir.glob("*.pt"))
        clock.mark("checkpoint")
        if world > 1:
            dist.barrier()
        print(
            f"epoch {epoch + 1}/{epochs}: train loss {loss_sum / per_epoch:.4f}, val loss {final[0]:.4f}, "
            f"val accuracy {final[1]:.4f}, {time.perf_counter() - epoch_starts[-1]:.2f} s",
            flush=True,
        )
    print(
        f"fit done: {len(stamps)} iterations in {time.perf_counter() - fit_start:.2f} s (host clock)",
        flush=True,
    )
    return {
        "iterations": len(stamps),
        "iteration_stamps": stamps,
        "epoch_start_stamps": epoch_starts,
        "iterations_per_epoch": per_epoch,
        # Only rank 0 validates: another rank has no validation figures (None, not a NaN to be refused).
        "val_loss": round(final[0], 6) if rank == 0 else None,
        "val_accuracy": round(final[1], 6) if rank == 0 else None,
        "checkpoint_bytes": checkpoint_bytes,
        **optimizer_figures(optimizer),
        "train_loss": round(last_loss, 6),
        "trained": {"model": model, "ema": ema.model},
    }
