"""Smaller defaults on the CPU: `bench screen` and `bench probe` end in about a minute on two cores, as
`bench pair` does. An option typed on the command line always wins; the console names what was changed."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from harness.options import resolve_device

# screen: scale n at the default guard, a window of 2 steps (the GPU defaults: every scale and guard, 10 steps).
SCREEN = {"scales": "n", "guards": "256", "steps": 2, "warmup_steps": 1}
# probe: an lm head 256 times smaller, still 4 chunks (the GPU default's one trial took over 2 min on a CPU).
PROBE = {"lm": {"tokens": 4096, "vocab": 2048, "chunk": 1024}, "detect": {"imgsz": 320, "batch": 2}}


def on_cpu(settings: Any, defaults: dict[str, Any], device: str, given: dict[str, Any], say: Any) -> Any:
    """``settings`` with ``defaults`` for the options not typed, where ``device`` resolves to the CPU."""
    if resolve_device(device)[0] != "cpu":
        return settings
    changed = {name: value for name, value in defaults.items() if name not in given}
    if changed:
        shown = " ".join(f"--{name.replace('_', '-')} {value}" for name, value in changed.items())
        say(f"CPU defaults: {shown} (about a minute on two cores; options override)")
    return replace(settings, **changed)
