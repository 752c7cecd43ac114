"""Whether a step computed numbers: every tier judges the finiteness of what it measured, since an arm that
fills its parameters with NaN can be very fast. A non-finite result fails the trial (an ``error`` row)."""

from __future__ import annotations

import torch

NAMED = 3  # parameters named in the message before "and N more"


def non_finite_parameters(optimizer: torch.optim.Optimizer) -> list[str]:
    """Each floating-point parameter of ``optimizer`` holding a NaN or an infinity, as 'group g parameter i
    (n of m entries)'; empty when every one is finite."""
    bad = []
    with torch.no_grad():
        for g, group in enumerate(optimizer.param_groups):
            for i, parameter in enumerate(group["params"]):
                if not parameter.is_floating_point():
                    continue
                finite = int(torch.isfinite(parameter).sum())
                if finite < parameter.numel():
                    bad.append(
                        f"group {g} parameter {i} ({parameter.numel() - finite} of {parameter.numel()})"
                    )
    return bad


def check_finite_step(optimizer: torch.optim.Optimizer, after: str) -> None:
    """``FloatingPointError`` naming the parameters a step left non-finite (checked ``after`` it, untimed)."""
    bad = non_finite_parameters(optimizer)
    if bad:
        more = f" and {len(bad) - NAMED} more" if len(bad) > NAMED else ""
        raise FloatingPointError(f"non-finite parameters after {after}: {', '.join(bad[:NAMED])}{more}")
