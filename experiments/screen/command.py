"""``bench screen``: the optimizer-only crossover screen, with smaller defaults on the CPU."""

from __future__ import annotations

from dataclasses import replace

from experiments import cpu_defaults
from experiments.screen import TIER
from experiments.screen.plan import ScreenSettings
from harness.tier import CommandSpec, Start

# Scale n at the default guard, a window of 2 steps (the GPU defaults: every scale and guard, 10 steps).
CPU_DEFAULTS = {"scales": "n", "guards": "256", "steps": 2, "warmup_steps": 1}


def _prepare(start: Start) -> Start:
    if start.resume is not None:
        return start
    settings = cpu_defaults.on_cpu(start.settings, CPU_DEFAULTS, start)
    return replace(start, settings=settings)


COMMAND = CommandSpec(
    "screen",
    "Optimizer-only crossover screen over YOLO26 scales and padding guards.",
    tiers=(TIER,),
    settings=ScreenSettings,
    prepare=_prepare,
)
