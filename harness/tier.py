"""The tier contract: what a tier (screen, probe, fit, …) gives the harness, and the registry that names them.

A tier turns the shared protocol options and its own settings into a ``Plan``, makes the trial function that
runs one scheduled trial, and says what its runs mean: the tables written beside the log, the report section,
the caveats, the claim printed when a run ends. The harness knows tiers only through this contract, by the
name a plan records; ``experiments.tiers`` registers the project's tiers in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from harness.codepaths import verdict_shown
from harness.errors import InputError
from harness.protocol import Plan, ProtocolOptions, TrialFunction
from harness.tables import PLAN, CorruptRunFolder, RunFolder, Summaries, summarize_trials
from harness.validation import check_log, load_env, load_plan

if TYPE_CHECKING:  # annotations only: a trial's worker imports the tiers and no pandas
    import pandas as pd

    from harness.present.model import Section


GATE_PASSING = {"claim": ("clears",), "control": ("within",)}  # the verdicts ``--gate`` lets through


@dataclass(frozen=True)
class Caveat:
    """A caveat of a run: a headline (in the report's summary too), the detail (in the run's section) and a
    reason code (``failures``, ``unstable``, …; ``tier`` for a tier's own) that tools can filter on."""

    headline: str
    detail: str = ""
    code: str = "tier"

    def __str__(self) -> str:
        return f"{self.headline} {self.detail}".strip()


@dataclass
class Run:
    """A run folder read back: its plan, the summaries recomputed from its log, its environment.

    ``figures_dir`` is where a report draws this run's figures (None outside a report).
    """

    folder: RunFolder
    plan: Plan
    summaries: Summaries
    env: dict[str, Any]
    figures_dir: Path | None = None

    @classmethod
    def load(
        cls, folder: RunFolder, figures_dir: Path | None = None, tiers: TierRegistry | None = None
    ) -> Run:
        """Read a run folder back, every file validated first (``CorruptRunFolder``, one line, otherwise);
        with ``tiers``, the plan's settings by its own tier too (``load_checked_plan``)."""
        plan = load_checked_plan(folder, tiers)
        check_run_log(plan, folder, tiers)
        summaries = summarize_trials(folder.trials(), plan.protocol)
        return cls(folder, plan, summaries, load_env(folder), figures_dir)

    def gate_failures(self) -> list[str]:
        """Why ``--gate`` fails this run (empty when it passes): a claim that does not clear its bar (fails, is
        insufficient or ambiguous, or has no bar), a verdict withheld (the arm ran the baseline's code) or an
        A/A arm that is not within its tolerance; a run with no claim at all fails too."""
        claims = self.summaries.claims
        if claims.empty:
            return ["no complete pair: no claim to gate on"]
        out = []
        for _, claim in claims.iterrows():
            kind = str(claim.get("kind", "claim"))
            verdict = verdict_shown(self.plan, str(claim["arm"]), str(claim["verdict"]))
            if verdict not in GATE_PASSING.get(kind, ("clears",)):
                where = f"{claim['case']}: " if claims["case"].nunique() > 1 else ""
                out.append(f"{where}{claim['arm']} vs {claim['baseline_arm']} ({kind}): {verdict}")
        return out


def load_checked_plan(folder: RunFolder, tiers: TierRegistry | None) -> Plan:
    """The folder's plan, validated (``load_plan``) and, where ``tiers`` knows its tier, its settings checked by
    that tier (``Tier.settings_problem``): an edited tier name or setting is one ``CorruptRunFolder`` line."""
    plan = load_plan(folder)
    problem = tiers.reader(plan.tier).settings_problem(plan) if tiers is not None else None
    if problem:
        raise CorruptRunFolder(f"{folder.file(PLAN)}: {problem}")
    return plan


def check_run_log(plan: Plan, folder: RunFolder, tiers: TierRegistry | None) -> list[dict[str, Any]]:
    """The folder's log rows, validated (``check_log``) and, where ``tiers`` knows the plan's tier, the fields its
    report reads checked by that tier (``Tier.row_problem``)."""
    return check_log(plan, folder, tiers.reader(plan.tier).row_problem if tiers is not None else None)


def gate_refusal(tier: Tier) -> str | None:
    """Why ``--gate`` cannot judge a run of this tier (None where it can): it judges paired claims only."""
    if tier.diagnostic:
        return "diagnostic"
    if not tier.paired:
        return "no paired claims"
    return None


def check_gate_threshold(protocol: ProtocolOptions, resuming: bool = False) -> None:
    """``InputError`` where ``--gate`` could only fail a run of ``protocol``: claims with no bar, or an A/A arm
    with no tolerance. Said before the run, not found after it."""
    from harness.stats import ClaimSettings  # the parent's only: pandas

    settings = ClaimSettings.from_protocol(protocol)
    has_claims = len(protocol.arms) > (2 if protocol.control else 1)
    aa_option = "--tolerance" if has_claims else "--bar"  # an A/A run alone reads --bar as its tolerance
    for missing, judged, option, example in (
        (has_claims and settings.bar_percent is None, "each claim", "--bar", "5"),
        (protocol.control and settings.tolerance_percent is None, "the A/A arm", aa_option, "1"),
    ):
        if missing:
            instead = (
                " (a resume keeps the plan's): drop --gate"
                if resuming
                else f": give {option} {example}, or drop --gate"
            )
            raise InputError(f"--gate judges {judged} against {option}, and the run has none{instead}")


class Tier(Protocol):
    """One tier of evidence. ``BaseTier`` gives the defaults; a tier overrides what it has."""

    name: str
    diagnostic: bool  # synchronized inside its timed region: its figures explain a claim, never make one
    paired: bool  # its rows are paired trials of arms (the harness's statistics apply)

    def make_plan(self, protocol: ProtocolOptions, settings: Any, command: str) -> Plan: ...

    def trial_function(self, plan: Plan) -> TrialFunction: ...

    def trial_seconds(self, plan: Plan) -> float | None:
        """The tier's own estimate of one trial's seconds before any runs (None: the first trial is probed)."""
        ...

    def settings_problem(self, plan: Plan) -> str | None:
        """What is wrong with a plan's recorded settings for this tier (None when a run of it could have them)."""
        ...

    def row_problem(self, row: dict[str, Any]) -> str | None:
        """What is wrong with a log row's fields this tier's report reads (the row's structure is checked
        already), as one sentence naming the trial; None when its report can read them."""
        ...

    def resume_problem(self, plan: Plan) -> str | None:
        """Why a resume cannot run a plan's trials here (None where it can): the start's checks of the code
        a plan names, made again, since a folder can be edited."""
        ...

    def tables(self, run: Run) -> dict[str, pd.DataFrame]: ...

    def section(self, run: Run) -> Section | str: ...

    def caveats(self, run: Run) -> list[Caveat]: ...

    def claim(self, run: Run) -> str | None: ...

    def bounds(self, run: Run, others: Sequence[Run]) -> list[tuple[Run, str]]:
        """What other runs of one report say bounds this run's claims: (that run, the sentence)."""
        ...


class BaseTier:
    """A tier assembled from its hook functions; a hook left out takes the default (no tables, no section, no
    claim of its own; paired, not diagnostic). Subclass it for a hook that needs more than a function."""

    def __init__(
        self,
        name: str,
        *,
        make_plan: Callable[[ProtocolOptions, Any, str], Plan] | None = None,
        trial_function: Callable[[Plan], TrialFunction] | None = None,
        trial_seconds: Callable[[Plan], float | None] | None = None,
        settings_problem: Callable[[Plan], str | None] | None = None,
        row_problem: Callable[[dict[str, Any]], str | None] | None = None,
        resume_problem: Callable[[Plan], str | None] | None = None,
        tables: Callable[[Run], dict[str, pd.DataFrame]] | None = None,
        section: Callable[[Run], Section | str] | None = None,
        claim: Callable[[Run], str | None] | None = None,
        bounds: Callable[[Run, Sequence[Run]], list[tuple[Run, str]]] | None = None,
        caveats: tuple[Caveat, ...] = (),
        diagnostic: bool = False,
        paired: bool = True,
    ) -> None:
        self.name, self.diagnostic, self.paired = name, diagnostic, paired
        self._make_plan, self._trial_function = make_plan, trial_function
        self._tables, self._section, self._claim, self._caveats = tables, section, claim, caveats
        self._bounds, self._settings_problem, self._row_problem = bounds, settings_problem, row_problem
        self._resume_problem, self._trial_seconds = resume_problem, trial_seconds

    def make_plan(self, protocol: ProtocolOptions, settings: Any, command: str) -> Plan:
        if self._make_plan is None:
            raise NotImplementedError(f"tier '{self.name}' builds no plan here")
        return self._make_plan(protocol, settings, command)

    def trial_function(self, plan: Plan) -> TrialFunction:
        if self._trial_function is None:
            raise InputError(
                f"tier '{plan.tier}' is not known here, so its trials cannot run; resume it where it was started"
            )
        return self._trial_function(plan)

    def trial_seconds(self, plan: Plan) -> float | None:
        return self._trial_seconds(plan) if self._trial_seconds else None

    def settings_problem(self, plan: Plan) -> str | None:
        return self._settings_problem(plan) if self._settings_problem else None

    def row_problem(self, row: dict[str, Any]) -> str | None:
        return self._row_problem(row) if self._row_problem else None

    def resume_problem(self, plan: Plan) -> str | None:
        return self._resume_problem(plan) if self._resume_problem else None

    def tables(self, run: Run) -> dict[str, pd.DataFrame]:
        return self._tables(run) if self._tables else {}

    def section(self, run: Run) -> str:
        return self._section(run) if self._section else ""

    def caveats(self, run: Run) -> list[Caveat]:
        return list(self._caveats)

    def claim(self, run: Run) -> str | None:
        return self._claim(run) if self._claim else None

    def bounds(self, run: Run, others: Sequence[Run]) -> list[tuple[Run, str]]:
        return self._bounds(run, others) if self._bounds else []


@dataclass(frozen=True)
class Start:
    """A tier command's call, as its ``prepare`` hook reads and adjusts it before the run starts."""

    tier: str  # the tier the run is of
    protocol: dict[str, Any] | ProtocolOptions | None  # the shared options as typed, or built whole
    settings: Any
    resume: Path | None  # the run folder a resume continues
    given: dict[str, Any]  # the options typed on the command line, by name
    out: Path
    report: bool = True
    argv: tuple[str, ...] = ()  # the words after --
    say: Callable[[str], Any] = print


@dataclass(frozen=True)
class CommandSpec:
    """A tier's ``bench`` command: its options, and the hooks around the run it starts."""

    name: str
    help: str
    tiers: tuple[Tier, ...]  # the tiers its runs are of, the first by default; its --resume takes each
    settings: type | None = None  # the tier's settings: each declared field is an option
    protocol: tuple[str, ...] | None = None  # the shared options it takes (None: all)
    helps: dict[str, str] = field(default_factory=dict)  # shared options reworded for this command
    argv: str = ""  # the help of the words after --; empty: it takes none
    prepare: Callable[[Start], Start] | None = None  # the start adjusted; InputError refuses it
    finish: Callable[[Any, Start], str | None] | None = None  # after the run: why it fails (exit 1)


class TierRegistry:
    """Tiers by name: how a run folder's ``plan.tier`` finds its tier; and the commands that start them."""

    def __init__(self, tiers: Iterable[Tier] = (), commands: Iterable[CommandSpec] = ()) -> None:
        self._commands = tuple(commands)
        self._tiers: dict[str, Tier] = {}
        for tier in [*(t for c in self._commands for t in c.tiers), *tiers]:
            if tier.name in self._tiers:
                raise ValueError(f"two tiers are named '{tier.name}'")
            self._tiers[tier.name] = tier

    def commands(self) -> tuple[CommandSpec, ...]:
        return self._commands

    def names(self) -> tuple[str, ...]:
        return tuple(self._tiers)

    def __contains__(self, name: str) -> bool:
        return name in self._tiers

    def get(self, name: str) -> Tier:
        """The tier named ``name``, or ``InputError`` naming the tiers known here."""
        if name not in self._tiers:
            raise InputError(
                f"tier '{name}' is not known here; known tiers: {', '.join(self._tiers) or 'none'}"
            )
        return self._tiers[name]

    def reader(self, name: str) -> Tier:
        """The tier that reads a run folder: its own where known, else the defaults (a report still works)."""
        return self._tiers.get(name) or BaseTier(name)
