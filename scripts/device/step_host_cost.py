"""Per-step host cost of BatchedMuSGD on YOLO26 parameter sets, by part, measured on the CPU.

The candidate's host work per step (plan check, list building, Python around each operation) does not depend
on the tensors' sizes, but on a CPU the operations' own arithmetic does, and it dwarfs the host work. So this
script times the step with every foreach operation the step calls replaced by a no-op (out-of-place ones
return their first list) and the Newton-Schulz core replaced by returning the first step's outputs, which is
what a CUDA-graph replay does on the host. What is left is the step's Python: the per-part microseconds
printed. Separately it counts, with the real operations, what a step dispatches outside the core (on CUDA
the core is one replay): aten operations and the tensors they are passed (foreach host cost grows with
both). Times are the thread's CPU time (a shared, loaded host makes wall time useless here). Figures are
this machine's; they compare versions of the code, they are no speed claim for a GPU.

    PYTHONPATH=$PWD python scripts/device/step_host_cost.py --scales n l --steps 300
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from experiments.workloads import build_param_groups, fill_synthetic_grads
from optimizers import batched
from optimizers.batched import BatchedMuSGD
from optimizers.graphs import CoreGraph

FOREACH_NAMES = [name for name in dir(torch) if name.startswith("_foreach_")]


def _no_op(name: str) -> Callable[..., Any]:
    in_place = name.endswith("_")

    def run(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        return None if in_place else list(tensors)

    return run


@contextlib.contextmanager
def _replayed_core() -> Iterator[None]:
    """CoreGraph.run returns the first call's outputs from then on (no Newton-Schulz), as a replay does."""
    original_run, original_ns = CoreGraph.run, batched._newton_schulz_here
    cache: dict[int, list[torch.Tensor]] = {}

    def run(self: CoreGraph, key: object, device: Any, compute: Any, refusal: Any) -> list[torch.Tensor]:
        if id(key) not in cache:
            cache[id(key)] = compute()
        return cache[id(key)]

    CoreGraph.run = run  # type: ignore[method-assign]
    batched._newton_schulz_here = lambda stacks, lanes=1: []  # type: ignore[assignment]
    try:
        yield
    finally:
        CoreGraph.run = original_run  # type: ignore[method-assign]
        batched._newton_schulz_here = original_ns  # type: ignore[assignment]


@contextlib.contextmanager
def _no_op_foreach() -> Iterator[None]:
    originals = {name: getattr(torch, name) for name in FOREACH_NAMES}
    try:
        for name in FOREACH_NAMES:
            setattr(torch, name, _no_op(name))
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch, name, fn)


PARTS = {  # part -> the BatchedMuSGD methods whose time it is (those that exist in this version)
    "plan check": ["_current_plan"],
    "momentum": ["_momentum", "_fill_stacks"],
    "core (replay stub)": ["_replay_refusal"],
    "SGD": ["_sgd_group", "_sgd"],
}


@contextlib.contextmanager
def _timed_parts(spent: dict[str, int]) -> Iterator[None]:
    originals = {}
    for part, names in PARTS.items():
        for name in names:
            if name not in BatchedMuSGD.__dict__:
                continue
            fn = BatchedMuSGD.__dict__[name]
            originals[name] = fn

            def timed(self: BatchedMuSGD, *args: Any, _fn: Any = fn, _part: str = part, **kwargs: Any) -> Any:
                started = time.thread_time_ns()
                try:
                    return _fn(self, *args, **kwargs)
                finally:
                    spent[_part] += time.thread_time_ns() - started

            setattr(BatchedMuSGD, name, timed)
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(BatchedMuSGD, name, fn)


class _Counting(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.tensors = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        if func.overloadpacket.__name__.startswith("_foreach_"):
            self.tensors += len(args[0])
        return func(*args, **(kwargs or {}))


def measure(scale: str, steps: int, optimizer_class: type[BatchedMuSGD] = BatchedMuSGD) -> dict[str, float]:
    """Host microseconds per step by part (each part's minimum over the steps), and what one step dispatches
    outside the core."""
    groups, kwargs = build_param_groups(scale)
    fill_synthetic_grads(groups, seed=0)
    optimizer = optimizer_class(groups, **kwargs)
    figures: dict[str, float] = {}
    with batched.batched_on_cpu(), _replayed_core():
        with _no_op_foreach():
            optimizer.step()  # builds the plan and the "replayed" outputs
        counting = _Counting()
        with counting:
            optimizer.step()
        figures["aten ops (outside the core)"] = counting.ops
        figures["foreach tensor arguments"] = counting.tensors
        per_part: dict[str, list[float]] = defaultdict(list)
        with _no_op_foreach():
            for _ in range(steps):
                spent: dict[str, int] = defaultdict(int)
                with _timed_parts(spent):
                    started = time.thread_time_ns()
                    optimizer.step()
                    total = time.thread_time_ns() - started
                for part in PARTS:
                    per_part[part].append(spent[part] / 1e3)
                per_part["Muon apply + rest"].append((total - sum(spent.values())) / 1e3)
                per_part["step (total)"].append(total / 1e3)
            plan = optimizer._current_plan()
            moved = []
            for _ in range(max(steps // 10, 5)):  # gradients re-allocated every step (set_to_none)
                for group in groups:
                    for p in group["params"]:
                        if p.grad is not None:
                            p.grad = torch.empty_like(p.grad)
                started = time.thread_time_ns()
                assert optimizer._current_plan() is plan
                moved.append((time.thread_time_ns() - started) / 1e3)
    # The least disturbed step: on a shared, loaded host the median moves by 2x between runs, the minimum less.
    figures.update({f"{part} µs": min(values) for part, values in per_part.items()})
    figures["plan check, gradients re-allocated µs"] = min(moved)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", nargs="+", default=["n", "l"])
    parser.add_argument("--steps", type=int, default=300)
    arguments = parser.parse_args()
    torch.set_num_threads(1)
    for scale in arguments.scales:
        print(f"YOLO26{scale} (CPU, this machine; Python host work per step, minimum over {arguments.steps})")
        for name, value in measure(scale, arguments.steps).items():
            print(f"  {name:40s} {value:10.1f}")


if __name__ == "__main__":
    main()
