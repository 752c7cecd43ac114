"""Batches of matrices, their bf16 stacks (zero-padded where shapes differ), and the core on them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..concurrent import newton_schulz_flops, newton_schulz_lanes
from ..distributed import Partition
from ..newton_schulz import Stack, foreach_mul_

STACK_DTYPE = torch.bfloat16


def _extent(t: torch.Tensor) -> int:
    """Elements from a nonempty view's first to just past its last (torch strides are never negative)."""
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))


@dataclass
class _Member:
    """One matrix of a Newton-Schulz batch and where it lives in the batch's stack."""

    param: torch.Tensor
    group: dict[str, Any]
    order: int  # position in the optimizer's parameter order
    ordered: bool  # scalar momentum, applied in order with its group's SGD (overlapping memory, opaque group)
    small: int  # the matrix's smaller dimension
    large: int  # and its larger one
    scale: float
    nbytes: int  # parameter + gradient bytes: the budget this member brings to a padded stack
    view_stride: tuple[int, ...] = ()  # the parameter-shaped view of its slot in a padded stack
    position: int = -1  # index in the plan's fill order (stack slots, momentum inputs, updates)


@dataclass
class _Batch:
    """Matrices orthogonalized by one Newton-Schulz chain; `kind` is "single", "uniform" or "padded"."""

    kind: str
    device: torch.device
    dtype: torch.dtype
    members: list[_Member]
    stack_shape: tuple[int, ...] = ()

    @property
    def flops(self) -> int:
        """Newton-Schulz arithmetic of one step as this batch runs it (padding included)."""
        if self.kind == "padded":
            return len(self.members) * newton_schulz_flops(*sorted(self.stack_shape[1:]))
        return sum(newton_schulz_flops(m.small, m.large) for m in self.members)


@dataclass
class _BatchStack:
    """A batch's stack memory, allocated once, and the views a step reads and writes."""

    batch: _Batch
    stack: Stack | None  # the part this process orthogonalizes
    slots: list[torch.Tensor]  # each member's parameter-shaped view
    scale_targets: list[torch.Tensor]  # what the gains multiply, by these values
    scale_values: list[float]
    full: torch.Tensor | None  # the whole contiguous tensor, on one rank
    zeroed: list[torch.Tensor]  # what a step zeroes first (padded stacks)
    here: list[bool]  # whether each member is orthogonalized here
    outputs: list[torch.Tensor] = field(default_factory=list)  # each update: its slot, or widened in scratch
    widen: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])  # (scratch, slot) runs copied to widen


@dataclass
class _Fill:
    """The clean members' slots and their inputs in scratch, by runs: the core graph's key."""

    slots: list[torch.Tensor]
    sources: list[torch.Tensor]


def _steps_alike(columns: list[list[torch.Tensor]], i: int, steps: list[int] | None) -> list[int] | None:
    """Per column, the storage step from entry i-1 to i where i can join i-1's run (never overlapping)."""
    found = []
    for j, column in enumerate(columns):
        previous, view = column[i - 1], column[i]
        step = view.storage_offset() - previous.storage_offset()
        if (
            view.shape != previous.shape
            or view.stride() != previous.stride()
            or view.dtype != previous.dtype
            or view.numel() == 0
            or view.untyped_storage().data_ptr() != previous.untyped_storage().data_ptr()
            or (step < _extent(view) if steps is None else step != steps[j])
        ):
            return None
        found.append(step)
    return found


def _runs(columns: list[list[torch.Tensor]], keys: list[Any] | None = None) -> tuple[list[list], list]:
    """Consecutive entries (`columns[j][i]`) whose views step alike, one view per column; each run's key."""
    merged: list[list[torch.Tensor]] = [[] for _ in columns]
    run_keys: list[Any] = []
    count = len(columns[0]) if columns else 0
    start = 0
    while start < count:
        stop, steps = start + 1, None
        while stop < count and (keys is None or keys[stop] == keys[start]):
            found = _steps_alike(columns, stop, steps)
            if found is None:
                break
            stop, steps = stop + 1, found
        for j, (column, out) in enumerate(zip(columns, merged, strict=True)):
            first = column[start]
            if steps is None:
                out.append(first)
            else:
                shape, strides = (stop - start, *first.shape), (steps[j], *first.stride())
                out.append(first.as_strided(shape, strides, first.storage_offset()))
        run_keys.append(None if keys is None else keys[start])
        start = stop
    return merged, run_keys


def _matrix_shape(batch: _Batch) -> tuple[int, int]:
    """(rows, cols) of one slot of the batch's stack (wide for a padded batch)."""
    if batch.kind == "padded":
        return batch.stack_shape[1], batch.stack_shape[2]
    rows = batch.members[0].param.shape[0]
    return rows, batch.members[0].param.numel() // rows


def _member_view(storage: torch.Tensor, member: _Member, batch: _Batch, base: int) -> torch.Tensor:
    """`member` as a parameter-shaped view of its matrix at element `base` of `storage`."""
    shape = member.param.shape
    row_major = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
    return storage.as_strided(shape, member.view_stride if batch.kind == "padded" else row_major, base)


def _scaled(entry_slots: list[torch.Tensor], batch: _Batch, whole: list[torch.Tensor]) -> tuple[list, list]:
    """What the gains multiply: padded members' crops (by runs), or an exact-shape batch's whole memory."""
    if batch.kind == "padded":
        scaled = [(slot, m.scale) for slot, m in zip(entry_slots, batch.members, strict=True) if m.scale != 1]
        (targets,), values = _runs([[slot for slot, _ in scaled]], [scale for _, scale in scaled])
        return targets, values
    scale = batch.members[0].scale
    return (list(whole), [scale] * len(whole)) if scale != 1 else ([], [])


def _allocate_stack(batch: _Batch, dtype: torch.dtype = STACK_DTYPE) -> _BatchStack:
    """The stack of `batch` in `dtype` (zeros where padded) and its views."""
    members = batch.members
    rows, cols = _matrix_shape(batch)
    shape = (rows, cols) if batch.kind == "single" else (len(members), rows, cols)
    tensor = (torch.zeros if batch.kind == "padded" else torch.empty)(shape, dtype=dtype, device=batch.device)
    flat = tensor.view(-1)
    slots = [_member_view(flat, m, batch, i * rows * cols) for i, m in enumerate(members)]
    targets, values = _scaled(slots, batch, [tensor])
    zeroed = [tensor] if batch.kind == "padded" else []
    here = [True] * len(members)
    return _BatchStack(batch, Stack.of(tensor), slots, targets, values, tensor, zeroed, here, list(slots))


def _allocate_shares(
    batches: list[_Batch], partition: Partition, dtype: torch.dtype = STACK_DTYPE
) -> tuple[list[_BatchStack], torch.Tensor]:
    """Every batch's stack as views of one buffer: per rank, its chunk of each batch and its lone matrices."""
    splittable = [b for b in batches if b.kind != "single"]
    lone = [b for b in batches if b.kind == "single"]
    per_rank = partition.per_rank
    buffer = torch.zeros(partition.world * per_rank, dtype=dtype, device=batches[0].device)
    entries: dict[int, _BatchStack] = {}
    for batch, chunk, offset in zip(splittable, partition.chunks, partition.offsets, strict=True):
        rows, cols = _matrix_shape(batch)
        size = rows * cols
        blocks = [
            buffer[r * per_rank + offset :][: chunk * size].view(chunk, rows, cols)
            for r in range(partition.world)
        ]
        slots = [
            _member_view(buffer, m, batch, (i // chunk) * per_rank + offset + (i % chunk) * size)
            for i, m in enumerate(batch.members)
        ]
        targets, values = _scaled(slots, batch, blocks)
        mine = blocks[partition.rank]
        zeroed = [mine] if batch.kind == "padded" else []
        here = [i // chunk == partition.rank for i in range(len(batch.members))]
        entries[id(batch)] = _BatchStack(
            batch, Stack.of(mine), slots, targets, values, None, zeroed, here, list(slots)
        )
    for batch, owner, offset in zip(lone, partition.owners, partition.whole_offsets, strict=True):
        rows, cols = _matrix_shape(batch)
        matrix = buffer[owner * per_rank + offset :][: rows * cols].view(rows, cols)
        slots = [matrix.view(batch.members[0].param.shape)]
        targets, values = _scaled(slots, batch, [matrix])
        mine = owner == partition.rank
        stack = Stack.of(matrix) if mine else None
        entries[id(batch)] = _BatchStack(batch, stack, slots, targets, values, None, [], [mine], list(slots))
    return [entries[id(batch)] for batch in batches], buffer


def _split_by_budget(members: list[_Member], element_size: int) -> list[list[_Member]]:
    """Cut members by decreasing width into runs whose padded stack fits their own param+grad bytes."""
    runs: list[list[_Member]] = []
    for member in members:
        run = runs[-1] if runs else None
        if run is not None:
            stack_bytes = (len(run) + 1) * member.small * run[0].large * element_size
            if stack_bytes <= sum(m.nbytes for m in run) + member.nbytes:
                run.append(member)
                continue
        runs.append([member])
    return runs


def _split_by_cost(members: list[_Member], element_size: int, chain_flops: float) -> list[list[_Member]]:
    """Cut members into the cheapest runs within budget: `chain_flops` a run plus its padded arithmetic."""
    if not (math.isfinite(chain_flops) and chain_flops >= 0):
        raise ValueError(f"pad_chain_flops must be a finite number ≥ 0 (or None), got {chain_flops!r}")
    count = len(members)
    best: list[float] = [0.0] + [math.inf] * count
    cut = [0] * (count + 1)
    for end in range(1, count + 1):
        budget = 0
        for start in range(end - 1, -1, -1):
            budget += members[start].nbytes
            small, large = members[start].small, members[start].large
            if (end - start) * small * large * element_size > budget:
                continue
            cost = best[start] + chain_flops + (end - start) * newton_schulz_flops(small, large)
            if cost < best[end]:
                best[end], cut[end] = cost, start
    runs: list[list[_Member]] = []
    end = count
    while end > 0:
        runs.append(members[cut[end] : end])
        end = cut[end]
    return runs[::-1]


def _make_batch(members: list[_Member]) -> _Batch:
    """Lay out one batch: its kind, the stack shape and each member's slot."""
    first = members[0].param
    device, dtype = first.device, first.dtype
    members = sorted(members, key=lambda m: (m.ordered, m.order))
    if len(members) == 1:
        return _Batch("single", device, dtype, members)
    if all(m.param.shape == first.shape and m.param.stride() == first.stride() for m in members):
        rows, cols = first.shape[0], math.prod(first.shape[1:])
        return _Batch("uniform", device, dtype, members, stack_shape=(len(members), rows, cols))
    # Members of one shape side by side, so one copy fills or widens each run of slots.
    members.sort(key=lambda m: (tuple(m.param.shape), m.param.stride(), m.order))
    small = members[0].small
    large = max(m.large for m in members)
    batch = _Batch("padded", device, dtype, members, stack_shape=(len(members), small, large))
    for member in members:
        # A slot holds the matrix wide, zero columns on the right; a tall parameter reads along its columns.
        row_stride, col_stride = (large, 1) if member.param.shape[0] == member.small else (1, large)
        column_dims = member.param.shape[1:]  # (cols,) or (in, kh, kw): row-major within a matrix row
        member.view_stride = (
            row_stride,
            *(col_stride * math.prod(column_dims[i + 1 :]) for i in range(len(column_dims))),
        )
    return batch


def _fill_stacks(zeroed: list[torch.Tensor], fill: _Fill) -> None:
    """Zero the padded stacks, then copy the clean members' inputs into their slots (rounded to bf16)."""
    if zeroed:
        torch._foreach_zero_(zeroed)
    if fill.slots:
        torch._foreach_copy_(fill.slots, fill.sources)


def _newton_schulz_here(stacks: list[_BatchStack], lanes: int = 1) -> list[torch.Tensor]:
    """Orthogonalize in place the stacks this process owns, per device, in up to `lanes` lanes."""
    devices: dict[torch.device, list[Stack]] = {}
    for entry in stacks:
        if entry.stack is not None:
            devices.setdefault(entry.batch.device, []).append(entry.stack)
    for device_stacks in devices.values():
        newton_schulz_lanes(device_stacks, lanes)
    return []


def _finish(stacks: list[_BatchStack]) -> list[list[torch.Tensor]]:
    """Gains in place (in bf16, as the baseline), then widen into scratch; each batch's updates."""
    targets = [t for entry in stacks for t in entry.scale_targets]
    foreach_mul_(targets, [v for entry in stacks for v in entry.scale_values])
    into = [t for entry in stacks for t in entry.widen[0]]
    out_of = [t for entry in stacks for t in entry.widen[1]]
    if into:
        torch._foreach_copy_(into, out_of)
    return [entry.outputs for entry in stacks]


def _orthogonalize_stacks(stacks: list[_BatchStack], lanes: int = 1) -> list[list[torch.Tensor]]:
    """The core on one rank: filled stacks in, each member's orthogonalized, scaled update out."""
    _newton_schulz_here(stacks, lanes)
    return _finish(stacks)
