"""BatchedMuSGD: MuSGD batched across parameters on CUDA, with the baseline's state (docs/candidate.md)."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import torch

from ..concurrent import DEFAULT_LANES
from ..distributed import gather_shares, world_and_rank
from ..graphs import CoreGraph
from ..musgd import MuSGD, closure_loss, muon_momentum, musgd_param_step
from ..newton_schulz import foreach_mul_
from .plan import _build_layout, _compute_scalars, _Layout, _Plan, _Scalars
from .planning import _GRAD, _IS_NOT_NONE, _addresses, _build_plan, _grads_overlap, batched_on_cpu, batches_on
from .stacks import _fill_stacks, _finish, _newton_schulz_here, _orthogonalize_stacks

DEFAULT_PAD_GUARD = 256
# One more Newton-Schulz chain priced in padded FLOPs: on the H200, 3e9 is within 1.6% of the best price
# at every YOLO26 scale, 8–13% faster than none (reports/h200-decisive/logs/2026-12-01-2325/prices.log).
DEFAULT_PAD_CHAIN_FLOPS = 3e9
MAX_LAYOUTS = 16  # scalar patterns whose merged lists a plan keeps (a schedule rarely makes more than two)
_IS_NONE = functools.partial(operator.is_, None)
_SCALARS = operator.itemgetter("lr", "momentum", "nesterov", "weight_decay", "use_muon")
_PLAIN_NUMBERS = (float, int, bool)
_CPU = torch.device("cpu")

__all__ = ["DEFAULT_PAD_CHAIN_FLOPS", "DEFAULT_PAD_GUARD", "BatchedMuSGD", "batched_on_cpu", "batches_on"]


def _device_refusal(devices: set[torch.device]) -> str | None:
    """Why cores on these devices cannot replay a graph now; None on one CUDA device, not capturing."""
    if any(device.type != "cuda" for device in devices):
        return "not on CUDA"
    if len(devices) > 1:
        return "several CUDA devices"
    if torch.cuda.is_current_stream_capturing():
        return "inside another capture"
    return None


class BatchedMuSGD(MuSGD):
    """MuSGD batched on CUDA, same constructor and state; knobs for screens, set before the first step."""

    pad_guard: int | None = DEFAULT_PAD_GUARD  # largest smaller dimension zero-padded (None: any, 0: none)
    pad_chain_flops: float | None = DEFAULT_PAD_CHAIN_FLOPS  # one more chain's price (None: pad to memory)
    graph_replay: bool = True  # whether the core may replay from a CUDA graph
    ns_lanes: int = DEFAULT_LANES  # Newton-Schulz chains run at once

    @classmethod
    @functools.cache
    def with_pad_guard(cls, guard: int | None) -> type[BatchedMuSGD]:
        """A subclass whose padding guard is `guard`, the same one every call."""
        name = f"{cls.__name__}_pad_{'any' if guard is None else guard}"
        return type(name, (cls,), {"pad_guard": guard, "__module__": cls.__module__, "__qualname__": name})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reset_caches()

    def _reset_caches(self) -> None:
        self._plan: _Plan | None = None
        self._step_grads: list[torch.Tensor | None] = []  # this step's gradients, in the optimizer's order
        self._core_graph = CoreGraph()
        self._eager_requested = False

    def __setstate__(self, state: dict[str, Any]) -> None:
        """An unpickled or deep-copied optimizer starts a plan and a graph; a live one keeps its own."""
        super().__setstate__(state)
        if not hasattr(self, "_core_graph"):
            self._reset_caches()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as torch does; the next step rebuilds the plan around the restored buffers."""
        super().load_state_dict(state_dict)
        self._plan = None
        self._core_graph.reset()

    @property
    def graph_stats(self) -> dict[str, int]:
        """How many cores were 'replayed', 'captured', or 'eager: <reason>' since construction."""
        return dict(self._core_graph.stats)

    @property
    def plan_bytes(self) -> int:
        """Device bytes kept between steps besides the state: stacks, scratch, the graph's pool and stream."""
        core = self._core_graph
        return (self._plan.nbytes if self._plan is not None else 0) + core.pool_bytes + core.warm_bytes

    @property
    def sharing(self) -> dict[str, Any]:
        """How ranks share Newton-Schulz: `world`, `rank`, `matrices_here`, `matrices` and a `note`."""
        plan = self._plan
        if plan is None:
            return {"world": 1, "rank": 0, "matrices_here": 0, "matrices": 0, "note": ""}
        here = sum(sum(entry.here) for entry in plan.stacks)
        world, rank = (plan.partition.world, plan.partition.rank) if plan.partition is not None else (1, 0)
        return dict(
            world=world, rank=rank, matrices_here=here, matrices=len(plan.fill), note=plan.sharing_note
        )

    def eager_step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One step with an eager core, replay or not: the step's own kernels, for an outer capture."""
        previous, self._eager_requested = self._eager_requested, True
        try:
            return self.step(closure)
        finally:
            self._eager_requested = previous

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One MuSGD step: Muon momentum, Newton-Schulz and the Muon apply for every batch, then SGD."""
        loss = closure_loss(closure)
        plan = self._current_plan()
        scalars = self._scalars(plan)
        layout = plan.layouts.get(scalars.pattern)
        if layout is None:
            if len(plan.layouts) >= MAX_LAYOUTS:
                plan.layouts.clear()
            layout = plan.layouts[scalars.pattern] = _build_layout(plan, scalars)
        try:
            in_order_updates = self._muon(plan, layout, scalars)
            self._sgd(plan, layout, scalars, in_order_updates)
        finally:
            self._step_grads = []  # no gradient kept alive past the step (zero_grad may free them)
        return loss

    def _scalars(self, plan: _Plan) -> _Scalars:
        """This step's scalars; reused while each is the last step's object and a plain number."""
        raw: list[Any] = [self.muon, self.sgd]
        for group_plan in plan.groups:
            raw += _SCALARS(group_plan.group)
        last = plan.last_scalars
        if last is not None and len(last[0]) == len(raw) and all(map(operator.is_, raw, last[0])):
            return last[1]
        scalars = _compute_scalars(plan.groups, self.muon, self.sgd)
        plan.last_scalars = (raw, scalars) if all(type(v) in _PLAIN_NUMBERS for v in raw) else None
        return scalars

    def _muon(self, plan: _Plan, layout: _Layout, scalars: _Scalars) -> dict[int, torch.Tensor]:
        """Muon momentum, the core (in a graph where it may replay), the clean apply; the ordered updates."""
        if not plan.stacks:
            return {}
        self._momentum(plan, layout, scalars)
        fill = plan.core_fill
        device, refusal = plan.device, self._replay_refusal(plan)
        if plan.partition is None:

            def core() -> list[torch.Tensor]:
                _fill_stacks(plan.zeroed, fill)
                return plan.updates_in_fill_order(_orthogonalize_stacks(plan.stacks, self.ns_lanes))

            updates = self._core_graph.run(fill, device, core, refusal)
        else:
            _fill_stacks(plan.zeroed, fill)
            self._core_graph.run(
                fill, device, lambda: _newton_schulz_here(plan.stacks, self.ns_lanes), refusal
            )
            assert plan.buffer is not None
            gather_shares(plan.buffer, plan.partition)
            updates = plan.updates_in_fill_order(_finish(plan.stacks))
        sources = [updates]
        for apply in layout.muon_apply:
            torch._foreach_add_(apply.params, apply.updates(sources), alpha=scalars.muon_alpha[apply.group])
        return {id(member.param): updates[member.position] for member in plan.ordered}

    def _momentum(self, plan: _Plan, layout: _Layout, scalars: _Scalars) -> None:
        """Muon momentum: foreach per run, Nesterov inputs lerped in scratch; ordered members one by one."""
        for run in layout.momentum:
            momentum = scalars.momentum[run.group]
            torch._foreach_lerp_(run.buffers, run.grads(self._step_grads), 1 - momentum)
            if run.nesterov and run.here_scratch:
                torch._foreach_copy_(run.here_scratch, run.here_grads(self._step_grads))
                torch._foreach_lerp_(run.here_scratch, run.here_buffers, momentum)
            elif run.here_scratch:  # the core reads every input from scratch: one fill, however Nesterov goes
                torch._foreach_copy_(run.here_scratch, run.here_buffers)
        sources = []
        for member, here in zip(plan.ordered, plan.ordered_here, strict=True):
            group, p = member.group, member.param
            buffer = self.state[p]["momentum_buffer"]
            source = muon_momentum(p.grad, buffer, group["momentum"], group["nesterov"])
            if here:
                sources.append(source)
        if sources:
            torch._foreach_copy_(plan.ordered_slots, sources)

    def _replay_refusal(self, plan: _Plan) -> str | None:
        """Why this step's core must not replay a graph, or None where replay is safe."""
        if not self.graph_replay:
            return "replay off"
        if self._eager_requested:
            return "eager step asked for"
        return _device_refusal(plan.devices)

    def _sgd(
        self, plan: _Plan, layout: _Layout, scalars: _Scalars, in_order_updates: dict[int, torch.Tensor]
    ) -> None:
        """SGD momentum of the clean buckets as merged foreach lists, then the in-order parameters."""
        run_updates = []
        for run in layout.sgd:
            momentum, weight_decay = scalars.momentum[run.group], scalars.weight_decay[run.group]
            grads = run.grads(self._step_grads)
            if weight_decay != 0 or run.nesterov:  # g + wd p, then g + m buf: in place in scratch
                torch._foreach_copy_(run.scratch, grads)
                grads = run.scratch
                if weight_decay != 0:
                    torch._foreach_add_(grads, run.params, alpha=weight_decay)
            if run.flat is not None:  # the same operations on two stretches of flat tensors
                buffers, scratch = run.flat
                buffers.mul_(momentum)
                if grads is run.scratch:
                    buffers.add_(scratch)
                else:
                    torch._foreach_add_(run.buffers, grads)
                if run.nesterov and run.flat_nesterov:
                    scratch.add_(buffers, alpha=momentum)
                elif run.nesterov:
                    torch._foreach_add_(grads, run.buffers, alpha=momentum)
            else:
                foreach_mul_(run.buffers, momentum)
                torch._foreach_add_(run.buffers, grads)
                if run.nesterov:
                    torch._foreach_add_(grads, run.buffers, alpha=momentum)
            run_updates.append(grads if run.nesterov else run.buffers)
        for apply in layout.sgd_apply:
            torch._foreach_add_(
                apply.params, apply.updates(run_updates), alpha=scalars.sgd_alpha[apply.group]
            )
        for group_plan in plan.groups:  # in order: the whole baseline step, or the Muon apply and SGD
            for p in group_plan.in_order:
                update = in_order_updates.pop(id(p), None)
                musgd_param_step(p, self.state[p], group_plan.group, self.muon, self.sgd, update)

    def _signature(self) -> tuple[tuple[Any, ...], tuple[Any, ...], list[torch.Tensor | None]]:
        """What the plan depends on, the gradients' addresses, and every gradient in the optimizer's order."""
        parts: list[Any] = [id(self.state), self.pad_guard, self.pad_chain_flops, self.ns_lanes]
        parts += [batches_on(_CPU), world_and_rank()]
        grad_addresses: list[Any] = []
        every_grad: list[torch.Tensor | None] = []
        for group in self.param_groups:
            params = group["params"]
            grads = list(map(_GRAD, params))
            every_grad += grads
            parts += [id(group), group["use_muon"], tuple(map(id, params)), _addresses(params)]
            parts.append(tuple(map(_IS_NONE, grads)))
            grad_addresses.append(_addresses(list(filter(_IS_NOT_NONE, grads))))
        return tuple(parts), tuple(grad_addresses), every_grad

    def _current_plan(self) -> _Plan:
        """The plan for this step's parameters, reused while its signature holds; keeps `_step_grads`."""
        signature, grad_addresses, self._step_grads = self._signature()
        plan = self._plan
        if plan is not None and plan.signature == signature:
            if plan.grad_addresses == grad_addresses:
                return plan
            # Gradients moved (fresh allocations): the plan holds unless a gradient now overlaps something.
            if not plan.grads_overlap and not _grads_overlap(plan, self._step_grads, grad_addresses):
                plan.grad_addresses = grad_addresses
                return plan
        self._plan = None  # the old stacks go before the new ones are allocated
        self._plan = _build_plan(
            self.param_groups, self.state, signature, grad_addresses, self.pad_guard, self.pad_chain_flops
        )
        return self._plan
