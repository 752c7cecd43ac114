"""A small Python API: paired trials of your own functions.

The protocol, statistics, run folder and report are every ``bench`` command's.
Each function is called with no argument inside one synchronized bracket (``harness.timing.SyncTimer``).
Its wall seconds are the trial's figure, unless it returns a mapping with a ``value`` (and other figures).
For example:

    >>> result = compare({"baseline": old_step, "candidate": new_step}, pairs=6, bar=5)
    >>> print(result)  # one sentence per claim, then the run folder
    >>> result.report()  # report.md in the run folder; result.claims is the claims table
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness.console import console, errors, shown_path
from harness.errors import InputError
from harness.options import check_device
from harness.plan import Plan
from harness.protocol_options import ProtocolOptions, check_protocol
from harness.report import write_report
from harness.run import Runner, RunOptions
from harness.schedule import Arm, Case
from harness.schema import named, parse_typed
from harness.sentence import answers
from harness.tables import RunFolder, unnameable
from harness.tier import BaseTier, Run, TierRegistry
from harness.timing import SyncTimer
from harness.trial import TrialContext, TrialFunction
from harness.validation import load_plan

__all__ = ["FunctionTier", "Result", "compare"]


class FunctionTier(BaseTier):
    """A tier whose arms are Python callables handed over at run time.

    The run folder names them by label only: a resume needs the same callables again.
    """

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
        return write_report([self.run.folder], self.tiers, output)

    @property
    def answers(self) -> list[str]:
        """The answer of each claim in one sentence, as the console, claim.txt and the report say it."""
        return answers(self.run.plan, self.run.summaries.claims)

    def __str__(self) -> str:
        return "\n".join([*self.answers, f"run folder: {shown_path(self.folder)}"])

    def __repr__(self) -> str:
        return f"Result(folder={shown_path(self.folder)!r})"


def _check_functions(functions: Any) -> list[str]:
    """The labels of ``functions``; ``InputError`` before any folder unless it maps labels to callables."""
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
    """``InputError`` unless a resume is given the run's own functions and no option (it keeps the run's).

    Other functions would log every trial left as a failure, used up for good."""
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
    if given["resume"] is not None:  # a resume keeps the run's options: any given beside it is refused
        defaults = inspect.signature(compare).parameters
        kept = ("warmup", "pairs", "order", "seed", "bar", "control", "device", "cooldown", "name", "metric")
        changed = {k: given[k] for k in (*kept, "unit", "out") if given[k] != defaults[k].default}
        _check_resume(given["resume"], labels, changed)
        return Result(runner.resume(given["resume"]), tiers)
    control = given["control"]
    if not labels or (len(labels) < 2 and not control):
        raise InputError(
            "compare needs two or more functions (the first is the baseline), or one with control=True"
        )
    if control and len(labels) > 1:
        raise InputError(
            "control=True runs the first function against itself (an A/A run); give it one function, or "
            "compare several without control"
        )
    arms = tuple(Arm(label, "baseline" if i == 0 else "candidate", label) for i, label in enumerate(labels))
    arms += (Arm(f"{labels[0]}-control", "candidate", labels[0]),) if control else ()
    keys = ("warmup", "pairs", "order", "seed", "bar", "device", "control", "cooldown")
    keywords = parse_typed(ProtocolOptions, {k: given[k] for k in keys}, prefix="")
    protocol = check_protocol(ProtocolOptions(arms, **keywords), prefix="")  # the CLI's one check
    try:
        check_device(protocol.device)
    except InputError as exc:
        raise InputError(named(str(exc), "")) from None
    plan = Plan(
        tier=given["tier"].name,
        protocol=protocol,
        cases=[Case(given["name"], {}, arms)],
        unit=given["unit"],
        metric=given["metric"],
        isolation="in-process; each call inside one synchronized bracket",
        timed_region="one call of the arm's function, synchronized at both ends",
    )
    return Result(runner.start(plan), tiers)
