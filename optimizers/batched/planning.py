"""The plan of a parameter set: which matrices share a stack, and what keeps the baseline's step or order.

`batched_on_cpu` routes CPU tensors through the batched path, as CUDA tensors always go.
A moved gradient is checked against the plan's memory each step (`_grads_overlap`).
"""

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

from ..distributed import world_and_rank
from ..newton_schulz import muon_scale
from .layout import _lay_out, _mirror_sgd_buffers
from .memory import (
    _OPAQUE,
    _address,
    _addresses,
    _memory_span,
    _overlapping,
    _refuses_inspection,
    _span_index,
    _spans_meet,
    _spans_of,
    _union_ends,
)
from .plan import _Bucket, _GroupPlan, _Plan
from .stacks import (
    STACK_DTYPE,
    _make_batch,
    _Member,
    _split_by_budget,
    _split_by_cost,
)

_GRAD = operator.attrgetter("grad")
_IS_NOT_NONE = functools.partial(operator.is_not, None)
_IS_CONTIGUOUS = torch.Tensor.is_contiguous
_NBYTES = operator.attrgetter("nbytes")
_cpu_batched = False


@contextlib.contextmanager
def batched_on_cpu(enabled: bool = True) -> Iterator[None]:
    """Within the block, CPU parameters take the batched path, as CUDA ones do; restored on exit.

    The candidate's own algorithm on CPU kernels: for tests, and for CPU timings of batching.
    """
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
    buffers = [state.get(key) for key in keys]
    return all(
        type(b) is torch.Tensor and (b.shape, b.dtype, b.device) == (p.shape, p.dtype, p.device)
        for b in buffers
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
        group_whole = {id(p) for p in in_order if id(p) in whole_step or not group["use_muon"]}
        group_plans.append(_GroupPlan(group, list(buckets.values()), in_order, group_whole))
    plan = _Plan(signature, grad_addresses, grads_overlap, {}, batches, group_plans)
    plan.positions = orders
    _lay_out(plan, states, *world_and_rank())  # 5. the stacks (shared out over ranks), the fill order
    _mirror_sgd_buffers(plan, states)  # 6. the SGD buffers laid out like scratch (new memory)

    # 7. What a moved gradient is checked against: the parameters and their state as now held.
    plan.span_index = _span_index(_spans_of(tracked, states, grads=False)[0])
    plan.grad_checks = [
        (p, str(p.device)) for group in param_groups for p in group["params"] if batches_on(p.device)
    ]
    check_devices = {device for _, device in plan.grad_checks}
    if len(check_devices) == 1:
        starts, reach = plan.span_index.get(check_devices.pop(), ([], []))
        plan.grad_check_params = [p for p, _ in plan.grad_checks]
        plan.grad_check_all = len(plan.grad_check_params) == sum(len(g["params"]) for g in param_groups)
        plan.grad_check_ends = _union_ends(starts, reach)
    return plan


def _grads_overlap(plan: _Plan, step_grads: list[Any], grad_addresses: tuple[Any, ...]) -> bool:
    """Whether any gradient now shares memory with a tracked parameter or buffer, or another gradient.

    Run when gradients moved: a trainer's zero_grad frees them every step.
    On one device with nonempty contiguous gradients, a few C-level passes (`_spans_meet`).
    Otherwise a binary search per gradient (`_grads_overlap_each`).
    """
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
