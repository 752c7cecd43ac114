"""One trial of the command tier: the command in a fresh process, timed from its start to its exit."""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import asdict
from typing import Any

from experiments.command.plan import CommandSettings
from harness.placement import worker_environment
from harness.protocol import Plan, TrialContext, TrialFunction
from harness.telemetry import USAGE_KEY, wait_and_reap


def argv_for(settings: CommandSettings, label: str, spec: str) -> list[str]:
    """The command's words with ``{arm}`` as the arm's spec and ``{label}`` as its label."""
    return [word.replace("{arm}", spec).replace("{label}", label) for word in settings.argv]


def figure_of(output: str, pattern: str) -> float:
    """The last match's first group as a number; ValueError (the trial's error) where there is none."""
    matches = re.findall(pattern, output)
    if not matches:
        raise ValueError(f"--figure {pattern!r} matched nothing in the command's output")
    last = matches[-1]
    return float(last[0] if isinstance(last, tuple) else last)


def run_command(argv: list[str], ctx: TrialContext, timeout: float | None) -> tuple[float, str, dict]:
    """Run ``argv`` once, its output in the trial's log; (wall seconds, output, its whole-life usage)."""
    log = ctx.run_dir / "trials" / f"{ctx.trial.index}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **(worker_environment(ctx.placement) if ctx.placement else {})}
    cores = ctx.placement.worker_cores if ctx.placement else None
    preexec = (lambda: os.sched_setaffinity(0, cores)) if cores and hasattr(os, "sched_setaffinity") else None
    with open(log, "wb") as output:
        start = time.perf_counter_ns()
        process = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, env=env, preexec_fn=preexec)
        try:
            usage = wait_and_reap(process, timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            wait_and_reap(process)
            raise TimeoutError(f"the command ran past --timeout {timeout:g} s") from None
        except BaseException:
            process.kill()
            process.wait()
            raise
        seconds = (time.perf_counter_ns() - start) / 1e9
    text = log.read_text(errors="replace")
    if process.returncode != 0:
        last = next((line for line in reversed(text.splitlines()) if line.strip()), "no output")
        raise RuntimeError(f"the command exited {process.returncode}: {last.strip()[:200]}")
    return seconds, text, asdict(usage)


def trial_function(plan: Plan) -> TrialFunction:
    settings = CommandSettings(**plan.settings)

    def trial(ctx: TrialContext) -> dict[str, Any]:
        argv = argv_for(settings, ctx.arm.label, ctx.arm.spec)
        seconds, output, usage = run_command(argv, ctx, settings.timeout)
        value = figure_of(output, settings.figure) if settings.figure else seconds
        return {"value": value, "wall_s": seconds, USAGE_KEY: usage}

    return trial
