"""A tier for the tests: plain Python work the protocol can schedule, time and resume.

``plan.settings['behaviour']`` names what each trial does (data, not code: a run folder never names code).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from experiments.fit.plan import FitSettings
from harness.plan import Plan
from harness.protocol_options import ProtocolOptions
from harness.run import Runner, RunOptions
from harness.schedule import Arm, Case
from harness.tier import BaseTier, TierRegistry
from harness.trial import TrialContext, TrialFunction

TWO_ARMS = (Arm("baseline", "baseline", "baseline"), Arm("candidate", "candidate", "candidate"))
# The fit of `tests.argv.TINY_FIT`, as a fit plan's settings.
TINY_FIT_SETTINGS = FitSettings(workload="embedded", images=8, batch=4, steps=4, val_images=8)


def sleepy(plan: Plan) -> TrialFunction:
    """Each trial marks that it started (the file holds the process id), sleeps ``settings['sleep']`` seconds
    and returns a fixed figure."""

    def trial(ctx: TrialContext) -> dict:
        (ctx.run_dir / f"started-{ctx.trial.index}").write_text(str(os.getpid()))
        time.sleep(plan.settings.get("sleep", 0.0))
        return {"value": 10.0 if ctx.arm.role == "baseline" else 8.0, "seed_seen": ctx.seed}

    return trial


def scripted(plan: Plan) -> TrialFunction:
    """Figures looked up from ``settings['figures'][arm][round]``; the string 'oom' raises a real-text OOM."""

    def trial(ctx: TrialContext) -> dict:
        figures = plan.settings["figures"][ctx.arm.label]
        figure = figures[ctx.trial.round if ctx.trial.phase == "measured" else 0]
        if figure == "oom":
            import torch

            raise torch.OutOfMemoryError(plan.settings["oom_message"])
        if figure == "error":
            raise RuntimeError("the trial broke")
        return {"value": float(figure)}

    return trial


def affinity(plan: Plan) -> TrialFunction:
    """Each trial reports the cores its process may run on (an in-process trial runs where the runner does)."""
    import os

    def trial(ctx: TrialContext) -> dict:
        return {"value": 1.0, "cores": sorted(os.sched_getaffinity(0))}

    return trial


def returns(plan: Plan) -> TrialFunction:
    """Every trial returns ``settings['returned']`` as its value, whatever it is."""
    return lambda ctx: {"value": plan.settings["returned"]}


def seeded(plan: Plan) -> TrialFunction:
    """Every trial seeds torch's global generator and a new one with its seed (as the tiers do)."""

    def trial(ctx: TrialContext) -> dict:
        import torch

        torch.manual_seed(ctx.seed)
        torch.Generator().manual_seed(ctx.seed)
        return {"value": 1.0, "seed_seen": ctx.seed}

    return trial


def warming(plan: Plan) -> TrialFunction:
    """A warm-up's figure is the next of `settings['warmups'][arm]`, the last repeating; a measured trial's is
    `settings['measured'][arm]`.

    Warm-ups are counted over the arm's warm-up rows in the log, so a resume continues the script. Each trial
    sleeps `settings['sleep']` seconds.
    """
    import json

    def trial(ctx: TrialContext) -> dict:
        log = ctx.run_dir / "trials.jsonl"
        rows = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
        time.sleep(plan.settings.get("sleep", 0.0))
        if ctx.trial.phase == "measured":
            return {"value": float(plan.settings["measured"][ctx.arm.label])}
        script = plan.settings["warmups"][ctx.arm.label]
        seen = sum(1 for r in rows if r["phase"] == "warmup" and r["arm"] == ctx.arm.label)
        return {"value": float(script[min(seen, len(script) - 1)])}

    return trial


BEHAVIOURS = {
    "warming": warming,
    "sleepy": sleepy,
    "scripted": scripted,
    "affinity": affinity,
    "returns": returns,
    "seeded": seeded,
}


TIERS = TierRegistry(
    [BaseTier("test", trial_function=lambda plan: BEHAVIOURS[plan.settings["behaviour"]](plan))]
)


def plan_of(
    behaviour: str, warmup: int | str = 2, pairs: int | str = 3, arms: tuple[Arm, ...] = TWO_ARMS, **settings
) -> Plan:
    """A one-case plan of the test tier (protocol options given as keywords go to ``ProtocolOptions``)."""
    protocol_fields = {
        "order",
        "seed",
        "bar",
        "device",
        "budget",
        "control",
        "cooldown",
        "cpus",
        "tolerance",
        "precision",
        "max_pairs",
        "time_budget",
        "warmup_tolerance",
        "max_warmup",
    }
    protocol = ProtocolOptions(
        arms, warmup=warmup, pairs=pairs, **{k: v for k, v in settings.items() if k in protocol_fields}
    )
    return Plan(
        tier="test",
        protocol=protocol,
        cases=[Case("only", {"size": 1}, arms)],
        unit="ms",
        metric="test figure",
        settings={"behaviour": behaviour, **{k: v for k, v in settings.items() if k not in protocol_fields}},
    )


def runner(out: str | Path, **options) -> Runner:
    """A quiet runner of the test tier (or of ``tiers=``), without a report, unless asked otherwise."""
    tiers = options.pop("tiers", TIERS)
    quiet, report = options.pop("quiet", True), options.pop("report", False)
    return Runner(tiers, RunOptions(out=Path(out), quiet=quiet, report=report, **options))
