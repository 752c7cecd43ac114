"""``bench parity``: the numerical contract of candidate against baseline, as a run folder."""

from __future__ import annotations

from dataclasses import replace

from experiments import parity
from harness.options import check_gpus, resolve_device, split_device_list
from harness.protocol_options import ProtocolOptions, check_protocol
from harness.schedule import Arm
from harness.tier import CommandSpec, Start


def _prepare(start: Start) -> Start:
    """The two arms into the settings; a new run's protocol built here: one trial per step, no warm-up."""
    baseline, candidate = parity.arms_of(start.protocol["arms"], start.settings.candidate)
    start = replace(start, settings=replace(start.settings, candidate=candidate, baseline=baseline))
    if start.resume is not None:
        return replace(start, protocol=None)
    first, gpus = split_device_list(start.protocol["device"], start.protocol["gpus"])
    device, why = resolve_device(first)
    start.say(f"device: {device} ({why})")
    arms = (Arm(baseline, "baseline", baseline), Arm(candidate, "candidate", candidate))
    options = ProtocolOptions(
        arms, warmup=0, pairs=start.settings.steps, seed=start.protocol["seed"], device=device, gpus=gpus
    )
    check_gpus(check_protocol(options).gpus, device)
    return replace(start, protocol=options)


def _finish(result: object, start: Start) -> str | None:
    if parity.result_of(result).holds:
        return None
    where = "see the report" if start.report else f"bench report {result.folder.path} writes the report"
    return f"the one-step contract is broken ({where})"


COMMAND = CommandSpec(
    "parity",
    "The numerical contract of candidate against baseline, as a run folder (exit 1 when it breaks).",
    tiers=(parity.TIER,),
    settings=parity.ParitySettings,
    protocol=("arms", "seed", "device", "gpus"),
    helps={
        "arms": "baseline,candidate (default baseline,candidate); each built with muon, sgd and its own "
        "keywords.",
        "seed": "Seed for the parameters, gradients and data.",
        "gpus": "Also follow the candidate on N ranks (fresh processes; gloo on the CPU) against the "
        "one-rank candidate.",
    },
    prepare=_prepare,
    finish=_finish,
)
