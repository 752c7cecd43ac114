"""How many aten operations a call dispatches, and how many new tensors they return: host work, counted."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


@dataclass(frozen=True)
class DispatchCount:
    """Aten operations one call dispatched: the total and per operation; tensors allocated, likewise."""

    total: int
    by_operation: dict[str, int]
    allocations: int = 0
    allocated_by: dict[str, int] | None = None

    def most_common(self, n: int = 10) -> list[tuple[str, int]]:
        return Counter(self.by_operation).most_common(n)


class _CountingMode(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.allocated: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        self.counts[name] += 1
        result = func(*args, **(kwargs or {}))
        inputs = {_storage(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        fresh = sum(isinstance(t, torch.Tensor) and _storage(t) not in inputs for t in tree_leaves(result))
        if fresh:
            self.allocated[name] += fresh
        return result


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def count_dispatched_ops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> DispatchCount:
    """Call `fn(*args, **kwargs)` once and count the aten operations it dispatched (its result is dropped)."""
    mode = _CountingMode()
    with mode:
        fn(*args, **kwargs)
    counts, allocated = mode.counts, mode.allocated
    return DispatchCount(sum(counts.values()), dict(counts), sum(allocated.values()), dict(allocated))
