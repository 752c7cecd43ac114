"""Trial functions defined by the tests: plain Python work the protocol can schedule, time and resume."""

from __future__ import annotations

import time

from harness.protocol import Plan, TrialContext, TrialFunction


def sleepy(plan: Plan) -> TrialFunction:
    """Each trial marks that it started, sleeps ``options['sleep']`` seconds and returns a fixed figure."""

    def trial(ctx: TrialContext) -> dict:
        (ctx.run_dir / f"started-{ctx.trial.index}").touch()
        time.sleep(plan.options.get("sleep", 0.0))
        return {"value": 10.0 if ctx.arm.role == "baseline" else 8.0, "seed_seen": ctx.seed}

    return trial


def scripted(plan: Plan) -> TrialFunction:
    """Figures looked up from ``options['figures'][arm][round]``; the string 'oom' raises a real-text OOM."""

    def trial(ctx: TrialContext) -> dict:
        figure = plan.options["figures"][ctx.arm.label][
            ctx.trial.round if ctx.trial.phase == "measured" else 0
        ]
        if figure == "oom":
            import torch

            raise torch.OutOfMemoryError(plan.options["oom_message"])
        if figure == "error":
            raise RuntimeError("the trial broke")
        return {"value": float(figure)}

    return trial
