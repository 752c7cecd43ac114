"""MuSGD, the per-parameter baseline: Ultralytics 8.4.101's step, bit for bit (channels_last accepted too)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from .newton_schulz import muon_scale, newton_schulz


def muon_momentum(
    grad: torch.Tensor, momentum_buffer: torch.Tensor, beta: float, nesterov: bool
) -> torch.Tensor:
    """Advance the Muon momentum in place (an exponential average) and return the tensor to orthogonalize."""
    momentum_buffer.lerp_(grad, 1 - beta)
    return grad.lerp(momentum_buffer, beta) if nesterov else momentum_buffer


def muon_update(
    grad: torch.Tensor, momentum_buffer: torch.Tensor, beta: float, nesterov: bool
) -> torch.Tensor:
    """Advance the momentum; return the orthogonalized, scaled bf16 update as an (out, in*kh*kw) matrix."""
    if grad.ndim not in (2, 4):
        raise ValueError(f"Muon updates 2-D or 4-D parameters, got a gradient of shape {tuple(grad.shape)}")
    update = muon_momentum(grad, momentum_buffer, beta, nesterov)
    if update.ndim == 4:
        update = update.reshape(len(update), -1)  # a view when contiguous, a row-major copy for channels_last
    orthogonal = newton_schulz(update)
    orthogonal *= muon_scale(grad.shape)
    return orthogonal


def sgd_momentum_step(
    p: torch.Tensor,
    grad: torch.Tensor,
    buffer: torch.Tensor,
    lr: float,
    momentum: float,
    weight_decay: float,
    nesterov: bool,
) -> None:
    """One SGD momentum step; weight decay joins the gradient out of place."""
    if weight_decay != 0:
        grad = grad.add(p, alpha=weight_decay)
    buffer.mul_(momentum).add_(grad)
    update = grad.add(buffer, alpha=momentum) if nesterov else buffer
    p.add_(update, alpha=-lr)


def musgd_param_step(
    p: torch.Tensor,
    state: dict[str, Any],
    group: dict[str, Any],
    muon: float,
    sgd: float,
    update: torch.Tensor | None = None,
) -> None:
    """The MuSGD step of one parameter with a gradient; a given Muon `update` (p's shape) skips its own."""
    grad = p.grad
    lr, momentum = group["lr"], group["momentum"]
    if group["use_muon"]:
        if len(state) == 0:
            state["momentum_buffer"] = torch.zeros_like(p)
            state["momentum_buffer_SGD"] = torch.zeros_like(p)
        if update is None:
            update = muon_update(grad, state["momentum_buffer"], momentum, group["nesterov"]).reshape(p.shape)
        p.add_(update, alpha=-(lr * muon))
        sgd_buffer, sgd_lr = state["momentum_buffer_SGD"], lr * sgd
    else:
        if len(state) == 0:
            state["momentum_buffer"] = torch.zeros_like(p)
        sgd_buffer, sgd_lr = state["momentum_buffer"], lr
    sgd_momentum_step(p, grad, sgd_buffer, sgd_lr, momentum, group["weight_decay"], group["nesterov"])


def closure_loss(closure: Callable[[], Any] | None) -> Any:
    """The closure's loss, computed with gradients on; None without a closure."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class MuSGD(torch.optim.Optimizer):
    """Muon + SGD, one parameter at a time; `muon` and `sgd` scale the two parts' rates in Muon groups."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        use_muon: bool = False,
        muon: float = 0.2,
        sgd: float = 1.0,
    ) -> None:
        defaults = dict(
            lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov, use_muon=use_muon
        )
        super().__init__(params, defaults)
        self.muon, self.sgd = muon, sgd

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update every parameter that has a gradient, group by group, in order."""
        loss = closure_loss(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    musgd_param_step(p, self.state[p], group, self.muon, self.sgd)
        return loss
