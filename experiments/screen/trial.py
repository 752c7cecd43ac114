"""One screen trial: warm-up steps, a synchronized window, then the launch floor (docs/tiers.md)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch

from experiments import workloads
from experiments.arms import make_optimizer
from experiments.finite import check_finite_step
from experiments.screen.plan import (
    DEFAULT_GUARD,
    FLOOR_WARMUP_STEPS,
    GUARD_ATTRIBUTE,
    NO_GUARD,
    ScreenSettings,
    guard_name,
    has_guard,
    parse_guard,
)
from harness.plan import Plan
from harness.schedule import Arm
from harness.timing import SyncTimer, current_allocated, is_cuda, read_peaks, reset_peaks
from harness.trial import TrialContext, TrialFunction
from optimizers.dispatch import count_dispatched_ops

TRIAL_FIELDS = ("steps", "warmup_steps", "floor_replays", "dtype")  # what a trial reads of the settings


def trial_settings(recorded: dict[str, Any]) -> ScreenSettings:
    """What every trial of a screen does, from a plan's recorded settings."""
    return ScreenSettings(**{name: recorded[name] for name in TRIAL_FIELDS})


class WorkloadCache:
    """Parameters and gradients of one (scale, seed, dtype), drawn once on the CPU and copied per trial."""

    def __init__(self) -> None:
        self.key: tuple[str, int, torch.dtype] | None = None
        self.groups: list[dict[str, Any]] = []
        self.kwargs: dict[str, float] = {}

    def fresh(
        self, scale: str, seed: int, dtype: torch.dtype, device: str
    ) -> tuple[list[dict[str, Any]], dict]:
        """New parameter tensors with gradients on ``device``, equal to the seeded workload's values."""
        key = (scale, seed, dtype)
        if key != self.key:
            self.key, self.groups = None, []  # drop the old workload before drawing the next
            groups, self.kwargs = workloads.build_param_groups(scale, "cpu", dtype, seed)
            workloads.fill_synthetic_grads(groups, seed)
            self.groups, self.key = groups, key
        copies = []
        for group in self.groups:
            params = []
            for source in group["params"]:
                param = torch.nn.Parameter(
                    source.detach().to(device, copy=True), requires_grad=source.requires_grad
                )
                if source.grad is not None:
                    param.grad = source.grad.to(device, copy=True)
                params.append(param)
            copies.append({**group, "params": params})
        return copies, dict(self.kwargs)


def trial_function(plan: Plan) -> TrialFunction:
    """The one-device screen's trial function: one timed window and one floor per trial."""
    settings = trial_settings(plan.settings)
    cache = WorkloadCache()

    def trial(ctx: TrialContext) -> dict[str, Any]:
        groups, kwargs = cache.fresh(ctx.case.params["scale"], ctx.seed, settings.torch_dtype, ctx.device)
        return measure_step(ctx.arm, groups, kwargs, ctx.device, settings)

    return trial


def make_arm_optimizer(
    arm: Arm, groups: list[dict[str, Any]], kwargs: dict[str, float]
) -> torch.optim.Optimizer:
    """The arm's optimizer over ``groups``, its guard (if the arm has one) set on this instance only."""
    optimizer = make_optimizer(arm.spec, groups, kwargs)
    guard = arm.params.get("guard", NO_GUARD)
    if guard not in (NO_GUARD, DEFAULT_GUARD):
        setattr(optimizer, GUARD_ATTRIBUTE, parse_guard(guard))
    return optimizer


def measure_step(
    arm: Arm, groups: list[dict[str, Any]], kwargs: dict[str, float], device: str, settings: ScreenSettings
) -> dict[str, Any]:
    """Warm-up steps, the timed window, then the launch floor, on a fresh optimizer of ``arm``."""
    optimizer = make_arm_optimizer(arm, groups, kwargs)
    guard_in_effect = (
        guard_name(getattr(optimizer, GUARD_ATTRIBUTE)) if has_guard(type(optimizer)) else NO_GUARD
    )
    figures = window_figures(optimizer, device, settings)
    figures.update(launch_floor(optimizer, device, settings.floor_replays))
    figures.update(guard_in_effect=guard_in_effect, steps=settings.steps, warmup_steps=settings.warmup_steps)
    return figures


def window_figures(
    optimizer: torch.optim.Optimizer,
    device: str,
    settings: ScreenSettings,
    before_window: Callable[[], None] = lambda: None,
    after_window: Callable[[], dict[str, Any]] = dict,
) -> dict[str, Any]:
    """Warm-up steps, the timed window, an untimed step that counts its ops, and the state's bytes."""
    allocated_at_start = current_allocated(device)
    for _ in range(settings.warmup_steps):
        optimizer.step()
    before_window()
    figures = time_window(optimizer, device, settings.steps)
    figures.update(after_window())
    figures["ops_per_step"] = count_dispatched_ops(optimizer.step).total  # one more step, untimed
    at_window = figures["allocated_at_window"]
    figures["state_bytes"] = (
        None if None in (at_window, allocated_at_start) else at_window - allocated_at_start
    )
    return figures


def time_window(optimizer: torch.optim.Optimizer, device: str, steps: int) -> dict[str, Any]:
    """``steps`` steps in one synchronized bracket."""
    allocated = current_allocated(device)
    graphs_before = dict(getattr(optimizer, "graph_stats", {}))
    reset_peaks(device)
    host_ns = 0
    with SyncTimer(device) as bracket:
        for _ in range(steps):
            called = time.perf_counter_ns()
            optimizer.step()
            host_ns += time.perf_counter_ns() - called
    peak_allocated, peak_reserved = read_peaks(device)
    check_finite_step(optimizer, "the timed window")  # untimed: a NaN window fails, never looks fast
    extra = peak_allocated - allocated if peak_allocated is not None and allocated is not None else None
    graphs = {k: v - graphs_before.get(k, 0) for k, v in getattr(optimizer, "graph_stats", {}).items()}
    return {
        "window_replays": graphs.get("replayed") if graphs else None,
        "window_eager": "; ".join(f"{k} ×{v}" for k, v in sorted(graphs.items()) if v and k != "replayed")
        or None,
        "plan_bytes": getattr(optimizer, "plan_bytes", None),
        "value": bracket.seconds * 1e3 / steps,
        "window_ms": bracket.seconds * 1e3,
        "host_ms": host_ns / 1e6 / steps,
        "allocated_at_window": allocated,
        "extra_peak_bytes": extra,
        "peak_allocated": peak_allocated,
        "peak_reserved": peak_reserved,
    }


@functools.cache
def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per device for every capture of the run (its lazy per-stream set-up happens once)."""
    return torch.cuda.Stream(device)


def capture_step(optimizer: torch.optim.Optimizer, device: torch.device) -> torch.cuda.CUDAGraph:
    """One ``step()`` captured in a CUDA graph, after warm-up steps on the side stream (PyTorch's recipe)."""
    step = getattr(optimizer, "eager_step", optimizer.step)  # a step that replays its own graph: its kernels
    side = capture_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(FLOOR_WARMUP_STEPS):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # The outer stream context restores the current stream even if capture_end raises inside graph.__exit__.
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        step()
    return graph


def _reason(exc: BaseException) -> str:
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first_line}"[:200]


def _no_floor(why: str) -> dict[str, Any]:
    return {"floor_ms": None, "floor_note": f"n/a: {why}", "floor_replays": 0}


def launch_floor(optimizer: torch.optim.Optimizer, device: str, replays: int) -> dict[str, Any]:
    """ms per replay of the captured step (``floor_ms``), or None with ``floor_note`` saying why."""
    if not is_cuda(device):
        return _no_floor("CPU (CUDA graphs need a CUDA device)")
    dev = torch.device(device)
    with torch.cuda.device(dev):
        try:
            graph = capture_step(optimizer, dev)
        except Exception as exc:  # noqa: BLE001 - a step that cannot be captured is a recorded fact
            torch.cuda.synchronize(dev)
            return _no_floor(f"capture failed: {_reason(exc)}")
        try:
            graph.replay()  # the first replay uploads the graph; not timed
            with SyncTimer(dev) as bracket:
                for _ in range(replays):
                    graph.replay()
        except Exception as exc:  # noqa: BLE001
            return _no_floor(f"replay failed: {_reason(exc)}")
        finally:
            del graph
    return {"floor_ms": bracket.seconds * 1e3 / replays, "floor_note": "", "floor_replays": replays}
