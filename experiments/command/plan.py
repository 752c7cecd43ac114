"""Your own command as a tier (``bench command``): ``{arm}`` and ``{spec}`` filled per arm (docs/tiers.md)."""

from __future__ import annotations

import re
import shlex
import string
from dataclasses import asdict, dataclass, fields
from typing import Any

from harness.calibration import runs_as
from harness.errors import InputError
from harness.plan import Plan
from harness.protocol_options import ProtocolOptions
from harness.schedule import Arm, Case
from harness.schema import check_fields, option, require
from harness.validation import settings_problem, shape_problem

PLACEHOLDERS = ("arm", "spec")
MAX_TIMEOUT = 7 * 24 * 3600  # seconds: a week
MAX_UNIT = 16  # characters
RECORDED_SHAPE = {"figure": str | None, "unit": str | None, "timeout": float | None}


def figure_pattern(text: str) -> re.Pattern[str]:
    """``--figure``: a regular expression with exactly one group (or a group named ``value``)."""
    try:
        pattern = re.compile(text, re.MULTILINE)
    except re.error as exc:
        raise InputError(f"--figure '{text}' is not a regular expression ({exc})") from None
    if "value" not in pattern.groupindex and pattern.groups != 1:
        raise InputError(
            f"--figure '{text}' has {pattern.groups} groups; give one, around the number",
            hint=r"e.g. --figure 'took ([0-9.]+) s'",
        )
    return pattern


_unit = require(
    lambda unit: unit.strip() and len(unit) <= MAX_UNIT and unit.isprintable(),
    f"--unit '{{}}' must be 1 to {MAX_UNIT} printable characters, e.g. ms",
)
_timeout = require(
    lambda t: 0 < t <= MAX_TIMEOUT, f"--timeout {{:g}} must lie between 0 and {MAX_TIMEOUT} seconds"
)


@dataclass(frozen=True)
class CommandSettings:
    """The command tier's own settings, as given and as the plan records them."""

    argv: tuple[str, ...] = ()  # the command, placeholders unexpanded (the command line's argument)
    figure: str | None = option(
        None,
        "A regular expression with one group: the figure the command prints (its last match).",
        check=figure_pattern,
    )
    unit: str | None = option(None, "The unit of the --figure, e.g. ms.", check=_unit)
    timeout: float | None = option(None, "Seconds a trial may run before it fails.", check=_timeout)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CommandSettings:
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        return cls(**{**values, "argv": tuple(values.get("argv") or ())})

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "argv": list(self.argv)}


def placeholders(token: str) -> list[str]:
    """The placeholder names in one word of the command; ``InputError`` where its braces do not parse."""
    try:
        return [name for _, name, _, _ in string.Formatter().parse(token) if name is not None]
    except ValueError as exc:
        raise InputError(
            f"the command's word '{token}' has a stray brace ({exc}); write {{{{ for a brace"
        ) from None


def expand(argv: tuple[str, ...] | list[str], arm: Arm) -> list[str]:
    """The command an arm runs: each word with ``{arm}`` and ``{spec}`` filled in."""
    return [token.format(arm=arm.label, spec=arm.spec) for token in argv]


def check_settings(settings: CommandSettings, protocol: ProtocolOptions) -> None:
    """The settings checked together and with the protocol (``InputError``), for a new run and a plan read.

    Each field's own check is ``check_fields``."""
    if not settings.argv:
        raise InputError(
            "bench command needs the command after --, e.g. bench command --arms a,b -- python train.py --opt {arm}"
        )
    for token in settings.argv:
        unknown = sorted(set(placeholders(token)) - set(PLACEHOLDERS))
        if unknown:
            raise InputError(
                f"the command's word '{token}' names {{{unknown[0]}}}; the placeholders are {{arm}} and {{spec}}"
            )
    if settings.unit is not None and settings.figure is None:
        raise InputError("--unit names the unit of a --figure; a wall time is in seconds: drop --unit")
    if settings.figure is not None and any(arm.role == "calibration" for arm in protocol.arms):
        raise InputError("--calibrate delays the command's wall time, not a --figure it prints; drop one")
    if protocol.gpus > 1:
        raise InputError(
            "--gpus: bench command runs your command once per trial; start its ranks inside it (e.g. torchrun)"
        )
    if protocol.budget is not None:
        raise InputError("--budget caps the memory of the harness's own workloads; drop it for your command")


def arm_code(case: Case, argv: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """What each arm runs (the command line with the arm filled in), and whether that is the baseline's."""
    baseline = expand(argv, case.arms[0])
    out: dict[str, dict[str, Any]] = {}
    for position, arm in enumerate(case.arms):
        line = expand(argv, runs_as(arm))
        twin = arm.label == f"{case.arms[0].label}-control" or arm.role == "calibration"
        same = position > 0 and line == baseline and not twin
        out[arm.label] = {
            "spec": arm.spec,
            "runs": f"`{shlex.join(line)}`",
            "same_path_as_baseline": "its command line is the baseline's" if same else None,
        }
    return out


def make_plan(protocol: ProtocolOptions, settings: CommandSettings, command: str = "") -> Plan:
    """The plan from the checked settings (``InputError`` where they do not fit together)."""
    check_settings(settings, protocol)
    shown = shlex.join(settings.argv)
    case = Case(shown if len(shown) <= 60 else shown[:57] + "...", {"command": shown}, protocol.arms)
    figure = settings.figure
    return Plan(
        tier="command",
        protocol=protocol,
        cases=[case],
        arm_code=arm_code(case, settings.argv),
        unit=(settings.unit or "s") if figure else "s",
        metric=f"the figure /{figure}/ the command prints" if figure else "command wall time",
        settings=settings.to_dict(),
        command=command,
        in_process=False,
        isolation="a fresh process per trial: your command, started by the harness, which only waits for it",
        timed_region=(
            "what the command itself measures and prints (its last match of --figure)"
            if figure
            else "from just before the command starts to its exit, as the parent sees it: its start-up included"
        ),
    )


def recorded_settings_problem(plan: Plan) -> str | None:
    """What is wrong with a plan's recorded command settings (None when a run could have them)."""
    problem = settings_problem(plan.settings, {"argv": list[str]}) or shape_problem(
        plan.settings, RECORDED_SHAPE, "settings"
    )
    if problem:
        return problem
    try:
        check_settings(check_fields(CommandSettings.from_dict(plan.settings)), plan.protocol)
    except InputError as exc:
        return f"settings: {exc}"
    return None
