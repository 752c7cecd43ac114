"""One step's scalars, and the plan's foreach lists merged across groups whose scalars are equal."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from typing import Any

import torch

from .plan import _ApplyRun, _GroupPlan, _Layout, _MomentumRun, _Plan, _Scalars, _SgdRun


def _picker(positions: list[int]) -> Callable[[list[Any]], Any]:
    """A C-level getter of the items at `positions` of a list, as a sequence (one item too)."""
    if len(positions) == 1:
        position = positions[0]
        return lambda items: (items[position],)
    return operator.itemgetter(*positions)


def _one_stretch(plan: _Plan, params: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The stretches of the flat SGD buffers and of scratch that these parameters' views tile, or None.

    A buffer and its scratch view share offset and strides, so the stretches pair elements as the lists do.
    """
    views = [plan.scratch_of[id(p)] for p in params]
    flats = plan.sgd_flats.get((params[0].device, params[0].dtype)) if params else None
    if flats is None:
        return None
    spans = sorted((v.storage_offset(), v.storage_offset() + v.numel()) for v in views)
    if any(end != start for (_, end), (start, _) in itertools.pairwise(spans)):
        return None
    low, high = spans[0][0], spans[-1][1]
    buffers, scratch = flats
    return buffers[low:high], scratch[low:high]


def _scalar_key(value: Any) -> Any:
    """What makes two scalars interchangeable kernel arguments: exact float bits, or an int's or bool's value.

    NaN, tensors and anything else give None: never merged.
    """
    kind = type(value)
    if kind is float:
        return value.hex() if value == value else None
    if kind is int or kind is bool:
        return (kind, value)
    return None


def _classes(values: list[Any]) -> tuple[int, ...]:
    """Each value's class: the index of the first interchangeable value, or its own for a lone one."""
    first: dict[Any, int] = {}
    classes = []
    for index, value in enumerate(values):
        key = _scalar_key(value)
        classes.append(index if key is None else first.setdefault(key, index))
    return tuple(classes)


def _compute_scalars(groups: list[_GroupPlan], muon: Any, sgd: Any) -> _Scalars:
    """This step's scalars per group, computed as the baseline computes them, and their pattern."""
    momentum, nesterov, weight_decay, sgd_alpha, muon_alpha = [], [], [], [], []
    for group_plan in groups:
        group = group_plan.group
        lr = group["lr"]
        momentum.append(group["momentum"])
        nesterov.append(bool(group["nesterov"]))
        weight_decay.append(group["weight_decay"])
        sgd_alpha.append(-(lr * sgd if group["use_muon"] else lr))
        muon_alpha.append(-(lr * muon))
    pattern = (
        _classes(momentum),
        tuple(nesterov),
        _classes(weight_decay),
        _classes(sgd_alpha),
        _classes(muon_alpha),
    )
    return _Scalars(momentum, nesterov, weight_decay, sgd_alpha, muon_alpha, pattern)


def _build_layout(plan: _Plan, scalars: _Scalars) -> _Layout:
    """Merge the plan's per-group lists where this step's scalar pattern allows."""
    momentum, nesterov, weight_decay, sgd_alpha, muon_alpha = scalars.pattern
    index = {id(group_plan.group): i for i, group_plan in enumerate(plan.groups)}
    runs: list[_MomentumRun] = []
    previous_key: tuple[Any, ...] | None = None
    applies: dict[tuple[Any, ...], _ApplyRun] = {}
    for muon_group in plan.muon_groups:
        i = index[id(muon_group.group)]
        key = (momentum[i], nesterov[i])
        if key != previous_key:
            runs.append(_MomentumRun(i, nesterov[i], [], [], [], [], []))
            previous_key = key
        run = runs[-1]
        offset = len(run.params)
        run.params += muon_group.params
        run.buffers += muon_group.buffers
        assert run.here is not None
        run.here += [offset + j for j in muon_group.here]
        run.here_buffers += [muon_group.buffers[j] for j in muon_group.here]
        run.here_scratch += [muon_group.scratch[j] for j in muon_group.here]
        split = muon_group.start + muon_group.fast
        for part, start, stop in (("fast", muon_group.start, split), ("slow", split, muon_group.stop)):
            if stop > start:
                apply = applies.setdefault((muon_alpha[i], part), _ApplyRun(i, [], []))
                apply.params += muon_group.params[start - muon_group.start : stop - muon_group.start]
                apply.pieces.append((0, start, stop))
    for run in runs:
        positions = [plan.positions[id(p)] for p in run.params]
        run.grads = _picker(positions)
        run.here_grads = _picker([positions[j] for j in run.here or ()]) if run.here else lambda _: ()
        if len(run.here or ()) == len(run.params):
            run.here, run.here_grads = None, run.grads
    sgd_runs: dict[tuple[Any, ...], _SgdRun] = {}
    sgd_applies: dict[tuple[Any, ...], _ApplyRun] = {}
    for i, group_plan in enumerate(plan.groups):
        for bucket in group_plan.buckets:
            device, dtype = bucket.params[0].device, bucket.params[0].dtype
            key = (device, dtype, momentum[i], nesterov[i], weight_decay[i])
            if key not in sgd_runs:
                sgd_runs[key] = _SgdRun(i, nesterov[i], [], [], [])
            run_index = list(sgd_runs).index(key)
            sgd_run = sgd_runs[key]
            start = len(sgd_run.params)
            sgd_run.params += bucket.params
            sgd_run.buffers += bucket.buffers
            sgd_run.scratch += [plan.scratch_of[id(p)] for p in bucket.params]
            apply = sgd_applies.setdefault((device, dtype, sgd_alpha[i]), _ApplyRun(i, [], []))
            apply.params += bucket.params
            apply.pieces.append((run_index, start, len(sgd_run.params)))
    for sgd_run in sgd_runs.values():
        sgd_run.grads = _picker([plan.positions[id(p)] for p in sgd_run.params])
        sgd_run.flat = _one_stretch(plan, sgd_run.params)
        sgd_run.flat_nesterov = sgd_run.flat is not None and sgd_run.params[0].device.type == "cuda"
    return _Layout(runs, list(applies.values()), list(sgd_runs.values()), list(sgd_applies.values()))
