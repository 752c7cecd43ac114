"""Whether a step or a fit computed numbers: a non-finite result fails the trial (an ``error`` row)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

NAMED = 3  # tensors named in a message before "and N more"


def non_finite(named: Iterable[tuple[str, torch.Tensor]], entries: str = "") -> list[str]:
    """'name (n of m)' for each floating-point tensor holding a NaN or an infinity."""
    bad = []
    with torch.no_grad():
        for name, tensor in named:
            if tensor.is_floating_point():
                finite = int(torch.isfinite(tensor).sum())
                if finite < tensor.numel():
                    bad.append(f"{name} ({tensor.numel() - finite} of {tensor.numel()}{entries})")
    return bad


def first_named(bad: list[str]) -> str:
    """The first ``NAMED`` entries joined, then 'and N more'."""
    return ", ".join(bad[:NAMED]) + (f" and {len(bad) - NAMED} more" if len(bad) > NAMED else "")


def check_finite_step(optimizer: torch.optim.Optimizer, after: str) -> None:
    """``FloatingPointError`` naming the parameters a step left non-finite (checked ``after`` it, untimed)."""
    groups = optimizer.param_groups
    bad = non_finite(
        (f"group {g} parameter {i}", p)
        for g, group in enumerate(groups)
        for i, p in enumerate(group["params"])
    )
    if bad:
        raise FloatingPointError(f"non-finite parameters after {after}: {first_named(bad)}")
