"""The language-model head: softcapped logits and cross-entropy, native or streamed in chunks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

VARIANTS = ("native", "chunked")

# The YOLO26 trainer's Muon group and MuSGD gains: the head's step is the arms' step on a real Muon matrix.
HEAD_GROUP: dict[str, Any] = dict(
    lr=0.01, momentum=0.937, nesterov=True, weight_decay=0.0005, use_muon=True, param_group="muon"
)
OPTIMIZER_KWARGS: dict[str, Any] = {"muon": 0.2, "sgd": 1.0}


def loss_dtype(compute_dtype: torch.dtype) -> torch.dtype:
    """The cross-entropy's dtype: fp32 for half-precision compute (as ``F.cross_entropy`` under AMP), else itself."""
    return torch.promote_types(compute_dtype, torch.float32)


def softcap(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """``cap * tanh(logits / cap)``: bounds the logits to (−cap, cap), near-identity for small ones."""
    return cap * torch.tanh(logits / cap)


def native_loss(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, cap: float
) -> torch.Tensor:
    """The head loss written plainly; autograd materializes every N×V intermediate it needs."""
    logits = softcap(hidden @ weight.to(hidden.dtype).T, cap)
    return F.cross_entropy(logits.to(loss_dtype(hidden.dtype)), targets)


class ChunkedSoftcapCrossEntropy(torch.autograd.Function):
    """The same loss with O(chunk·V) extra memory: stream rows forward, recompute them backward."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, cap: float, chunk: int
    ) -> torch.Tensor:
        compute, accumulate = hidden.dtype, loss_dtype(hidden.dtype)
        head = weight.to(compute)
        rows = hidden.shape[0]
        log_norms = torch.empty(rows, dtype=accumulate, device=hidden.device)
        total = torch.zeros((), dtype=accumulate, device=hidden.device)
        for start in range(0, rows, chunk):
            part = slice(start, start + chunk)
            logits = softcap(hidden[part] @ head.T, cap).to(accumulate)
            log_norms[part] = torch.logsumexp(logits, dim=1)
            picked = logits.gather(1, targets[part, None]).squeeze(1)
            total += (log_norms[part] - picked).sum()
            del logits, picked
        ctx.save_for_backward(hidden, weight, targets, log_norms)
        ctx.cap, ctx.chunk = cap, chunk
        return total / rows

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        hidden, weight, targets, log_norms = ctx.saved_tensors
        cap, chunk = ctx.cap, ctx.chunk
        compute, accumulate = hidden.dtype, loss_dtype(hidden.dtype)
        head = weight.to(compute)
        rows = hidden.shape[0]
        scale = grad_loss.to(accumulate) / rows
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.promote_types(weight.dtype, accumulate))
        for start in range(0, rows, chunk):
            part = slice(start, start + chunk)
            squashed = torch.tanh((hidden[part] @ head.T) / cap)
            # softmax − one-hot, in the loss dtype, from the forward's log-sum-exp (no second reduction).
            grad_logits = (cap * squashed).to(accumulate).sub_(log_norms[part, None]).exp_()
            grad_logits.scatter_add_(1, targets[part, None], torch.full_like(grad_logits[:, :1], -1.0))
            grad_logits.mul_(scale)
            # The native backward's order and dtypes: to compute dtype, ×cap, tanh', ÷cap.
            grad_z = torch.ops.aten.tanh_backward(grad_logits.to(compute).mul_(cap), squashed).div_(cap)
            del grad_logits, squashed
            if grad_hidden is not None:
                grad_hidden[part] = grad_z @ head
            grad_weight.add_(grad_z.T @ hidden[part])
            del grad_z
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None


def chunked_loss(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, cap: float, chunk: int
) -> torch.Tensor:
    """The head loss streamed in chunks of ``chunk`` rows (see ``ChunkedSoftcapCrossEntropy``)."""
    return ChunkedSoftcapCrossEntropy.apply(hidden, weight, targets, cap, chunk)


def head_loss(
    variant: str, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, cap: float, chunk: int
) -> torch.Tensor:
    if variant == "native":
        return native_loss(hidden, weight, targets, cap)
    if variant == "chunked":
        return chunked_loss(hidden, weight, targets, cap, chunk)
    raise ValueError(f"unknown lm head variant '{variant}'; use one of {', '.join(VARIANTS)}")


@dataclass
class LMHead:
    """One seeded lm head workload on a device: the inputs, the fp32 master weight and the variant."""

    variant: str
    hidden: torch.Tensor
    weight: torch.nn.Parameter
    targets: torch.Tensor
    cap: float
    chunk: int

    @classmethod
    def build(
        cls,
        variant: str,
        tokens: int,
        vocab: int,
        dim: int,
        cap: float,
        chunk: int,
        device: str | torch.device,
        seed: int,
        compute_dtype: torch.dtype = torch.bfloat16,
    ) -> LMHead:
        """Hidden states ~ N(0, 1), weight ~ N(0, 1/d) (logits of unit scale), uniform targets; all seeded."""
        generator = torch.Generator(device=device).manual_seed(seed)
        hidden = torch.randn(tokens, dim, generator=generator, device=device).to(compute_dtype)
        weight = torch.randn(vocab, dim, generator=generator, device=device).mul_(dim**-0.5)
        targets = torch.randint(0, vocab, (tokens,), generator=generator, device=device)
        return cls(variant, hidden.requires_grad_(), torch.nn.Parameter(weight), targets, cap, chunk)

    def param_groups(self) -> list[dict[str, Any]]:
        return [{"params": [self.weight], **HEAD_GROUP}]

    def optimizer_kwargs(self) -> dict[str, Any]:
        return dict(OPTIMIZER_KWARGS)

    def forward_backward(self) -> torch.Tensor:
        loss = head_loss(self.variant, self.hidden, self.weight, self.targets, self.cap, self.chunk)
        loss.backward()
        return loss.detach()

    def clear_input_grads(self) -> None:
        self.hidden.grad = None
