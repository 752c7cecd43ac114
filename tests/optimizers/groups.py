"""Parameters and parameter groups that the optimizers' tests step."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

# The hyper-parameters of every group the tests build, unless a test says otherwise.
HYPER = {"lr": 0.02, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}


def scaled_params(
    shapes: Iterable[tuple[int, ...]],
    generator: torch.Generator,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> list[torch.nn.Parameter]:
    """One parameter of each shape, drawn from ``generator`` and scaled to 0.02, as initial weights are."""
    return [
        torch.nn.Parameter((torch.randn(s, generator=generator) * 0.02).to(device=device, dtype=dtype))
        for s in shapes
    ]


def muon_and_sgd(muon: list[torch.Tensor], sgd: list[torch.Tensor]) -> list[dict[str, Any]]:
    """A Muon group and an SGD group, both of `HYPER`."""
    return [{"params": muon, "use_muon": True, **HYPER}, {"params": sgd, "use_muon": False, **HYPER}]


def params_of(groups: list[dict[str, Any]]) -> list[torch.Tensor]:
    """Every parameter of ``groups``, in order."""
    return [p for group in groups for p in group["params"]]


def fill_grads(params: list[torch.Tensor], seed: int) -> None:
    """Gives each parameter a gradient drawn from ``seed``, scaled to 0.01, on its device and in its dtype."""
    generator = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=generator) * 0.01).to(device=p.device, dtype=p.dtype)


# Conv-like matrices of several widths sharing their smaller dimension (8): enough for a padded batch, small
# enough to step on the CPU in milliseconds.
CONV_SHAPES = [(8, 4, 3, 3), (8, 16, 1, 1), (16, 8, 1, 1), (8, 8, 3, 3)]


def conv_groups(
    shapes: Iterable[tuple[int, ...]] = CONV_SHAPES, device: str = "cpu", seed: int = 0
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """A bias group and a Muon group of ``shapes``, with gradients, as YOLO groups them; and MuSGD's keywords."""
    generator = torch.Generator().manual_seed(seed)
    muon = [torch.nn.Parameter(torch.randn(s, generator=generator).to(device)) for s in shapes]
    bias = [torch.nn.Parameter(torch.randn(8, generator=generator).to(device))]
    for p in muon + bias:
        p.grad = torch.randn(p.shape, generator=generator).to(device)
    hyper = {"lr": 0.01, "momentum": 0.937, "nesterov": True}
    return (
        [
            {"params": bias, **hyper, "weight_decay": 0.0, "use_muon": False, "param_group": "bias"},
            {"params": muon, **hyper, "weight_decay": 5e-4, "use_muon": True, "param_group": "muon"},
        ],
        {"muon": 0.2, "sgd": 1.0},
    )
