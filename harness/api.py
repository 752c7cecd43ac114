"""A small Python API, the one the CLI uses: paired trials of your own functions, with the same protocol,
statistics, run folder and report as every ``bench`` command.

    from harness.api import compare

    result = compare({"baseline": old_step, "candidate": new_step}, pairs=6, bar=5, device="cuda")
    print(result)              # the answer in one sentence per claim (result.answers), then the run folder
    result.claims              # the claims table (pandas)
    result.report()            # report.md in the run folder

Each function is called with no argument inside one synchronized bracket (``harness.timing.SyncTimer``) and
its wall seconds are the trial's figure; a function may instead return a mapping with a ``value`` (and any
other figures) to report its own. ``Runner`` carries runs of any registered ``Tier`` (the CLI's way in).
"""

from __future__ import annotations

import inspect
import numbers
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness.console import console, errors
from harness.options import (
    MAX_COOLDOWN,
    MAX_PAIRS,
    MAX_SEED,
    InputError,
    check_bar,
    check_choice,
    check_device,
    check_non_negative,
    check_positive,
    parse_warmup,
)
from harness.protocol import ORDERS, Arm, Case, Plan, ProtocolOptions, TrialContext, TrialFunction
from harness.run import Runner, RunOptions
from harness.sentence import answers
from harness.tables import RunFolder, unnameable
from harness.tier import BaseTier, Run, TierRegistry
from harness.timing import SyncTimer
from harness.validation import load_plan

__all__ = ["FunctionTier", "Result", "RunOptions", "Runner", "compare"]


class FunctionTier(BaseTier):
    """A tier whose arms are Python callables handed over at run time: the run folder names them by label only,
    so a resume needs the same callables again (``compare(..., resume=folder)``)."""

    NAME = "function"

    def __init__(self, functions: Mapping[str, Callable[[], Any]]) -> None:
        super().__init__(self.NAME)
        self.functions = dict(functions)

    def trial_function(self, plan: Plan) -> TrialFunction:
        device = plan.protocol.device

        def trial(ctx: TrialContext) -> dict[str, Any]:
            function = self.functions[ctx.arm.spec]
            with SyncTimer(device) as bracket:
                returned = function()
            if isinstance(returned, Mapping) and "value" in returned:
                return dict(returned)
            return {"value": bracket.seconds}

        return trial


@dataclass
class Result:
    """A finished (or stopped) run: its folder, plan and summaries, with the claim in words."""

    run: Run
    tiers: TierRegistry

    @property
    def folder(self) -> Path:
        return self.run.folder.path

    @property
    def arms(self) -> pd.DataFrame:
        return self.run.summaries.arms

    @property
    def pairs(self) -> pd.DataFrame:
        return self.run.summaries.pairs

    @property
    def claims(self) -> pd.DataFrame:
        return self.run.summaries.claims

    def verdict(self, arm: str | None = None) -> str:
        """The verdict of one arm's claim (the first candidate arm's by default)."""
        claims = self.claims if arm is None else self.claims[self.claims["arm"] == arm]
        return str(claims["verdict"].iloc[0]) if len(claims) else "no pairs"

    def report(self, output: Path | None = None) -> Path:
        """Write the markdown report (``report.md`` in the run folder unless ``output`` says otherwise)."""
        from harness.report import write_report

        return write_report([self.run.folder], self.tiers, output)

    @property
    def answers(self) -> list[str]:
        """The answer of each claim in one sentence, as the console, claim.txt and the report say it."""
        return answers(self.run.plan, self.run.summaries.claims)

    def __str__(self) -> str:
        return "\n".join([*self.answers, f"run folder: {self.folder}"])


def _check_functions(functions: Any) -> list[str]:
    """The labels of ``functions``, or ``InputError`` (before any folder) unless it maps text labels to
    callables: a plan names each arm by its label, and a trial calls its function."""
    if not isinstance(functions, Mapping):
        raise InputError(
            "functions must be a mapping of label to callable, e.g. {'baseline': old_step, 'candidate': "
            f"new_step}}, not {type(functions).__name__}"
        )
    for label, function in functions.items():
        if not isinstance(label, str) or not label.strip():
            raise InputError(f"function labels are text: {label!r} is not")
        if not callable(function):
            raise InputError(f"functions[{label!r}] is {function!r}, not a callable")
    return list(functions)


def _checked_out(out: Any) -> Path:
    """``out`` as a folder path, or ``InputError``: text or a path, not empty (the CLI's own rule)."""
    if not isinstance(out, (str, os.PathLike)):
        raise InputError(f"out {out!r} is not a folder path (text or a Path), e.g. 'runs'")
    why = unnameable(os.fspath(out))
    if why:
        raise InputError(f"out '{out}': {why}; give a writable folder, e.g. 'runs'")
    return Path(out)


def _check_resume(resume: str | Path, labels: list[str], given: dict[str, Any]) -> None:
    """``InputError`` unless a resume is given the run's own functions and no option of its own (a resume
    keeps the run's): other functions would log every trial left as a failure, used up for good."""
    plan = load_plan(RunFolder.open(resume))
    if plan.tier != FunctionTier.NAME:
        raise InputError(
            f"resume: {resume} is a '{plan.tier}' run, not one compare started; resume it with bench"
        )
    started = list(dict.fromkeys(arm.spec for arm in plan.protocol.arms))
    if labels != started:
        raise InputError(
            f"resume needs the functions the run started with: {', '.join(started)} (in that order)"
        )
    if given:
        raise InputError(f"resume keeps the run's options; drop {', '.join(f'{k}=' for k in given)}")


def compare(
    functions: Mapping[str, Callable[[], Any]],
    *,
    warmup: int | str = ProtocolOptions.default("warmup"),
    pairs: int = ProtocolOptions.default("pairs"),
    order: str = ProtocolOptions.default("order"),
    seed: int = ProtocolOptions.default("seed"),
    bar: float | None = None,
    control: bool = False,
    device: str = "cpu",
    cooldown: float = ProtocolOptions.default("cooldown"),
    name: str = "functions",
    metric: str = "call time",
    unit: str = "s",
    out: str | Path = "runs",
    quiet: bool = True,
    report: bool = False,
    resume: str | Path | None = None,
) -> Result:
    """Paired trials of ``functions`` (label → callable; the first is the baseline), run and summarized.

    The options mean what the CLI's do; ``resume`` continues a run folder this function started, with the same
    callables.
    """
    labels = _check_functions(functions)
    tier = FunctionTier(functions)
    tiers = TierRegistry([tier])
    runner = Runner(tiers, RunOptions(out=_checked_out(out), quiet=quiet, report=report))
    with silenced(quiet):
        return _compare(runner, tiers, labels, locals())


@contextmanager
def silenced(quiet: bool) -> Iterator[None]:
    """Nothing printed while ``quiet`` (the API's default): the result says it all. Errors still raise."""
    saved = console.quiet, errors.quiet
    console.quiet = errors.quiet = quiet or console.quiet
    try:
        yield
    finally:
        console.quiet, errors.quiet = saved


def _compare(runner: Runner, tiers: TierRegistry, labels: list[str], given: dict[str, Any]) -> Result:
    """``compare`` once its console is set: ``given`` holds its arguments."""
    warmup, pairs, order, seed, bar = (given[k] for k in ("warmup", "pairs", "order", "seed", "bar"))
    control, device, cooldown, name = (given[k] for k in ("control", "device", "cooldown", "name"))
    metric, unit, out, resume, tier = (given[k] for k in ("metric", "unit", "out", "resume", "tier"))
    if resume is not None:  # a resume keeps the run's options: any given beside it is refused
        options = dict(
            warmup=warmup, pairs=pairs, order=order, seed=seed, bar=bar, control=control, device=device,
            cooldown=cooldown, name=name, metric=metric, unit=unit, out=out,
        )  # fmt: skip
        defaults = inspect.signature(compare).parameters
        given = {option: value for option, value in options.items() if value != defaults[option].default}
        _check_resume(resume, labels, given)
        return Result(runner.resume(resume), tiers)
    if not labels or (len(labels) < 2 and not control):
        raise InputError(
            "compare needs two or more functions (the first is the baseline), or one with control=True"
        )
    if control and len(labels) > 1:
        raise InputError(
            "control=True runs the first function against itself (an A/A run); give it one function, or "
            "compare several without control"
        )
    for option, value in (("pairs", pairs), ("seed", seed)):  # not `name`: that is the case's name
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"{option} {value!r} is not a whole number")
    if isinstance(cooldown, bool) or not isinstance(cooldown, numbers.Real):
        raise InputError(f"cooldown {cooldown!r} is not a number of seconds")
    if bar is not None and (isinstance(bar, bool) or not isinstance(bar, numbers.Real)):
        raise InputError(f"bar {bar!r} is not a number (a percentage, e.g. 5)")
    if control:
        arms = (Arm(labels[0], "baseline", labels[0]), Arm(f"{labels[0]}-control", "candidate", labels[0]))
    else:
        arms = tuple(
            Arm(label, "baseline" if i == 0 else "candidate", label) for i, label in enumerate(labels)
        )
    protocol = ProtocolOptions(
        arms=arms,
        warmup=parse_warmup(warmup, "warmup"),
        pairs=check_positive("pairs", pairs, MAX_PAIRS),
        order=check_choice("order", order, ORDERS),
        seed=int(check_non_negative("seed", seed, MAX_SEED)),
        bar=check_bar(bar, control),
        device=check_device(device),
        control=control,
        cooldown=float(check_non_negative("cooldown", cooldown, MAX_COOLDOWN)),
    )
    plan = Plan(
        tier=tier.name,
        protocol=protocol,
        cases=[Case(name, {}, arms)],
        unit=unit,
        metric=metric,
        isolation="in-process; each call inside one synchronized bracket",
        timed_region="one call of the arm's function, synchronized at both ends",
    )
    return Result(runner.start(plan), tiers)
