"""How many aten operations a call dispatches: the host work of an eager step, counted instead of timed.

A step that is bound by host dispatch costs about one fixed host overhead per operation it dispatches, so the
count is a device-independent measure of that cost (it can be taken on the CPU). Operations are counted where
Python sees them (a `TorchDispatchMode`): a foreach operation over a hundred tensors counts once, and what an
operation runs internally (a CPU foreach fallback looping over its tensors, a composite's inner kernels) is
not counted again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


@dataclass(frozen=True)
class DispatchCount:
    """Aten operations one call dispatched: the total, and how many of each operation (by overload packet)."""

    total: int
    by_operation: dict[str, int]

    def most_common(self, n: int = 10) -> list[tuple[str, int]]:
        return Counter(self.by_operation).most_common(n)


class _CountingMode(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def count_dispatched_ops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> DispatchCount:
    """Call `fn(*args, **kwargs)` once and count the aten operations it dispatched (its result is dropped)."""
    mode = _CountingMode()
    with mode:
        fn(*args, **kwargs)
    return DispatchCount(sum(mode.counts.values()), dict(mode.counts))
