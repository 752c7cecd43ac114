"""Where a plan's memory lives: the stacks (or each rank's share), scratch, SGD buffers, the fill order."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..distributed import Partition, agreed
from .plan import _MuonGroup, _Plan
from .stacks import (
    STACK_DTYPE,
    _allocate_shares,
    _allocate_stack,
    _BatchStack,
    _Fill,
    _matrix_shape,
    _Member,
    _runs,
)

_WIDENS_EXACTLY = (torch.float32, torch.float64, STACK_DTYPE)  # parameter dtypes a bf16 update widens into


def _lay_out(plan: _Plan, state: dict[torch.Tensor, dict[str, Any]], world: int, rank: int) -> None:
    """Allocate the stacks (shared out over ranks where there are several) and scratch; fix the fill order.

    The fill order: each group's clean members (those widened into scratch first), then the ordered ones.
    """
    plan.stacks = _share_out(plan, world, rank) if world > 1 and plan.batches else []
    if not plan.stacks:
        plan.stacks = [_allocate_stack(batch) for batch in plan.batches]
    slot_of, here = {}, set()
    for entry in plan.stacks:
        for member, slot, mine in zip(entry.batch.members, entry.slots, entry.here, strict=True):
            slot_of[id(member)] = slot
            if mine:
                here.add(id(member))
    members = [m for batch in plan.batches for m in batch.members]
    widened = {id(m) for m in members if not m.ordered and m.param.dtype in _WIDENS_EXACTLY}
    _allocate_scratch(plan, widened)
    by_group: dict[int, list[_Member]] = {}
    for member in members:
        if not member.ordered:
            by_group.setdefault(id(member.group), []).append(member)
    for clean in by_group.values():
        clean.sort(key=lambda m: (id(m) not in widened, m.order))
        start = len(plan.fill)
        plan.fill += clean
        params = [m.param for m in clean]
        buffers = [state[p]["momentum_buffer"] for p in params]
        fast = sum(id(m) in widened for m in clean)
        mine = [i for i, m in enumerate(clean) if id(m) in here]
        scratch = [plan.scratch_of[id(p)] for p in params]
        plan.muon_groups.append(
            _MuonGroup(clean[0].group, start, len(plan.fill), fast, params, buffers, mine, scratch)
        )
    plan.ordered = sorted((m for m in members if m.ordered), key=lambda m: m.order)
    plan.ordered_here = [id(m) in here for m in plan.ordered]
    plan.fill += plan.ordered
    for position, member in enumerate(plan.fill):
        member.position = position
    copies = [
        (slot, plan.scratch_of[id(member.param)])
        for entry in plan.stacks
        for member, slot, mine in zip(entry.batch.members, entry.slots, entry.here, strict=True)
        if mine and not member.ordered
    ]
    (slots, sources), _ = _runs([[slot for slot, _ in copies], [source for _, source in copies]])
    plan.core_fill = _Fill(slots, sources)
    plan.ordered_slots = [slot_of[id(m)] for m in plan.ordered if id(m) in here]
    plan.devices = {entry.batch.device for entry in plan.stacks}
    plan.device = plan.stacks[0].batch.device if plan.stacks else None
    plan.zeroed = [t for entry in plan.stacks for t in entry.zeroed]


def _dense_strides(p: torch.Tensor) -> tuple[int, ...]:
    """The strides of a dense tensor laid out like `p` (p's own where p is dense)."""
    return torch.empty_like(p, device="meta").stride()


def _allocate_scratch(plan: _Plan, widened: set[int]) -> None:
    """A view of scratch like each clean parameter (one tensor per device and dtype); where each update ends.

    Members in `widened` end in their scratch view, others in their slot. Members sit in scratch in slot
    order, so one copy fills or widens each run of same-shape neighbours. Scratch is left uninitialized.
    """
    clean = [p for group_plan in plan.groups for bucket in group_plan.buckets for p in bucket.params]
    clean_ids = {id(p) for p in clean}
    # So each SGD run tiles one stretch: groups without Muon first, then Muon parameters in stack order.
    in_stacks = [m.param for entry in plan.stacks for m in entry.batch.members if id(m.param) in clean_ids]
    placed = {id(p) for p in in_stacks}
    muon = {id(p) for gp in plan.groups if gp.group["use_muon"] for b in gp.buckets for p in b.params}
    order = [p for p in clean if id(p) not in muon]
    order += in_stacks + [p for p in clean if id(p) in muon and id(p) not in placed]
    sizes: dict[tuple[torch.device, torch.dtype], int] = {}
    offsets = []
    for p in order:
        key = (p.device, p.dtype)
        offsets.append(sizes.get(key, 0))
        sizes[key] = offsets[-1] + p.numel()
    flats = {key: torch.empty(size, dtype=key[1], device=key[0]) for key, size in sizes.items()}
    plan.scratch = list(flats.values())
    for p, offset in zip(order, offsets, strict=True):
        plan.scratch_of[id(p)] = flats[(p.device, p.dtype)].as_strided(p.shape, _dense_strides(p), offset)
    for entry in plan.stacks:
        members = entry.batch.members
        entry.outputs = [
            plan.scratch_of[id(m.param)] if id(m) in widened else slot
            for m, slot in zip(members, entry.slots, strict=True)
        ]
        pairs = [(out, slot) for out, slot in zip(entry.outputs, entry.slots, strict=True) if out is not slot]
        (into, out_of), _ = _runs([[out for out, _ in pairs], [slot for _, slot in pairs]])
        entry.widen = (into, out_of)


def _mirror_sgd_buffers(plan: _Plan, state: dict[torch.Tensor, dict[str, Any]]) -> None:
    """Move the clean SGD buffers into one tensor per device and dtype, each at its scratch view's offset.

    An SGD run that tiles one stretch then steps its buffers with one operation, not a foreach list.
    The state holds the new views, so a state_dict still gives one tensor per parameter.
    """
    scratch_flats = {(t.device, t.dtype): t for t in plan.scratch}
    buffer_flats = {key: torch.empty_like(flat) for key, flat in scratch_flats.items()}
    for group_plan in plan.groups:
        key = "momentum_buffer_SGD" if group_plan.group["use_muon"] else "momentum_buffer"
        for bucket in group_plan.buckets:
            for i, p in enumerate(bucket.params):
                mine = plan.scratch_of[id(p)]
                view = buffer_flats[(p.device, p.dtype)].as_strided(
                    mine.shape, mine.stride(), mine.storage_offset()
                )
                view.copy_(bucket.buffers[i])
                state[p][key] = bucket.buffers[i] = view
    plan.sgd_flats = {key: (buffer_flats[key], scratch_flats[key]) for key in scratch_flats}


def _share_out(plan: _Plan, world: int, rank: int) -> list[_BatchStack]:
    """The stacks as shares of one buffer per rank; [] where they cannot be, the reason noted."""
    devices = {batch.device for batch in plan.batches}
    if len(devices) > 1:
        plan.sharing_note = "Muon matrices on several devices"
        return []
    splittable = [b for b in plan.batches if b.kind != "single"]
    lone = [b for b in plan.batches if b.kind == "single"]
    partition = Partition.of(
        [len(b.members) for b in splittable],
        [math.prod(_matrix_shape(b)) for b in splittable],
        [math.prod(_matrix_shape(b)) for b in lone],
        world,
        rank,
    )
    description = tuple((b.kind, b.stack_shape, len(b.members), str(b.dtype)) for b in plan.batches)
    if not agreed(partition, description):
        plan.sharing_note = "the ranks' parameter sets differ"
        return []
    plan.partition = partition
    stacks, plan.buffer = _allocate_shares(plan.batches, partition)
    return stacks
