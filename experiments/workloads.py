"""YOLO26 MuSGD parameter sets: the real shapes and groups, with seeded synthetic values and gradients."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import torch

from harness.errors import InputError
from harness.options import split_list
from harness.schema import check_choice

SCALES: tuple[str, ...] = ("n", "s", "m", "l", "x")

GROUP_KEYS = ("lr", "momentum", "nesterov", "weight_decay", "use_muon", "param_group")
PARAM_INIT_STD = 0.02  # small, like a freshly initialized network; only its scale relative to updates matters
GRAD_STD = 0.01


def load_workload(scale: str) -> dict[str, Any]:
    """The parsed workload JSON of one YOLO26 scale (schema: shared/workloads/README.md)."""
    if scale not in SCALES:
        raise ValueError(f"unknown YOLO26 scale {scale!r}; accepted: {', '.join(SCALES)}")
    text = resources.files("experiments").joinpath("data", f"yolo26{scale}.json").read_text(encoding="utf-8")
    return json.loads(text)


def parse_scales(name: str, text: str) -> list[str]:
    """The scales a comma-separated option names, each once; ``InputError`` otherwise."""
    scales = split_list(name, text)
    for scale in scales:
        check_choice(name, scale, SCALES)
    if len(set(scales)) != len(scales):
        raise InputError(f"{name} '{text}' names a scale twice; name each of {', '.join(SCALES)} once")
    return scales


def build_param_groups(
    scale: str,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Param groups ready for a MuSGD-like constructor, and the optimizer kwargs the trainer passes."""
    workload = load_workload(scale)
    generator = torch.Generator().manual_seed(seed)
    members: dict[int, list[dict[str, Any]]] = {}
    for entry in sorted(workload["params"], key=lambda e: e["order"]):
        members.setdefault(entry["group"], []).append(entry)
    groups = []
    for group_spec in workload["groups"]:
        entries = members.get(group_spec["index"], [])
        if not entries:
            continue
        params = []
        for entry in entries:
            values = torch.randn(entry["shape"], generator=generator) * PARAM_INIT_STD
            params.append(
                torch.nn.Parameter(
                    values.to(device=device, dtype=dtype), requires_grad=entry["requires_grad"]
                )
            )
        groups.append({"params": params, **{key: group_spec[key] for key in GROUP_KEYS}})
    return groups, dict(workload["optimizer_kwargs"])


def fill_synthetic_grads(groups: list[dict[str, Any]], seed: int) -> None:
    """Give every trainable parameter a seeded normal(0, 0.01) gradient, laid out like the parameter."""
    generator = torch.Generator().manual_seed(seed)
    for group in groups:
        for p in group["params"]:
            if not p.requires_grad:
                continue
            values = torch.randn(p.shape, generator=generator) * GRAD_STD
            grad = p.grad
            if grad is None or grad.shape != p.shape or grad.dtype != p.dtype or grad.device != p.device:
                grad = torch.empty_like(p, memory_format=torch.preserve_format)
                p.grad = grad
            grad.copy_(values)
