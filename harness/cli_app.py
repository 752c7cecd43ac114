"""The ``bench`` app, and its commands made from the options they declare (``harness.schema``)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import shlex
import sys
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from harness.console import errors
from harness.errors import InputError
from harness.protocol import PlannedStop
from harness.protocol_options import ProtocolOptions
from harness.run import RunInterrupted, RunOptions
from harness.schema import SAME, check_fields, declared, flag_of, option, require
from harness.tables import unnameable
from harness.tier import CommandSpec


def new_app() -> typer.Typer:
    """The ``bench`` app, with no command yet."""
    return typer.Typer(
        name="bench",
        help="Paired, synchronized benchmarks of MuSGD implementations: screen, probe, complete fits, "
        "parity, reports.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )


_stop_after = require(
    lambda seconds: seconds > 0, "--stop-after must be a positive number of seconds (got {})"
)


@dataclass(frozen=True)
class RunArgs:
    """The run options as given: where, how, resume or not."""

    resume: Path | None = option(
        None, "Continue an interrupted run folder where it stopped (its saved plan wins)."
    )
    # Taken as text: a Path option turns an empty --out into '.', the current folder.
    out: Path = option(
        Path("runs"), "Folder under which run folders are created.", cli_type=str, cli_default="runs"
    )
    stop_after: float | None = option(
        None,
        "Stop cleanly (exit 130) before a trial that would not end within this many seconds of the command's "
        "start (estimated from the log, or an untimed first trial); continue with --resume.",
        check=_stop_after,
    )
    quiet: bool = option(
        False, "No live progress bar: one plain line per trial (for CI logs).", flag="--quiet"
    )
    gate: bool = option(
        False,
        "Exit 1 when a claim fails, is insufficient or ambiguous, or an A/A arm is not within its tolerance.",
        flag="--gate",
    )
    no_report: bool = option(False, "Do not write the markdown report when the run ends.", flag="--no-report")
    command: str = ""  # the command's name (pair, screen, …)
    given: dict[str, Any] = field(default_factory=dict)  # options typed on the command line, by name

    def options(self) -> RunOptions:
        check_fields(self)
        return RunOptions(
            out=self.out, quiet=self.quiet, report=not self.no_report, stop_after=self.stop_after
        )


def interruptible(func: Callable[..., Any], outside_a_run: str = "before any run folder was written") -> Any:
    """A command that says on stderr what Ctrl-C or SIGTERM interrupted, and where the run folder is.

    Typer would exit 130 without a word."""

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except KeyboardInterrupt as interrupt:
            if isinstance(interrupt, RunInterrupted):
                errors.print(f"bench: {interrupt}")
            elif not isinstance(interrupt, PlannedStop):  # a planned stop has said where it stopped
                errors.print(f"bench: interrupted {outside_a_run}".rstrip())
            raise

    return command


TierStart = Callable[[CommandSpec, dict[str, Any], RunArgs, Any, tuple[str, ...]], Any]


def add_tier_command(app: typer.Typer, spec: CommandSpec, start: TierStart) -> None:
    """Command ``spec.name``: the words after -- (where it takes them), its settings' options, the shared
    options it names, then the run options; ``start`` gets their values."""
    shared = parameters(ProtocolOptions, spec.protocol, spec.helps)
    declared = parameters(spec.settings) if spec.settings is not None else []
    run_options = parameters(RunArgs)
    argv = typer.Argument(help=spec.argv, show_default=False)
    own = [_keyword("argv", Annotated[list[str] | None, argv], None)] if spec.argv else []

    @interruptible
    def command(context: typer.Context, **values: Any) -> Any:
        typed = {
            key: value
            for key, value in values.items()
            if getattr(context.get_parameter_source(key), "name", "") == "COMMANDLINE"
        }
        protocol = {p.name: values[p.name] for p in shared}
        run_values = {p.name: values[p.name] for p in run_options}
        why = unnameable(run_values["out"])
        if why:
            raise InputError(f"--out '{run_values['out']}': {why}; give a writable folder")
        run_values["out"] = Path(run_values["out"])
        run = RunArgs(**run_values, command=spec.name, given=typed)
        settings = None
        if spec.settings is not None:
            settings = settings_from(spec.settings, {p.name: values[p.name] for p in declared})
        return start(spec, protocol, run, settings, tuple(values.get("argv") or ()))

    context = _keyword("context", typer.Context, inspect.Parameter.empty)
    _register(app, spec.name, spec.help, command, [*own, *declared, *shared, *run_options, context])


def add_options_command(app: typer.Typer, name: str, settings: type, func: Callable[..., Any]) -> None:
    """Command ``name`` running ``func``: its own parameters, then ``settings``' options."""
    declared = parameters(settings)

    def command(**values: Any) -> Any:
        typed = settings_from(settings, {p.name: values.pop(p.name) for p in declared})
        return func(settings=check_fields(typed), **values)

    hints = typing.get_type_hints(func, include_extras=True)
    own = [
        _keyword(p.name, hints[p.name], p.default)
        for p in inspect.signature(func).parameters.values()
        if p.name != "settings"
    ]
    _register(app, name, func.__doc__ or "", command, [*own, *declared])


def parameters(cls: type, names: Iterable[str] | None = None, helps: dict[str, str] | None = None):
    """The command's keyword parameters, one per declared field (or per field in ``names``), as typer reads
    them; ``helps`` replaces a field's help in this command."""
    out = []
    for each, how, kind in declared(cls):
        if names is None or each.name in names:
            flags = (how.flag,) if isinstance(how.flag, str) else how.flag or ()
            given = typer.Option(*flags, help=(helps or {}).get(each.name, how.help), hidden=how.hidden)
            default = how.cli_default if how.cli_default is not SAME else each.default
            default = None if default is dataclasses.MISSING else default
            out.append(_keyword(each.name, Annotated[how.cli_type or kind, given], default))
    return out


def settings_from(cls: type, values: dict[str, Any]) -> Any:
    """The settings from a command's values (a ``cli_type`` value kept as the field's text where it differs)."""
    out = {}
    for each, how, _ in declared(cls):
        if each.name in values:
            value = values[each.name]
            out[each.name] = str(value) if how.cli_type is not None and value is not None else value
    return cls(**out)


def _keyword(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def _register(
    app: typer.Typer, name: str, help: str, command: Any, signature: list[inspect.Parameter]
) -> None:
    command.__signature__ = inspect.Signature(signature)
    command.__doc__, command.__name__ = help, name
    app.command(name)(command)


ARGUMENTS: list[list[str]] = []  # what ``main`` was last given (tests call it with a list, not sys.argv)


def command_line() -> str:
    """The exact command as typed, recorded in the plan and shown in the report."""
    return "bench " + shlex.join(ARGUMENTS[-1] if ARGUMENTS else sys.argv[1:])


# Options a resume takes as given: how this command runs, not what the run is.
RESUME_OPTIONS = ("resume", "stop_after", "quiet", "no_report", "gate")


def check_resume_options(plan_command: str, run: RunArgs, app: typer.Typer) -> None:
    """``InputError`` for an option typed with ``--resume`` that differs from the command its plan records.

    A resumed run keeps its plan: an option that would change it is refused, not ignored."""
    typed = {k: v for k, v in run.given.items() if k not in RESUME_OPTIONS}
    if not typed:
        return
    original = _options_of(plan_command, run.command, app)
    if original is None:
        names = ", ".join(_shown(k, v) for k, v in typed.items())
        raise InputError(
            f"--resume {run.resume}: its plan records no command line to check {names} against; a resumed run "
            "keeps its plan, so drop them"
        )
    differ = {k: v for k, v in typed.items() if k not in original or original[k] != v}
    if differ:
        raise InputError(
            f"--resume {run.resume} keeps its plan: {', '.join(_shown(k, v) for k, v in differ.items())} "
            f"differ from the run's ({', '.join(_shown(k, original.get(k)) for k in differ)}); drop them"
        )


def _options_of(command: str, name: str, app: typer.Typer) -> dict[str, Any] | None:
    """The option values (typed or default) of a recorded ``bench NAME …`` command line; None if unreadable."""
    try:
        words = shlex.split(command)
        if words[:2] != ["bench", name]:
            return None
        parsed = (
            typer.main.get_command(app).commands[name].make_context(name, words[2:], resilient_parsing=True)
        )
        return dict(parsed.params)
    except Exception:  # noqa: BLE001 - a command line that does not parse today is simply unknown
        return None


def _shown(name: str, value: Any) -> str:
    flag = flag_of(name)
    if value is True:
        return flag
    if value is False or value is None:
        return f"no {flag}"
    return f"{flag} {value}"


def check_given_once(args: list[str], commands: dict[str, Any]) -> None:
    """``InputError`` for an option given twice in a command line.

    Click would take the last silently: `--steps 4 … --steps 8` would run 8 steps."""
    if not args or args[0] not in commands or "--help" in args:
        return
    options = {
        name: param
        for param in commands[args[0]].params
        if param.param_type_name == "option"
        for name in (*param.opts, *param.secondary_opts)
    }
    given: dict[str, list[str]] = {}
    tokens = iter(args[1:])
    for token in tokens:
        if token == "--":
            break
        name, equals, value = token.partition("=") if token.startswith("--") else (token, "", "")
        param = options.get(name)
        if param is None:
            continue
        if not param.is_flag and not equals:
            value = next(tokens, "")  # the option's value, whatever it looks like
        given.setdefault(param.name, []).append(value)
        if len(given[param.name]) == 2:
            first, then = given[param.name]
            values = "" if param.is_flag else f" ({first}, then {then})"
            raise InputError(f"{'/'.join(param.opts)} given twice{values}; give it once")
