"""Which tensors share memory: spans of bytes, compared by address (DLPack views share bytes, not storage)."""

from __future__ import annotations

import itertools
import operator
from typing import Any

import torch

_OPAQUE = -1  # the address of a tensor that refuses data_ptr()
_DATA_PTR = torch.Tensor.data_ptr

Span = tuple[str, int, int, Any]  # (device, start, end, owner)


def _address(t: torch.Tensor) -> int:
    """A tensor's data_ptr, or _OPAQUE where it refuses inspection."""
    try:
        return t.data_ptr()
    except Exception:
        return _OPAQUE


def _addresses(tensors: list[torch.Tensor]) -> tuple[int, ...]:
    """Every tensor's data_ptr in one C-level pass; _OPAQUE for those that refuse."""
    try:
        return tuple(map(_DATA_PTR, tensors))
    except Exception:
        return tuple(map(_address, tensors))


def _refuses_inspection(t: torch.Tensor) -> bool:
    """Whether a tensor subclass refuses storage inspection (data_ptr or untyped_storage raise)."""
    try:
        t.untyped_storage()
        t.data_ptr()
    except Exception:
        return True
    return False


def _extent(t: torch.Tensor) -> int:
    """Elements from a nonempty view's first to just past its last (torch strides are never negative)."""
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))


def _memory_span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes [start, end) an inspectable tensor can reach; empty for an empty tensor."""
    start = t.data_ptr()
    return start, start + (_extent(t) * t.element_size() if t.numel() else 0)


def _overlapping(spans: list[Span]) -> set[Any]:
    """Owners of spans that share at least one byte with another span."""
    runs: list[list[Any]] = []  # owners of spans that chain into one stretch of bytes
    run_device, run_end = None, 0
    for device, start, end, owner in sorted((s for s in spans if s[2] > s[1]), key=lambda s: (s[0], s[1])):
        if runs and device == run_device and start < run_end:
            runs[-1].append(owner)
            run_end = max(run_end, end)
        else:
            runs.append([owner])
            run_device, run_end = device, end
    return {owner for run in runs if len(run) > 1 for owner in run}


def _spans_of(
    tracked: list[tuple[dict[str, Any], torch.Tensor]], state: dict[torch.Tensor, dict[str, Any]], grads: bool
) -> tuple[list[Span], set[int]]:
    """Spans of each parameter, its state and its gradient, owned by (id, role); and whose tensors refuse."""
    spans, refusing = [], set()
    for _, p in tracked:
        device = str(p.device)
        tensors = [("param", p), *([("grad", p.grad)] if grads else []), *state[p].items()]
        for role, tensor in tensors:
            if not isinstance(tensor, torch.Tensor):
                continue
            if _refuses_inspection(tensor):
                if role != "param":
                    refusing.add(id(p))
                continue
            spans.append((device, *_memory_span(tensor), (id(p), role)))
    return spans, refusing


def _span_index(spans: list[Span]) -> dict[str, tuple[list[int], list[int]]]:
    """Per device, the span starts in order and the running maximum of their ends."""
    index: dict[str, tuple[list[int], list[int]]] = {}
    for device, start, end, _ in sorted(spans, key=lambda s: (s[0], s[1])):
        if end > start:
            starts, reach = index.setdefault(device, ([], []))
            starts.append(start)
            reach.append(max(end, reach[-1]) if reach else end)
    return index


def _union_ends(starts: list[int], reach: list[int]) -> dict[int, int]:
    """One device's `_span_index` as the union of its spans: each disjoint part's end, by its start."""
    ends: dict[int, int] = {}
    last = None
    for start, end in zip(starts, reach, strict=True):  # reach is the running maximum of the ends
        if last is not None and ends[last] >= start:
            ends[last] = end
        else:
            ends[start] = end
            last = start
    return ends


def _spans_meet(starts: list[int], ends: list[int], indexed_ends: dict[int, int]) -> bool:
    """Whether a nonempty span [start, end) shares a byte with an indexed part (`_union_ends`) or a span."""
    ends_by_start = indexed_ends.copy()
    ends_by_start.update(zip(starts, ends, strict=True))
    if len(ends_by_start) != len(indexed_ends) + len(starts):
        return True  # two nonempty spans start at one byte
    ordered = sorted(ends_by_start)
    return any(map(operator.lt, itertools.islice(ordered, 1, None), map(ends_by_start.__getitem__, ordered)))
