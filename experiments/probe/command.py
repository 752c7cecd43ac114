"""``bench probe``: head-memory probes, with smaller heads on the CPU."""

from __future__ import annotations

from dataclasses import replace

from experiments import cpu_defaults
from experiments.probe import TIER
from experiments.probe.plan import ProbeSettings
from harness.tier import CommandSpec, Start

# An lm head 256 times smaller, still 4 chunks (the GPU default's one trial took over 2 min on a CPU).
CPU_DEFAULTS = {"lm": {"tokens": 4096, "vocab": 2048, "chunk": 1024}, "detect": {"imgsz": 320, "batch": 2}}


def _prepare(start: Start) -> Start:
    defaults = CPU_DEFAULTS.get(start.settings.head)
    if start.resume is not None or defaults is None:
        return start
    return replace(start, settings=cpu_defaults.on_cpu(start.settings, defaults, start))


COMMAND = CommandSpec(
    "probe",
    "Head-memory probes under a device budget; out-of-memory is a recorded result.",
    tiers=(TIER,),
    settings=ProbeSettings,
    prepare=_prepare,
)
