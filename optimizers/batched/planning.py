"""The plan of a parameter set: which matrices share a stack, where its memory lives, what keeps order.

Which tensors share memory is read from spans of bytes, compared by address: DLPack views share bytes,
not storage."""

from __future__ import annotations

import bisect
import contextlib
import functools
import itertools
import math
import operator
from collections.abc import Iterator
from typing import Any

import torch

from ..distributed import Partition, agreed, world_and_rank
from ..newton_schulz import muon_scale
from .plan import _Bucket, _GroupPlan, _MuonGroup, _Plan
from .stacks import (
    STACK_DTYPE,
    _allocate_shares,
    _allocate_stack,
    _BatchStack,
    _extent,
    _Fill,
    _make_batch,
    _matrix_shape,
    _Member,
    _runs,
    _split_by_budget,
    _split_by_cost,
)

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


_GRAD = operator.attrgetter("grad")
_IS_NOT_NONE = functools.partial(operator.is_not, None)
_IS_CONTIGUOUS = torch.Tensor.is_contiguous
_NBYTES = operator.attrgetter("nbytes")
_cpu_batched = False
_WIDENS_EXACTLY = (torch.float32, torch.float64, STACK_DTYPE)  # parameter dtypes a bf16 update widens into


@contextlib.contextmanager
def batched_on_cpu(enabled: bool = True) -> Iterator[None]:
    """Within the block, CPU parameters take the batched path, as CUDA ones do; restored on exit."""
    global _cpu_batched
    previous, _cpu_batched = _cpu_batched, enabled
    try:
        yield
    finally:
        _cpu_batched = previous


def batches_on(device: torch.device) -> bool:
    """Whether tensors on `device` take the batched path now: CUDA always, the CPU within `batched_on_cpu`."""
    return device.type == "cuda" or (device.type == "cpu" and _cpu_batched)


def _state_is_usual(p: torch.Tensor, state: dict[str, Any], keys: tuple[str, ...]) -> bool:
    """Buffers as the baseline would create them: plain tensors of the parameter's shape, dtype and device."""
    usual = (p.shape, p.dtype, p.device)
    return all(
        type(b) is torch.Tensor and (b.shape, b.dtype, b.device) == usual for b in map(state.get, keys)
    )


def _build_plan(
    param_groups: list[dict[str, Any]],
    states: Any,
    signature: tuple[Any, ...],
    grad_addresses: tuple[Any, ...],
    pad_guard: int | None,
    pad_chain_flops: float | None,
) -> _Plan:
    """Sort every parameter with a gradient into a batch and a foreach bucket, or the in-order list."""
    # 1. What the batched path may take: on a batching device, usual state, Muon matrices. New state is zeros.
    tracked: list[tuple[dict[str, Any], torch.Tensor]] = []
    whole_step: set[int] = set()  # ids taking the baseline's per-parameter step
    opaque_groups: set[int] = set()
    for group in param_groups:
        keys = ("momentum_buffer", "momentum_buffer_SGD") if group["use_muon"] else ("momentum_buffer",)
        for p in group["params"]:
            if p.grad is None or not batches_on(p.device):
                if p.grad is not None:
                    whole_step.add(id(p))
                continue
            tracked.append((group, p))
            state = states[p]
            if (state and not _state_is_usual(p, state, keys)) or (
                group["use_muon"] and p.ndim not in (2, 4)
            ):
                whole_step.add(id(p))  # the baseline step does (or refuses) what the user expects
            elif not state:
                for key in keys:
                    state[key] = torch.zeros_like(p)
            if _refuses_inspection(p):
                opaque_groups.add(id(group))

    # 2. A parameter overlapping anything keeps exact shapes and its order.
    #    A gradient or buffer sharing memory sends its parameter to the whole per-parameter step.
    spans, refusing = _spans_of(tracked, states, grads=True)
    whole_step |= refusing
    flagged = _overlapping(spans)
    grads_overlap = any(role == "grad" for _, role in flagged)
    overlapping_params = {pid for pid, role in flagged if role == "param"}
    whole_step |= {pid for pid, role in flagged if role != "param"}

    # 3. Batches across groups: padded ones share the smaller dimension (to the guard), exact ones the layout.
    orders = {id(p): order for order, p in enumerate(p for g in param_groups for p in g["params"])}
    padded: dict[tuple[Any, ...], list[_Member]] = {}
    exact: dict[tuple[Any, ...], list[_Member]] = {}
    clean: set[int] = set()
    for group, p in tracked:
        if id(p) in whole_step:
            continue
        ordered = id(group) in opaque_groups or id(p) in overlapping_params
        if not ordered:
            clean.add(id(p))
        if not group["use_muon"]:
            continue
        small, large = sorted((p.shape[0], math.prod(p.shape[1:])))
        nbytes = 2 * p.numel() * p.element_size()
        member = _Member(p, group, orders[id(p)], ordered, small, large, muon_scale(p.shape), nbytes)
        if not ordered and (pad_guard is None or member.small <= pad_guard):
            padded.setdefault((p.device, p.dtype, member.small), []).append(member)
        else:
            exact.setdefault((p.device, p.dtype, tuple(p.shape), p.stride()), []).append(member)
    batches = [_make_batch(members) for members in exact.values()]
    element_size = torch.empty((), dtype=STACK_DTYPE).element_size()
    for members in padded.values():
        members.sort(key=lambda m: (-m.large, m.order))
        if pad_chain_flops is None:
            runs = _split_by_budget(members, element_size)
        else:
            runs = _split_by_cost(members, element_size, pad_chain_flops)
        batches += [_make_batch(run) for run in runs]

    # 4. Per group: SGD buckets of clean parameters by (device, dtype); everything else in order.
    group_plans = []
    for group in param_groups:
        sgd_key = "momentum_buffer_SGD" if group["use_muon"] else "momentum_buffer"
        buckets: dict[tuple[torch.device, torch.dtype], _Bucket] = {}
        in_order = []
        for p in group["params"]:
            if p.grad is None:
                continue
            if id(p) in clean:
                bucket = buckets.setdefault((p.device, p.dtype), _Bucket([], []))
                bucket.params.append(p)
                bucket.buffers.append(states[p][sgd_key])
            else:
                in_order.append(p)
        group_plans.append(_GroupPlan(group, list(buckets.values()), in_order))
    plan = _Plan(signature, grad_addresses, grads_overlap, {}, batches, group_plans, positions=orders)
    _lay_out(plan, states, *world_and_rank())  # 5. the stacks (shared out over ranks), the fill order
    _mirror_sgd_buffers(plan, states)  # 6. the SGD buffers laid out like scratch (new memory)

    # 7. What a moved gradient is checked against: the parameters and their state as now held.
    plan.span_index = _span_index(_spans_of(tracked, states, grads=False)[0])
    plan.grad_checks = [(p, str(p.device)) for g in param_groups for p in g["params"] if batches_on(p.device)]
    check_devices = {device for _, device in plan.grad_checks}
    if len(check_devices) == 1:
        starts, reach = plan.span_index.get(check_devices.pop(), ([], []))
        plan.grad_check_params = [p for p, _ in plan.grad_checks]
        plan.grad_check_all = len(plan.grad_check_params) == sum(len(g["params"]) for g in param_groups)
        plan.grad_check_ends = _union_ends(starts, reach)
    return plan


def _grads_overlap(plan: _Plan, step_grads: list[Any], grad_addresses: tuple[Any, ...]) -> bool:
    """Whether any moved gradient now shares memory with a tracked parameter, buffer or gradient."""
    if plan.grad_check_ends is not None:
        try:
            if plan.grad_check_all:  # every parameter, in order: the addresses the signature read
                grads = list(filter(_IS_NOT_NONE, step_grads))
                starts = list(itertools.chain.from_iterable(grad_addresses))
            else:
                grads = list(filter(_IS_NOT_NONE, map(_GRAD, plan.grad_check_params)))
                starts = list(_addresses(grads))
            if all(map(_IS_CONTIGUOUS, grads)):
                if _OPAQUE in starts:
                    return True
                sizes = list(map(_NBYTES, grads))
                if 0 not in sizes:
                    return _spans_meet(starts, list(map(operator.add, starts, sizes)), plan.grad_check_ends)
        except Exception:  # a tensor that refuses inspection: the per-gradient check says what it is
            pass
    return _grads_overlap_each(plan)


def _grads_overlap_each(plan: _Plan) -> bool:
    """`_grads_overlap` one gradient at a time, for any layout and any mix of devices."""
    grad_spans = []
    for p, device in plan.grad_checks:
        grad = p.grad
        if grad is None:
            continue
        if _address(grad) == _OPAQUE:
            return True
        start, end = _memory_span(grad)
        starts, reach = plan.span_index.get(device, ((), ()))
        below = bisect.bisect_left(starts, end)  # spans starting before this gradient ends...
        if below and reach[below - 1] > start:  # ...of which one ends after it starts
            return True
        grad_spans.append((device, start, end, None))
    return len(_overlapping(grad_spans)) > 0


def _lay_out(plan: _Plan, state: dict[torch.Tensor, dict[str, Any]], world: int, rank: int) -> None:
    """Allocate the stacks (shared out over ranks) and scratch; fill order: clean members, then ordered."""
    plan.stacks = _share_out(plan, world, rank) if world > 1 and plan.batches else []
    if not plan.stacks:
        plan.stacks = [_allocate_stack(batch) for batch in plan.batches]
    slots_here = [t for e in plan.stacks for t in zip(e.batch.members, e.slots, e.here, strict=True)]
    slot_of = {id(m): slot for m, slot, _ in slots_here}
    here = {id(m) for m, _, mine in slots_here if mine}
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
    copies = [(slot, plan.scratch_of[id(m.param)]) for m, slot, mine in slots_here if mine and not m.ordered]
    (slots, sources), _ = _runs([[slot for slot, _ in copies], [source for _, source in copies]])
    plan.core_fill = _Fill(slots, sources)
    plan.ordered_slots = [slot_of[id(m)] for m in plan.ordered if id(m) in here]
    plan.devices = {entry.batch.device for entry in plan.stacks}
    plan.device = plan.stacks[0].batch.device if plan.stacks else None
    plan.zeroed = [t for entry in plan.stacks for t in entry.zeroed]


def _allocate_scratch(plan: _Plan, widened: set[int]) -> None:
    """A scratch view like each clean parameter, in slot order (one tensor per device and dtype)."""
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
        dense = torch.empty_like(p, device="meta").stride()  # laid out like p, without gaps
        plan.scratch_of[id(p)] = flats[(p.device, p.dtype)].as_strided(p.shape, dense, offset)
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
    """Move the clean SGD buffers into one tensor per device and dtype; the state holds a view each."""
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
    if len({batch.device for batch in plan.batches}) > 1:
        plan.sharing_note = "Muon matrices on several devices"
        return []
    splittable = [b for b in plan.batches if b.kind != "single"]
    lone = [b for b in plan.batches if b.kind == "single"]
    counts, sizes = [len(b.members) for b in splittable], [math.prod(_matrix_shape(b)) for b in splittable]
    partition = Partition.of(counts, sizes, [math.prod(_matrix_shape(b)) for b in lone], world, rank)
    description = tuple((b.kind, b.stack_shape, len(b.members), str(b.dtype)) for b in plan.batches)
    if not agreed(partition, description):
        plan.sharing_note = "the ranks' parameter sets differ"
        return []
    plan.partition = partition
    stacks, plan.buffer = _allocate_shares(plan.batches, partition)
    return stacks
