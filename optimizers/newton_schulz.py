"""Quintic Newton-Schulz, the core of Muon; each operation's order and dtype fixed, as bf16 rounding needs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7


def newton_schulz(G: torch.Tensor, compute_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Approximately orthogonalize each (rows, cols) matrix in `compute_dtype` (a transposed view if tall)."""
    if G.ndim < 2:
        raise ValueError(f"Newton-Schulz needs a matrix or a batch of matrices, got shape {tuple(G.shape)}")
    a, b, c = NS_COEFFICIENTS
    X = G.to(dtype=compute_dtype, memory_format=torch.contiguous_format, copy=True)
    norm = X.norm() if X.ndim == 2 else X.norm(dim=(-2, -1), keepdim=True)
    X /= norm + NS_EPS
    tall = G.size(-2) > G.size(-1)
    if tall:
        X = X.mT
    for _ in range(NS_STEPS):
        A = X @ X.mT
        B = b * A + (c * A) @ A
        X = a * X + B @ X
    return X.mT if tall else X


_REDUCED_PRECISION = (torch.bfloat16, torch.float16)


def foreach_mul_(tensors: list[torch.Tensor], scalars: float | list[float]) -> None:
    """`t.mul_(s)` for every tensor, rounded as `mul_` rounds (on the CPU out of place: foreach rounds s)."""
    if not tensors:
        return
    if tensors[0].device.type == "cpu" and any(t.dtype in _REDUCED_PRECISION for t in tensors):
        torch._foreach_copy_(tensors, torch._foreach_mul(tensors, scalars))
    else:
        torch._foreach_mul_(tensors, scalars)


@dataclass(frozen=True)
class Stack:
    """A contiguous matrix or batch that Newton-Schulz orthogonalizes in place, and its products' views."""

    tensor: torch.Tensor
    x: torch.Tensor  # the wide orientation, X in the iteration
    x_t: torch.Tensor
    product: Callable[..., torch.Tensor]  # torch.mm for a matrix, torch.bmm for a batch: no `@` wrappers

    @classmethod
    def of(cls, tensor: torch.Tensor) -> Stack:
        if tensor.ndim not in (2, 3) or not tensor.is_contiguous():
            raise ValueError(
                f"a Newton-Schulz stack is a contiguous 2-D or 3-D tensor, got {tuple(tensor.shape)}"
            )
        tall = tensor.size(-2) > tensor.size(-1)
        x = tensor.mT if tall else tensor
        return cls(tensor, x, x.mT, torch.mm if tensor.ndim == 2 else torch.bmm)


def newton_schulz_stacks(stacks: Sequence[Stack]) -> None:
    """`newton_schulz` of every stack, in place and in lockstep (one foreach a step): bit for bit the same."""
    if not stacks:
        return
    a, b, c = NS_COEFFICIENTS
    # Wide stacks first: their X is laid out as B X comes out, so X += B X is one kernel for all of them.
    stacks = sorted(stacks, key=lambda s: not s.x.is_contiguous())
    dense = sum(s.x.is_contiguous() for s in stacks)
    tensors = [s.tensor for s in stacks]
    norms = [t.norm() if t.ndim == 2 else t.norm(dim=(-2, -1), keepdim=True) for t in tensors]
    torch._foreach_add_(norms, NS_EPS)
    torch._foreach_div_(tensors, norms)
    xs = [s.x for s in stacks]
    for _ in range(NS_STEPS):
        grams = [s.product(s.x, s.x_t) for s in stacks]  # A = X X^T
        scaled = torch._foreach_mul(grams, c)
        squares = [s.product(ca, gram) for s, ca, gram in zip(stacks, scaled, grams, strict=True)]  # (cA) A
        foreach_mul_(grams, b)
        torch._foreach_add_(grams, squares)  # B = bA + (cA) A, in the Gram matrices' memory
        steps = [s.product(gram, s.x) for s, gram in zip(stacks, grams, strict=True)]  # B X, from the old X
        foreach_mul_(xs, a)
        for part in (slice(None, dense), slice(dense, None)):
            if xs[part]:
                torch._foreach_add_(xs[part], steps[part])  # X = aX + B X


def muon_scale(grad_shape: torch.Size | tuple[int, ...]) -> float:
    """The per-matrix gain sqrt(max(1, rows/cols)), from the gradient's raw last two dims."""
    return max(1, grad_shape[-2] / grad_shape[-1]) ** 0.5
