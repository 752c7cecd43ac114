"""Quintic Newton-Schulz orthogonalization, the core of Muon, shared by both MuSGD implementations.

Every step's order and dtype is fixed on purpose: the baseline must reproduce the per-parameter Ultralytics
MuSGD bit for bit, and bf16 rounding depends on where each scalar multiply and each product happens.
"""

from __future__ import annotations

import torch

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7


def newton_schulz(
    G: torch.Tensor, compute_dtype: torch.dtype = torch.bfloat16, in_place: bool = False
) -> torch.Tensor:
    """Approximately orthogonalize a matrix, or each matrix of a batch of shape (..., rows, cols).

    X is a fresh contiguous `compute_dtype` copy of G (so neither the caller's update nor a momentum buffer
    is touched, whatever its layout), divided by its Frobenius norm + 1e-7 (norm and division in
    `compute_dtype`), transposed when tall so the products run on the smaller Gram matrix, then iterated five
    times as A = X @ X^T, B = (b*A) + ((c*A) @ A), X = (a*X) + (B @ X). The result stays in `compute_dtype`;
    for a tall input it is a transposed view.

    `in_place=True` is for a stack the caller built for this call (contiguous, already `compute_dtype`): it
    is normalized in place and receives the result, so views taken into it before the call read the result
    after it. `compute_dtype` is bf16 for the optimizers; tests pass float64 to check batching exactness.
    """
    if G.ndim < 2:
        raise ValueError(f"Newton-Schulz needs a matrix or a batch of matrices, got shape {tuple(G.shape)}")
    if in_place and (G.dtype != compute_dtype or not G.is_contiguous()):
        raise ValueError("in_place Newton-Schulz needs a contiguous tensor already in compute_dtype")
    a, b, c = NS_COEFFICIENTS
    X = G if in_place else G.to(dtype=compute_dtype, memory_format=torch.contiguous_format, copy=True)
    # One whole-tensor norm for a matrix (what the per-parameter reference computes), one norm per matrix for
    # a batch; zero padding leaves a member's norm unchanged.
    norm = X.norm() if X.ndim == 2 else X.norm(dim=(-2, -1), keepdim=True)
    X /= norm + NS_EPS
    tall = G.size(-2) > G.size(-1)
    if tall:
        X = X.mT
    for step in range(NS_STEPS):
        A = X @ X.mT
        B = b * A + (c * A) @ A
        if (
            in_place and step == NS_STEPS - 1
        ):  # the same elementwise sum, written back into the caller's stack
            torch.add(a * X, B @ X, out=G.mT if tall else G)
            return G
        X = a * X + B @ X
    return X.mT if tall else X


def muon_scale(grad_shape: torch.Size | tuple[int, ...]) -> float:
    """The per-matrix gain sqrt(max(1, rows/cols)), from the gradient's raw last two dims (1 for square kernels)."""
    return max(1, grad_shape[-2] / grad_shape[-1]) ** 0.5
