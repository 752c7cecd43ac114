"""What a step needs, built once per parameter set: the plan, and the lists that one step's scalars merge."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..distributed import Partition
from .stacks import _Batch, _BatchStack, _Fill, _Member


@dataclass
class _MuonGroup:
    """The clean Muon members of one group, in fill order `start:stop`, as foreach lists."""

    group: dict[str, Any]
    start: int
    stop: int
    fast: int  # the first `fast` have their updates widened into scratch
    params: list[torch.Tensor]
    buffers: list[torch.Tensor]
    here: list[int]  # the members orthogonalized here
    scratch: list[torch.Tensor]  # their views of scratch (Nesterov input, then update)


@dataclass
class _Bucket:
    """Clean parameters of one group with one device and dtype: their SGD momentum runs as foreach lists."""

    params: list[torch.Tensor]
    buffers: list[torch.Tensor]


@dataclass
class _GroupPlan:
    """How one group's SGD part runs: foreach buckets of clean parameters, then the rest in order."""

    group: dict[str, Any]
    buckets: list[_Bucket]
    in_order: list[torch.Tensor]  # parameters stepped one by one, in the baseline's order


@dataclass
class _MomentumRun:
    """Consecutive Muon groups with equal momentum and Nesterov: one momentum pass for all."""

    group: int  # the group whose scalars the run reads
    nesterov: bool
    params: list[torch.Tensor]
    buffers: list[torch.Tensor]
    here: list[int] | None  # members orthogonalized here (None: all)
    here_buffers: list[torch.Tensor]
    here_scratch: list[torch.Tensor]  # where a Nesterov input is computed in place
    grads: Callable[[list[Any]], Any] = tuple  # the run's gradients out of the step's flat list
    here_grads: Callable[[list[Any]], Any] = tuple  # those of the members orthogonalized here


@dataclass
class _SgdRun:
    """Clean SGD buckets (across groups) with one device, dtype, momentum, Nesterov and decay."""

    group: int
    nesterov: bool
    params: list[torch.Tensor]
    buffers: list[torch.Tensor]
    scratch: list[torch.Tensor]  # the decayed gradient, then the Nesterov update, in place
    grads: Callable[[list[Any]], Any] = tuple
    flat: tuple[torch.Tensor, torch.Tensor] | None = None  # the stretches the buffers and scratch tile
    # The Nesterov update flat too: CUDA only. On the CPU, a vectorized loop and its remainder round bf16
    # a + α·b differently (torch 2.14.1).
    flat_nesterov: bool = False


@dataclass
class _ApplyRun:
    """Parameters updated by one foreach add with one alpha; updates as (source, start, stop) slices."""

    group: int
    params: list[torch.Tensor]
    pieces: list[tuple[int, int, int]]

    def updates(self, sources: list[list[torch.Tensor]]) -> list[torch.Tensor]:
        if len(self.pieces) == 1:
            source, start, stop = self.pieces[0]
            if start == 0 and stop == len(sources[source]):
                return sources[source]
        return [t for source, start, stop in self.pieces for t in sources[source][start:stop]]


@dataclass
class _Layout:
    """The plan's foreach lists merged across groups whose step scalars are equal (one scalar pattern)."""

    momentum: list[_MomentumRun]
    muon_apply: list[_ApplyRun]  # pieces into the fill-order updates (source 0)
    sgd: list[_SgdRun]
    sgd_apply: list[_ApplyRun]  # pieces into the SGD runs' updates (source = run index)


@dataclass(frozen=True)
class _Scalars:
    """One step's scalars per group, as the baseline computes them, and their equality pattern."""

    momentum: list[Any]
    nesterov: list[bool]
    weight_decay: list[Any]
    sgd_alpha: list[Any]  # -(lr * sgd) in Muon groups, -lr elsewhere
    muon_alpha: list[Any]  # -(lr * muon)
    pattern: tuple[Any, ...]


@dataclass
class _Plan:
    """Everything a step needs to know about the parameter set, and what it was built from."""

    signature: tuple[Any, ...]
    grad_addresses: tuple[Any, ...]
    grads_overlap: bool
    span_index: dict[str, tuple[list[int], list[int]]]  # per device: sorted starts, running max of ends
    batches: list[_Batch]
    groups: list[_GroupPlan]
    stacks: list[_BatchStack] = field(default_factory=list)
    fill: list[_Member] = field(default_factory=list)  # every member, in fill order
    core_fill: _Fill = field(default_factory=lambda: _Fill([], []))  # the clean members' inputs copied here
    ordered_slots: list[torch.Tensor] = field(default_factory=list)  # the ordered members' filled here
    scratch: list[torch.Tensor] = field(default_factory=list)  # per device and dtype: out-of-place results
    scratch_of: dict[int, torch.Tensor] = field(default_factory=dict)  # parameter id -> its view
    # Per device and dtype: the flat clean SGD buffers (laid out like scratch), and scratch.
    sgd_flats: dict[tuple[Any, Any], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    zeroed: list[torch.Tensor] = field(default_factory=list)  # padded stacks (or shares), zeroed per step
    muon_groups: list[_MuonGroup] = field(default_factory=list)
    ordered: list[_Member] = field(default_factory=list)  # fill[len(fill) - len(ordered):]
    ordered_here: list[bool] = field(default_factory=list)  # which of them are orthogonalized here
    partition: Partition | None = None  # how a process group shares the work; None on one rank
    buffer: torch.Tensor | None = None  # the flat buffer every rank's share lives in, under a partition
    sharing_note: str = ""  # why a process group's ranks do not share the work, where they could
    # Every parameter on a batching device with its device's name: whose moved gradients are checked.
    grad_checks: list[tuple[torch.Tensor, str]] = field(default_factory=list)
    # On one device: those parameters, whether they are every one (in order), and their memory's union.
    grad_check_params: list[torch.Tensor] = field(default_factory=list)
    grad_check_all: bool = False
    grad_check_ends: dict[int, int] | None = None  # for `_spans_meet`; None across devices
    layouts: dict[tuple[Any, ...], _Layout] = field(default_factory=dict)  # merged runs, per scalar pattern
    devices: set[torch.device] = field(default_factory=set)  # where the stacks live
    device: torch.device | None = None  # the first stack's device (the core's, where it replays)
    positions: dict[int, int] = field(default_factory=dict)  # parameter id -> index in the optimizer's order
    last_scalars: tuple[list[Any], _Scalars] | None = None  # the scalar objects last read, and what they gave

    @property
    def nbytes(self) -> int:
        """Bytes the plan's stacks and scratch hold between steps."""
        stacks = [self.buffer] if self.buffer is not None else [e.full for e in self.stacks]
        return sum(t.nbytes for t in [*self.scratch, *stacks] if t is not None)

    def updates_in_fill_order(self, per_batch: list[list[torch.Tensor]]) -> list[torch.Tensor]:
        updates: list[torch.Tensor] = [None] * len(self.fill)  # type: ignore[list-item]
        for entry, batch_updates in zip(self.stacks, per_batch, strict=True):
            for member, update in zip(entry.batch.members, batch_updates, strict=True):
                updates[member.position] = update
        return updates


def _picker(positions: list[int]) -> Callable[[list[Any]], Any]:
    """A C-level getter of the items at `positions` of a list, as a sequence (one item too)."""
    if len(positions) == 1:
        position = positions[0]
        return lambda items: (items[position],)
    return operator.itemgetter(*positions)


def _one_stretch(plan: _Plan, params: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The stretches of the flat SGD buffers and of scratch that these parameters' views tile, or None."""
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
    """What makes scalars interchangeable kernel arguments: float bits, an int's or bool's value, or None."""
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
    pattern = (_classes(momentum), tuple(nesterov), *map(_classes, (weight_decay, sgd_alpha, muon_alpha)))
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
            sgd_run = sgd_runs.setdefault(key, _SgdRun(i, nesterov[i], [], [], []))
            run_index = list(sgd_runs).index(key)
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
