"""Where a BatchedMuSGD step's host time goes on a CUDA machine, by part and by aten operation.

The candidate's eager step on a fast GPU is host-bound: its time is what the host spends dispatching. This
times each part of the step on the host (wall clock, no synchronization inside the step; the device is
synchronized before each step so the launch queue never pushes back), profiles the aten operations' own host
time, and times the list operations the step is made of against the same work on one flat tensor, so a
change to the step is chosen from measured costs. Also the plan check when every gradient is re-allocated
(a trainer's `zero_grad(set_to_none=True)`). Figures are that machine's and are printed, not stored.

    PYTHONPATH=$PWD python scripts/device/h200_step_profile.py --scales n x
    PYTHONPATH=$PWD python scripts/device/h200_step_profile.py --device cpu --scales n --steps 2   # does it run?
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch

from experiments.workloads import build_param_groups, fill_synthetic_grads
from optimizers import batched
from optimizers.batched import BatchedMuSGD
from optimizers.graphs import CoreGraph

DEVICE = (
    "cuda"  # --device cpu runs the same code on the CPU's forced batched path: a check that the script works
)


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


PARTS = {
    "plan check": (BatchedMuSGD, "_current_plan"),
    "scalars": (BatchedMuSGD, "_scalars"),
    "momentum": (BatchedMuSGD, "_momentum"),
    "core (graph)": (CoreGraph, "run"),
    "SGD": (BatchedMuSGD, "_sgd"),
}


@contextlib.contextmanager
def timed_parts(spent: dict[str, float]) -> Iterator[None]:
    originals = []
    for part, (owner, name) in PARTS.items():
        fn = owner.__dict__[name]
        originals.append((owner, name, fn))

        def timed(*args: Any, _fn: Callable[..., Any] = fn, _part: str = part, **kwargs: Any) -> Any:
            started = time.perf_counter_ns()
            try:
                return _fn(*args, **kwargs)
            finally:
                spent[_part] += (time.perf_counter_ns() - started) / 1e3

        setattr(owner, name, timed)
    try:
        yield
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)


def host_us(fn: Callable[[], Any], repeats: int = 50) -> float:
    """Median host microseconds of `fn` with an empty launch queue before each call."""
    values = []
    for _ in range(repeats):
        _sync()
        started = time.perf_counter_ns()
        fn()
        values.append((time.perf_counter_ns() - started) / 1e3)
    _sync()
    return statistics.median(values)


def profile_step(scale: str, steps: int) -> None:
    groups, kwargs = build_param_groups(scale, device=DEVICE)
    fill_synthetic_grads(groups, seed=0)
    optimizer = BatchedMuSGD(groups, **kwargs)
    for _ in range(5):
        optimizer.step()
    _sync()
    print(f"== YOLO26{scale}: graph stats {optimizer.graph_stats}")
    core, mib = optimizer._core_graph, 2**20
    plan = optimizer._plan.nbytes if optimizer._plan is not None else 0
    print(
        f"  kept between steps {optimizer.plan_bytes / mib:.1f} MiB: stacks and scratch {plan / mib:.1f}, "
        f"graph pool {core.pool_bytes / mib:.1f}, capture stream's warm-up {core.warm_bytes / mib:.1f}"
    )
    per_part: dict[str, list[float]] = defaultdict(list)
    for _ in range(steps):
        spent: dict[str, float] = defaultdict(float)
        _sync()
        with timed_parts(spent):
            started = time.perf_counter_ns()
            optimizer.step()
            total = (time.perf_counter_ns() - started) / 1e3
        for part in PARTS:
            per_part[part].append(spent[part])
        per_part["Muon apply + rest"].append(total - sum(spent.values()))
        per_part["step host (total)"].append(total)
    _sync()
    synced = []
    for _ in range(steps):
        _sync()
        started = time.perf_counter_ns()
        optimizer.step()
        _sync()
        synced.append((time.perf_counter_ns() - started) / 1e3)
    per_part["step synchronized (wall)"] = synced
    for part, values in per_part.items():
        print(f"  {part:28s} median {statistics.median(values):9.1f} µs   min {min(values):9.1f}")

    params = [p for g in groups for p in g["params"] if p.grad is not None]

    def moved_step() -> None:
        for p in params:
            p.grad = p.grad.clone()
        optimizer.step()

    def moved_check() -> None:
        optimizer._current_plan()

    for p in params:
        p.grad = p.grad.clone()
    print(f"  {'plan check, grads moved':28s} median {host_us(moved_check, min(30, steps)):9.1f} µs")
    print(f"  {'step, grads moved (+clone)':28s} median {host_us(moved_step, min(30, steps)):9.1f} µs")

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(min(20, steps)):
            optimizer.step()
        _sync()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=40))
    gpu_time_by_kernel(optimizer, min(5, steps))
    list_costs(optimizer, params, min(50, steps))


def gpu_time_by_kernel(optimizer: BatchedMuSGD, steps: int) -> None:
    """Where the step's GPU time goes: its eager steps' kernels (a replay's are the same kernels), by GPU
    time; inside a fit the step ends when the GPU's work does, well after the host's last launch."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if DEVICE == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            optimizer.eager_step()
        _sync()
    print(f"  the eager step's operations by GPU time ({steps} steps):")
    table = prof.key_averages().table(
        sort_by="self_device_time_total", row_limit=30, max_name_column_width=60
    )
    print(table)


def list_costs(optimizer: BatchedMuSGD, params: list[torch.Tensor], repeats: int) -> None:
    """The step's list operations over its own tensors against the same arithmetic on one flat tensor."""
    grads = [p.grad for p in params]
    buffers = [torch.zeros_like(p) for p in params]
    flat_a = torch.zeros(sum(p.numel() for p in params), device=DEVICE)
    flat_b = torch.zeros_like(flat_a)
    views = list(torch.split(flat_a, [p.numel() for p in params]))
    views = [v.view_as(p) for v, p in zip(views, params, strict=True)]
    scalar = torch.tensor(0.9, device=DEVICE)
    cases: dict[str, Callable[[], Any]] = {
        "_foreach_lerp_ (in place)": lambda: torch._foreach_lerp_(buffers, grads, 0.1),
        "_foreach_lerp (new outputs)": lambda: torch._foreach_lerp(grads, buffers, 0.9),
        "_foreach_add (new outputs)": lambda: torch._foreach_add(grads, buffers, alpha=0.9),
        "_foreach_add_ alpha": lambda: torch._foreach_add_(buffers, grads, alpha=-0.01),
        "_foreach_mul_ scalar": lambda: torch._foreach_mul_(buffers, 0.9),
        "_foreach_mul_ device scalar": lambda: torch._foreach_mul_(buffers, scalar),
        "_foreach_copy_": lambda: torch._foreach_copy_(buffers, grads),
        "_foreach_copy_ into flat views": lambda: torch._foreach_copy_(views, grads),
        "empty_like x n (allocate)": lambda: [torch.empty_like(g) for g in grads],
        "flat lerp_": lambda: flat_a.lerp_(flat_b, 0.1),
        "flat add_ alpha": lambda: flat_a.add_(flat_b, alpha=-0.01),
        "one tiny add_": lambda: scalar.add_(0.0),
    }
    print(f"  list operations over the step's {len(params)} gradients (host µs, median of {repeats}):")
    for name, fn in cases.items():
        fn()
        print(f"    {name:34s} {host_us(fn, repeats):9.1f}")


def scalar_twins() -> None:
    """Whether an operation with a device-tensor scalar gives the bits of the same operation with a Python
    float (what a graph replayed under a changing schedule would need)."""
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    a = torch.randn(1 << 22, device=DEVICE, generator=generator)
    b = torch.randn(1 << 22, device=DEVICE, generator=generator)
    for value in (0.1, 0.9, 1 - 0.937, -0.01 * 0.2, 0.0005):
        t = torch.tensor(value, device=DEVICE)
        twins = {
            "lerp": (a.lerp(b, value), a.lerp(b, t)),
            "mul": (a.mul(value), a.mul(t)),
            "add alpha vs add(mul)": (a.add(b, alpha=value), a.add(b.mul(t))),
            "add alpha vs addcmul": (a.add(b, alpha=value), torch.addcmul(a, b, t)),
        }
        same = {name: int((x != y).sum()) for name, (x, y) in twins.items()}
        print(f"  scalar {value!r}: differing elements of {a.numel()}: {same}")


def main(argv: list[str] | None = None) -> None:
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", nargs="+", default=["n", "x"])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    arguments = parser.parse_args(argv)
    DEVICE = arguments.device
    with batched.batched_on_cpu(DEVICE == "cpu"):
        scalar_twins()
        for scale in arguments.scales:
            profile_step(scale, arguments.steps)


if __name__ == "__main__":
    main()
