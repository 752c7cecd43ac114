"""What the optimizers' shared helpers promise: closure losses, guarded classes, memory spans and overlaps."""

from __future__ import annotations

import itertools

import pytest
import torch

from optimizers import BatchedMuSGD, MuSGD
from optimizers.batched import batched_on_cpu
from optimizers.batched.planning import _memory_span, _overlapping


@pytest.mark.parametrize("optimizer_class", [MuSGD, BatchedMuSGD])
def test_a_step_returns_the_closure_loss_computed_with_gradients_on(optimizer_class: type) -> None:
    weight = torch.nn.Parameter(torch.randn(4, 6, generator=torch.Generator().manual_seed(0)))
    optimizer = optimizer_class([{"params": [weight], "use_muon": True}], lr=0.1, momentum=0.9)
    seen = []

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = (weight**2).sum()
        seen.append(torch.is_grad_enabled())
        loss.backward()
        return loss

    with batched_on_cpu(), torch.no_grad():
        loss = optimizer.step(closure)
    assert seen == [True]
    assert loss is not None and loss.requires_grad
    assert optimizer.step() is None


def test_with_pad_guard_gives_one_named_subclass_per_guard() -> None:
    zero, any_width = BatchedMuSGD.with_pad_guard(0), BatchedMuSGD.with_pad_guard(None)
    assert BatchedMuSGD.with_pad_guard(0) is zero and zero is not any_width
    assert (zero.pad_guard, any_width.pad_guard) == (0, None)
    assert f"{zero.__module__}.{zero.__qualname__}" == "optimizers.batched.BatchedMuSGD_pad_0"
    assert any_width.__qualname__ == "BatchedMuSGD_pad_any" and issubclass(any_width, BatchedMuSGD)


def _reached_bytes(t: torch.Tensor) -> set[int]:
    """Every byte address a tensor's elements occupy, element by element."""
    size = t.element_size()
    starts = {
        t.data_ptr() + size * sum(i * s for i, s in zip(index, t.stride(), strict=True))
        for index in itertools.product(*(range(n) for n in t.shape))
    }
    return {start + b for start in starts for b in range(size)}


@pytest.mark.parametrize(
    "make",
    [
        lambda base: base,
        lambda base: base.mT,
        lambda base: base[:, ::3],
        lambda base: base[1:3, 2:5],
        lambda base: base.as_strided((2, 3), (0, 2)),
        lambda base: base[:0],
        lambda base: base.to(torch.bfloat16).view(4, 12)[:, 1::5],
    ],
    ids=["contiguous", "transposed", "strided", "window", "broadcast", "empty", "bf16-strided"],
)
def test_a_memory_span_runs_from_the_first_byte_to_past_the_last(make) -> None:
    t = make(torch.arange(48.0).view(6, 8))
    start, end = _memory_span(t)
    reached = _reached_bytes(t)
    assert start == t.data_ptr()
    assert (start, end) == ((min(reached), max(reached) + 1) if reached else (start, start))


def test_overlapping_flags_every_member_of_a_chain_and_nothing_apart() -> None:
    spans = [
        ("cuda:0", 0, 10, "a"),
        ("cuda:0", 5, 20, "b"),
        ("cuda:0", 19, 30, "c"),  # meets b only: the chain a-b-c is one run
        ("cuda:0", 30, 40, "d"),  # touches c without sharing a byte
        ("cuda:1", 0, 40, "e"),  # another device's addresses never meet cuda:0's
        ("cuda:0", 50, 50, "f"),  # empty
        ("cuda:0", 45, 60, "g"),
        ("cuda:0", 59, 61, "h"),
    ]
    assert _overlapping(spans) == {"a", "b", "c", "g", "h"}
    assert _overlapping(spans[3:6]) == set()
