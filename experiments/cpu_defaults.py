"""Smaller defaults on the CPU: `bench screen` and `bench probe` end in about a minute on two cores.

An option typed on the command line always wins; the console names what was changed."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from harness.options import resolve_device
from harness.tier import Start


def on_cpu(settings: Any, defaults: dict[str, Any], start: Start) -> Any:
    """``settings`` with ``defaults`` for the options not typed, where the device resolves to the CPU."""
    if resolve_device(start.protocol["device"])[0] != "cpu":
        return settings
    changed = {name: value for name, value in defaults.items() if name not in start.given}
    if changed:
        shown = " ".join(f"--{name.replace('_', '-')} {value}" for name, value in changed.items())
        start.say(f"CPU defaults: {shown} (about a minute on two cores; options override)")
    return replace(settings, **changed)
