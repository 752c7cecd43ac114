"""The tier contract: what a tier (screen, probe, fit, …) gives the harness, and the registry that names them.

A tier makes a ``Plan`` from the shared options and its settings, and the function that runs one trial.
It says what its runs mean: tables, a report section, caveats, a claim (``BaseTier``'s hooks).
A ``CommandSpec`` declares its ``bench`` command; ``experiments.tiers`` registers the project's tiers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.codepaths import verdict_shown
from harness.errors import InputError
from harness.folder_format import PLAN
from harness.plan import Plan
from harness.protocol_options import ProtocolOptions
from harness.tables import CorruptRunFolder, RunFolder, Summaries, summarize_trials
from harness.trial import TrialFunction
from harness.validation import check_log, load_env, load_plan

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
        summaries = summarize_trials(folder.trials(), plan.protocol)
        return cls(folder, plan, summaries, load_env(folder), figures_dir)

    def gate_failures(self) -> list[str]:
        """Why ``--gate`` fails this run (empty when it passes): a claim not cleared, an A/A not within.

        A verdict withheld fails, and so does a run with no claim."""
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
    """The folder's plan once it and the log are validated (``load_plan``, ``check_log``), each with its tier's
    own checks where ``tiers`` has it. An edited file is one ``CorruptRunFolder`` line."""
    plan = load_plan(folder)
    tier = tiers.reader(plan.tier) if tiers is not None else None
    problem = tier.settings_problem(plan) if tier is not None else None
    if problem:
        raise CorruptRunFolder(f"{folder.file(PLAN)}: {problem}")
    check_log(plan, folder, tier.row_problem if tier is not None else None)
    return plan


def gate_refusal(tier: BaseTier) -> str | None:
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


class BaseTier:
    """One tier of evidence: a name, two flags, and the hooks below, each with its default.

    A tier gives its own hooks as keywords, or overrides them in a subclass; a name of no hook is refused.
    """

    def __init__(
        self,
        name: str,
        *,
        caveats: tuple[Caveat, ...] = (),
        diagnostic: bool = False,  # synchronized inside its timed region: its figures never make a claim
        paired: bool = True,  # its rows are paired trials of arms (the harness's statistics apply)
        **hooks: Callable[..., Any],
    ) -> None:
        _refuse_unknown(name, hooks)
        self.name, self.diagnostic, self.paired, self._caveats = name, diagnostic, paired, caveats
        vars(self).update(hooks)  # a hook given replaces the method of its name

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _refuse_unknown(cls.__name__, {n: v for n, v in vars(cls).items() if callable(v) and n[0] != "_"})

    def make_plan(self, protocol: ProtocolOptions, settings: Any, command: str) -> Plan:
        """The plan of a new run, from the shared options and the tier's checked settings."""
        raise NotImplementedError(f"tier '{self.name}' builds no plan here")

    def trial_function(self, plan: Plan) -> TrialFunction:
        """The function that runs one scheduled trial of ``plan`` and returns its row."""
        raise InputError(
            f"tier '{plan.tier}' is not known here, so its trials cannot run; resume it where it was started"
        )

    def trial_seconds(self, plan: Plan) -> float | None:
        """One trial's seconds, estimated before any runs (None: the first is timed)."""
        return None

    def settings_problem(self, plan: Plan) -> str | None:
        """What is wrong with the plan's recorded settings for this tier (an edited plan.json), or None."""
        return None

    def row_problem(self, row: dict[str, Any]) -> str | None:
        """What is wrong with the fields of a log row that this tier's report reads, or None."""
        return None

    def resume_problem(self, plan: Plan) -> str | None:
        """Why a resume cannot run the plan's trials here (the start's checks again), or None."""
        return None

    def tables(self, run: Run) -> dict[str, Any]:
        """The tier's own tables of a run, by file name."""
        return {}

    def section(self, run: Run) -> Any:
        """The tier's own report section of a run (a ``Section`` or markdown; empty: none)."""
        return ""

    def claim(self, run: Run) -> str | None:
        """The tier's own lines of the run's claim, for claim.txt after the harness's answers (None: none)."""
        return None

    def bounds(self, run: Run, others: list[Run]) -> list[tuple[Run, str]]:
        """(a run of ``others``, the sentence saying it bounds this run's claims) for each that does."""
        return []

    def caveats(self, run: Run) -> list[Caveat]:
        """The caveats of a run: the tier's own, in the report and the claim."""
        return list(self._caveats)


HOOKS = frozenset(name for name in vars(BaseTier) if name[0] != "_")  # what a tier may give


def _refuse_unknown(tier: str, hooks: dict[str, Any]) -> None:
    """``TypeError`` for a name of no ``BaseTier`` hook (a misspelt hook would never be called)."""
    unknown = sorted(set(hooks) - HOOKS)
    if unknown:
        raise TypeError(f"tier '{tier}': no hook named {', '.join(unknown)}")


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
    plan: Plan | None = None  # a resume's plan, read and checked (``load_checked_plan``) before ``prepare``


@dataclass(frozen=True)
class CommandSpec:
    """A tier's ``bench`` command: its options, and the hooks around the run it starts."""

    name: str
    help: str
    tiers: tuple[BaseTier, ...]  # the tiers its runs are of, the first by default; its --resume takes each
    settings: type | None = None  # the tier's settings: each declared field is an option
    protocol: tuple[str, ...] | None = None  # the shared options it takes (None: all)
    helps: dict[str, str] = field(default_factory=dict)  # shared options reworded for this command
    argv: str = ""  # the help of the words after --; empty: it takes none
    prepare: Callable[[Start], Start] | None = None  # the start adjusted; InputError refuses it
    finish: Callable[[Any, Start], str | None] | None = None  # after the run: why it fails (exit 1)


class TierRegistry:
    """Tiers by name: how a run folder's ``plan.tier`` finds its tier; and the commands that start them."""

    def __init__(self, tiers: Iterable[BaseTier] = (), commands: Iterable[CommandSpec] = ()) -> None:
        self._commands = tuple(commands)
        self._tiers: dict[str, BaseTier] = {}
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

    def get(self, name: str) -> BaseTier:
        """The tier named ``name``, or ``InputError`` naming the tiers known here."""
        if name not in self._tiers:
            raise InputError(
                f"tier '{name}' is not known here; known tiers: {', '.join(self._tiers) or 'none'}"
            )
        return self._tiers[name]

    def reader(self, name: str) -> BaseTier:
        """The tier that reads a run folder: its own where known, else the defaults (a report still works)."""
        return self._tiers.get(name) or BaseTier(name)
