"""What a step needs, built once per parameter set: the plan, and the lists one step's scalars merge."""

from __future__ import annotations

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
        gathered: list[torch.Tensor] = []
        for source, start, stop in self.pieces:
            gathered += sources[source][start:stop]
        return gathered


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
    sgd_flats: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict
    )
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
        stacks = (
            [self.buffer] if self.buffer is not None else [e.full for e in self.stacks if e.full is not None]
        )
        return sum(t.nbytes for t in [*self.scratch, *stacks])

    def updates_in_fill_order(self, per_batch: list[list[torch.Tensor]]) -> list[torch.Tensor]:
        updates: list[torch.Tensor] = [None] * len(self.fill)  # type: ignore[list-item]
        for entry, batch_updates in zip(self.stacks, per_batch, strict=True):
            for member, update in zip(entry.batch.members, batch_updates, strict=True):
                updates[member.position] = update
        return updates
