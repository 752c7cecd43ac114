"""``bench``: the command line, and the composition root that wires the project's tiers into the harness.

Every command checks its inputs before anything is written; a bad input is one line on stderr and exit
status 2. The tier commands share one set of protocol options and one set of run options (``SHARED`` and
``RUN`` below, added to each command by ``tier_command``); their defaults come from ``ProtocolOptions``, and
each tier's own options take theirs from the tier's settings dataclass.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import shlex
import signal
import sys
import typing
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

import typer

from experiments import cpu_defaults
from experiments.command import CommandSettings as _Command
from experiments.command.resume import check_resumed_command
from experiments.fit.plan import FitSettings as _Fit
from experiments.fit.plan import check_data_cache_used
from experiments.parity import ParitySettings as _Parity
from experiments.probe.plan import ProbeSettings as _Probe
from experiments.screen.plan import ScreenSettings as _Screen
from harness import env as env_module
from harness.arguments import check_given_once, check_plan_goal, parse_percent
from harness.codepaths import what_ran
from harness.console import console, errors
from harness.errors import RunFolderError
from harness.failures import EVERY_TRIAL_FAILED, failed_arms, failure_lines
from harness.formatting import format_probability
from harness.interrupts import INTERRUPTED, terminate
from harness.options import (
    AUTO_DEVICE,
    DEFAULT_ARMS,
    MAX_PAIRS,
    MAX_SEED,
    InputError,
    check_gpus,
    check_non_negative,
    check_positive,
    protocol_options,
    resolve_device,
    split_device_list,
)
from harness.protocol import Arm, PlannedStop, ProtocolOptions
from harness.run import RunInterrupted, Runner, RunOptions
from harness.schema import parameters, settings_from
from harness.tables import RunFolder, unnameable
from harness.tier import (
    Run,
    TierRegistry,
    check_gate_threshold,
    check_run_log,
    gate_refusal,
    load_checked_plan,
)

app = typer.Typer(
    name="bench",
    help="Paired, synchronized benchmarks of MuSGD implementations: screen, probe, complete fits, parity, reports.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def registry() -> TierRegistry:
    """The project's tiers (imported on first use, so ``bench --help`` stays quick)."""
    from experiments.tiers import TIERS

    return TIERS


@dataclass(frozen=True)
class Shared:
    """One option every tier command takes: its name, type, default and help."""

    name: str
    kind: Any
    default: Any
    help: str
    flag: str | None = None  # an explicit flag name for booleans (no --no-… twin)

    def parameter(self) -> inspect.Parameter:
        option = typer.Option(self.flag, help=self.help) if self.flag else typer.Option(help=self.help)
        return inspect.Parameter(
            self.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=self.default,
            annotation=Annotated[self.kind, option],
        )


def _default(name: str) -> Any:
    return ProtocolOptions.default(name)


SHARED = (
    Shared(
        "arms",
        str | None,
        None,
        "Comma-separated arms, baseline first: baseline, candidate, candidate-cpu (the candidate with CPU tensors "
        "through its batched path), upstream, or package.module:Class, each as label=spec with keywords if you "
        "like ('fused=torch.optim:AdamW(fused=True)'). Each gets param groups with lr, momentum, weight_decay, "
        "nesterov, use_muon; its constructor the keywords it names of: muon, sgd (screen, probe, parity), and "
        "lr, momentum, weight_decay, nesterov, use_muon too (pair); then its own. "
        f"Default: {DEFAULT_ARMS} on CUDA, baseline,candidate-cpu on the CPU.",
    ),
    Shared(
        "warmup",
        str,
        str(_default("warmup")),
        "Discarded warm-up trials per case, cycling through the arms (kept in the log, not in the statistics), "
        "or auto: warm-ups until one is at most "
        f"{_default('warmup_tolerance'):g}% faster than its arm's previous (at most {_default('max_warmup')}, then the run goes on and the "
        "report says it never settled); with auto the same after a resume or an idle gap.",
    ),
    Shared(
        "pairs",
        str,
        str(_default("pairs")),
        "Measured pairs (rounds: each arm once) per case, in counterbalanced order (an even count balances "
        "AB/BA), or auto: pairs run until the interval's half-width is at most --precision (looks every 2 "
        "pairs from 6 to --max-pairs, alpha spent over them), or --time-budget is spent.",
    ),
    Shared(
        "order",
        str,
        _default("order"),
        "Arm order within pairs: alternate (AB, BA, …; a balanced Latin square for more arms), abba (AB, BA, "
        "BA, AB, …) or random (seeded).",
    ),
    Shared("seed", int, _default("seed"), "Seed for data and random order."),
    Shared(
        "bar",
        float | None,
        _default("bar"),
        "The bar, in percent, the paired reduction must clear (e.g. 8); with --control, the tolerance ±bar the A/A difference must stay within (e.g. 1).",
    ),
    Shared(
        "device",
        str,
        AUTO_DEVICE,
        "auto (CUDA when present, else the CPU), cpu, cuda, cuda:N, or consecutive devices cuda:0,1 (= --gpus 2).",
    ),
    Shared("budget", str | None, None, "Device-memory cap emulated on a larger card, e.g. 24GiB or 800MiB."),
    Shared(
        "control",
        bool,
        _default("control"),
        "A/A control: add the first arm again (<first>-control) to the same schedule; alone, the run is an A/A.",
        "--control",
    ),
    Shared(
        "tolerance",
        float | None,
        _default("tolerance"),
        "With --control beside other arms: the ±tolerance, in percent, the A/A arm must stay within (e.g. 1).",
    ),
    Shared(
        "precision",
        float | None,
        _default("precision"),
        "With --pairs auto: the target half-width of the interval, in percentage points of reduction.",
    ),
    Shared(
        "max_pairs", int, _default("max_pairs"), "With --pairs auto: the last look (most pairs per case)."
    ),
    Shared(
        "time_budget",
        float | None,
        _default("time_budget"),
        "Seconds the run may take (default: 3600 on the CPU, none on a GPU); a longer plan is refused before its "
        "first trial, exit 2. With --pairs auto: stop at the next pair boundary once the log's trials would pass it.",
    ),
    Shared(
        "cpus",
        str,
        _default("cpus"),
        "CPU placement of the trials: auto (a fixed core set for the worker, apart from the parent), a core list "
        "such as 2-7, or none (as the OS schedules); threads fixed to match.",
    ),
    Shared(
        "cooldown",
        float,
        _default("cooldown"),
        "Seconds to pause before each trial (GPU clocks settle between trials).",
    ),
    Shared(
        "gpus",
        int,
        _default("gpus"),
        "Ranks per trial: each trial is data-parallel over N devices from --device on (N CPU ranks on gloo when the device is the CPU).",
    ),
)
RUN = (
    Shared(
        "resume",
        Path | None,
        None,
        "Continue an interrupted run folder where it stopped (its saved plan wins).",
    ),
    Shared("out", str, "runs", "Folder under which run folders are created."),
    Shared(
        "stop_after",
        float | None,
        None,
        "Stop cleanly (exit 130) before a trial that would not end within this many seconds of the command's start (estimated from the log, or an untimed first trial); continue with --resume.",
    ),
    Shared("quiet", bool, False, "No live progress bar: one plain line per trial (for CI logs).", "--quiet"),
    Shared(
        "gate",
        bool,
        False,
        "Exit 1 when a claim fails, is insufficient or ambiguous, or an A/A arm is not within its tolerance.",
        "--gate",
    ),
    Shared("no_report", bool, False, "Do not write the markdown report when the run ends.", "--no-report"),
)


@dataclass(frozen=True)
class RunArgs:
    """The run options as given: where, how, resume or not."""

    resume: Path | None
    out: Path
    stop_after: float | None
    quiet: bool
    gate: bool
    no_report: bool
    command: str = ""  # the command's name (pair, screen, …)
    given: dict[str, Any] = field(default_factory=dict)  # options typed on the command line, by name

    def runner(self) -> Runner:
        if self.stop_after is not None and not self.stop_after > 0:
            raise InputError(f"--stop-after must be a positive number of seconds (got {self.stop_after})")
        options = RunOptions(
            out=self.out, quiet=self.quiet, report=not self.no_report, stop_after=self.stop_after
        )
        return Runner(registry(), options)


def interruptible(func: Callable[..., Any], outside_a_run: str = "before any run folder was written") -> Any:
    """A command that, on Ctrl-C or SIGTERM, says on stderr what was interrupted and where the run folder is
    (typer turns the interrupt into exit status 130 without a word)."""

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


def tier_command(
    name: str, protocol: bool = True, settings: type | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``func`` as command ``name``: its own parameters, the options its ``settings`` class declares
    (``harness.schema``), the shared protocol options (unless ``protocol=False``), then the run options.
    ``func`` receives ``protocol`` (a dict of the values as given), ``run`` (``RunArgs``) and, with a
    settings class, ``settings`` (an instance made from the values typed)."""
    shared = SHARED if protocol else ()
    declared = parameters(settings) if settings is not None else []

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        hints = typing.get_type_hints(func, include_extras=True)
        own = [
            inspect.Parameter(
                p.name, inspect.Parameter.KEYWORD_ONLY, default=p.default, annotation=hints[p.name]
            )
            for p in inspect.signature(func).parameters.values()
            if p.name not in ("protocol", "run", "settings")
        ]

        @interruptible
        def command(**values: Any) -> Any:
            context = values.pop("context")
            typed = {
                key: value
                for key, value in values.items()
                if getattr(context.get_parameter_source(key), "name", "") == "COMMANDLINE"
            }
            given = {option.name: values.pop(option.name) for option in shared}
            run_values = {option.name: values.pop(option.name) for option in RUN}
            # Taken as text: a Path option turns an empty --out into '.', the current folder.
            why = unnameable(run_values["out"])
            if why:
                raise InputError(f"--out '{run_values['out']}': {why}; give a writable folder")
            run_values["out"] = Path(run_values["out"])
            run = RunArgs(**run_values, command=name, given=typed)
            if settings is not None:
                values["settings"] = settings_from(settings, {p.name: values.pop(p.name) for p in declared})
            return func(protocol=given, run=run, **values)

        context = inspect.Parameter("context", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
        options = [*own, *declared, *(o.parameter() for o in (*shared, *RUN)), context]
        command.__signature__ = inspect.Signature(options)
        command.__doc__, command.__name__ = func.__doc__, func.__name__
        app.command(name)(command)
        return func

    return decorate


_ARGUMENTS: list[str] | None = None  # what ``main`` was given (tests call it with a list, not sys.argv)


def command_line() -> str:
    """The exact command as typed, recorded in the plan and shown in the report."""
    return "bench " + shlex.join(sys.argv[1:] if _ARGUMENTS is None else _ARGUMENTS)


# Options a resume takes as given: how this command runs, not what the run is.
RESUME_OPTIONS = ("resume", "stop_after", "quiet", "no_report", "gate")  # how this run goes, not its plan


def check_resume_options(plan_command: str, run: RunArgs) -> None:
    """``InputError`` (one line) for any option typed with ``--resume`` whose value differs from the one the
    run was started with (read back from the command its plan records): a resumed run keeps its plan, so an
    option that would change it must not be silently ignored. Options left out are fine."""
    typed = {k: v for k, v in run.given.items() if k not in RESUME_OPTIONS}
    if not typed:
        return
    original = _options_of(plan_command, run.command)
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


def _options_of(command: str, name: str) -> dict[str, Any] | None:
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
    flag = "--" + name.replace("_", "-")
    if value is True:
        return flag
    if value is False or value is None:
        return f"no {flag}"
    return f"{flag} {value}"


def launch(
    tier: str,
    protocol: dict[str, Any] | ProtocolOptions | None,
    settings: Any,
    run: RunArgs,
    accepts: tuple[str, ...],
) -> Run:
    """Start a run of ``tier`` from the options given, or resume ``run.resume`` (one of ``accepts``' tiers).

    Every input is checked before anything is written, so a bad input leaves no run folder.
    """
    runner = run.runner()
    if run.gate and gate_refusal(runner.tiers.get(tier)):
        raise InputError(f"--gate judges claims, and a '{tier}' run makes none; drop --gate")
    if run.resume is not None:
        folder = RunFolder.open(run.resume)
        plan = load_checked_plan(folder, runner.tiers)  # the folder validated whole, its settings by its tier
        check_run_log(plan, folder, runner.tiers)
        recorded = plan.tier
        if recorded not in accepts:
            raise InputError(
                f"--resume {run.resume} is a '{recorded}' run; resume it with the command that started it "
                f"(this one resumes {', '.join(accepts)} runs)"
            )
        check_resume_options(plan.command, run)
        if run.gate:
            check_gate_threshold(plan.protocol, resuming=True)
        result = runner.resume(run.resume)
    else:
        if not isinstance(protocol, ProtocolOptions):
            from experiments.arms import default_arms

            protocol = protocol_options(**protocol, announce=console.print, default_arms=default_arms)
        if run.gate:
            check_gate_threshold(protocol)
        plan = runner.tiers.get(tier).make_plan(protocol, settings, command_line())
        line = what_ran(plan)
        if line:
            console.print(line, soft_wrap=True)  # one line, before anything runs: what the arms will run
        result = runner.start(plan)
    rows = result.folder.rows() if isinstance(result, Run) else []
    for line in failure_lines(rows):  # an arm with nothing measured: not a success
        errors.print(f"bench: {line}", soft_wrap=True)
    if failed_arms(rows):
        raise typer.Exit(EVERY_TRIAL_FAILED)
    if run.gate:
        failures = result.gate_failures()
        for failure in failures:
            errors.print(f"bench: gate: {failure}", soft_wrap=True)
        if failures:
            raise typer.Exit(1)
        console.print(
            "bench: gate passed: every claim clears its bar and every A/A arm is within its tolerance"
        )
    return result


MIN_POWER, MAX_POWER = 0.5, 0.999  # `bench plan --power`: past 0.999 the pairs grow without a useful end


@app.command("plan")
def plan_command(
    run_dir: Annotated[Path, typer.Argument(help="A run folder whose per-pair spread to plan from.")],
    effect: Annotated[
        str | None,
        typer.Option(help="A claim's true reduction to resolve, e.g. 3% (default: the run's measured one)."),
    ] = None,
    tolerance: Annotated[
        str | None,
        typer.Option(help="An A/A arm's ±tolerance to fall within, e.g. 1% (default: the run's)."),
    ] = None,
    bar: Annotated[
        str | None,
        typer.Option(
            help="The bar the effect is resolved against, e.g. 8% (default: 0, i.e. faster at all)."
        ),
    ] = None,
    power: Annotated[float, typer.Option(help="The probability the goal must be met with.")] = 0.8,
) -> None:
    """Pairs and time a goal needs, from a run folder's measured per-pair spread: `bench plan RUN_DIR --effect 3%`."""
    from harness.planning import plan_rows

    if not MIN_POWER <= power <= MAX_POWER:
        raise InputError(
            f"--power {power} must be a probability from {MIN_POWER} to {MAX_POWER} (the chance the goal is "
            "met; below a coin flip a plan expects to miss it), e.g. 0.8"
        )
    effect_value = parse_percent("--effect", effect)
    tolerance_value = parse_percent("--tolerance", tolerance)
    if tolerance_value is not None and tolerance_value <= 0:
        raise InputError(f"--tolerance {tolerance} must be positive, e.g. 1%")
    bar_value = parse_percent("--bar", bar)
    run = Run.load(RunFolder.open(run_dir), tiers=registry())
    check_plan_goal(run.plan.protocol, effect, effect_value, tolerance, tolerance_value, bar_value)
    rows = plan_rows(run.plan.protocol, run.summaries, effect_value, tolerance_value, bar_value, power)
    if not rows:
        console.print(f"{run_dir}: no complete pair, so no spread to plan from")
        return
    for row in rows:
        where = f"{row['case']}: " if len({r["case"] for r in rows}) > 1 else ""
        head = f"{where}{row['arm']} vs {row['baseline_arm']}"
        spread = f"per-pair σ {100 * row['sigma']:.2f}% over {row['sigma_pairs']} pairs"
        if row["pairs"] is None:
            console.print(f"{head}: {row['note']}" + ("" if row["sigma"] != row["sigma"] else f" ({spread})"))
            continue
        time_text = (
            "" if row["seconds"] != row["seconds"] else f", about {row['seconds'] / 60:.1f} min of trials"
        )
        upper = (
            ""
            if row["pairs_upper"] is None
            else f"; {row['pairs_upper']} at σ's upper bound {100 * row['sigma_upper']:.2f}%"
        )
        console.print(
            f"{head}: run {row['pairs']} pairs to {row['goal']}{time_text} ({spread}{upper}; "
            f"{row['pairs_for_goal']} meet it with probability {format_probability(row['probability'])})"
        )


@app.command("env")
def env_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print the fingerprint as JSON.")] = False,
    arms: Annotated[str | None, typer.Option(help="Arms whose own files to fingerprint too.")] = None,
) -> None:
    """Show this machine's environment fingerprint (what every run records in env.json)."""
    from experiments.arms import arm_files  # noqa: PLC0415 - the composition root names the tiers' code

    record = env_module.collect(code_files=arm_files(arms) if arms else ())
    if as_json:
        print(json.dumps(record, indent=1, default=str))
        return
    from rich.table import Table

    table = Table(title="environment", show_header=True)
    table.add_column("field")
    table.add_column("value")
    for key, value in record.items():
        if key in ("gpus_start", "gpus_end"):
            continue
        table.add_row(key, "null" if value is None else str(value))
    for gpu in record["gpus_start"] or []:
        table.add_row(
            f"gpu {gpu['index']} now",
            f"{gpu['name']}: SM {gpu['sm_clock_mhz']} MHz, memory {gpu['mem_clock_mhz']} MHz, "
            f"{gpu['temperature_c']} °C, {gpu['power_w']} W",
        )
    console.print(table)


@tier_command("pair", settings=_Fit)
def pair_command(protocol: dict[str, Any], run: RunArgs, settings: _Fit) -> None:
    """Complete paired fits (the decisive tier): `bench pair --steps 384`."""
    if settings.data_cache is not None:
        check_data_cache_used(settings.workload, settings.data)
    settings = replace(settings, data_cache=settings.data_cache or str(run.out / "datasets"))
    launch("stages" if settings.stages else "pair", protocol, settings, run, accepts=("pair", "stages"))


@tier_command("screen", settings=_Screen)
def screen_command(protocol: dict[str, Any], run: RunArgs, settings: _Screen) -> None:
    """Optimizer-only crossover screen over YOLO26 scales and padding guards."""
    if run.resume is None:
        settings = cpu_defaults.on_cpu(
            settings, cpu_defaults.SCREEN, protocol["device"], run.given, console.print
        )
    launch("screen", protocol, settings, run, accepts=("screen",))


@tier_command("command", settings=_Command)
def command_command(
    protocol: dict[str, Any],
    run: RunArgs,
    settings: _Command,
    argv: Annotated[
        list[str] | None,
        typer.Argument(
            help="The command, after --; {arm} and {spec} become each arm's label and spec.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Your own command, timed per arm: bench command --arms a,b -- python train.py --opt {arm}."""
    settings = replace(settings, argv=tuple(argv or ()))
    if run.resume is not None:
        check_resumed_command(run.resume, settings.argv)
    elif protocol["arms"] is None:
        raise InputError("bench command needs --arms, e.g. --arms slow,fast (each label fills {arm})")
    launch("command", protocol, settings, run, accepts=("command",))


@tier_command("probe", settings=_Probe)
def probe_command(protocol: dict[str, Any], run: RunArgs, settings: _Probe) -> None:
    """Head-memory probes under a device budget; out-of-memory is a recorded result."""
    if run.resume is None and settings.head in cpu_defaults.PROBE:
        defaults = cpu_defaults.PROBE[settings.head]
        settings = cpu_defaults.on_cpu(settings, defaults, protocol["device"], run.given, console.print)
    launch("probe", protocol, settings, run, accepts=("probe",))


@tier_command("parity", protocol=False)
def parity_command(
    protocol: dict[str, Any],
    run: RunArgs,
    scale: Annotated[str, typer.Option(help="YOLO26 parameter set: n, s, m, l or x.")] = _Parity.scale,
    steps: Annotated[
        int, typer.Option(help="Steps to follow; step one is judged, later ones are reported.")
    ] = _Parity.steps,
    fit: Annotated[
        bool, typer.Option("--fit", help="Real forward/backward steps of the embedded fit workload instead.")
    ] = _Parity.fit,
    arms: Annotated[
        str | None,
        typer.Option(
            help="baseline,candidate (default baseline,candidate); each built with muon, sgd and its own keywords."
        ),
    ] = None,
    candidate: Annotated[str | None, typer.Option(hidden=True, help="Deprecated: --arms baseline,X.")] = None,
    device: Annotated[
        str, typer.Option(help="auto (CUDA when present, else the CPU), cpu, cuda or cuda:N.")
    ] = AUTO_DEVICE,
    seed: Annotated[int, typer.Option(help="Seed for the parameters, gradients and data.")] = _default(
        "seed"
    ),
    gpus: Annotated[
        int,
        typer.Option(
            help="Also follow the candidate on N ranks (fresh processes; gloo on the CPU) against the one-rank candidate."
        ),
    ] = _default("gpus"),
) -> None:
    """The numerical contract of candidate against baseline, as a run folder (exit 1 when it breaks)."""
    from experiments import parity

    baseline, candidate = parity.arms_of(arms, candidate)
    settings = _Parity(scale=scale, steps=steps, fit=fit, candidate=candidate, baseline=baseline)
    options = None
    if run.resume is None:
        first, gpus = split_device_list(device, gpus)
        resolved, why = resolve_device(first)
        console.print(f"device: {resolved} ({why})")
        arms = (Arm(settings.baseline, "baseline", settings.baseline), Arm(candidate, "candidate", candidate))
        options = ProtocolOptions(
            arms,
            warmup=0,
            pairs=check_positive("--steps", steps, MAX_PAIRS),
            seed=int(check_non_negative("--seed", seed, MAX_SEED)),
            device=resolved,
            gpus=check_gpus(gpus, resolved),
        )
    result = launch("parity", options, settings, run, accepts=("parity",))
    if not parity.result_of(result).holds:
        where = (
            "see the report" if not run.no_report else f"bench report {result.folder.path} writes the report"
        )
        errors.print(f"bench parity: the one-step contract is broken ({where})", soft_wrap=True)
        raise typer.Exit(1)


@app.command("report")
@functools.partial(interruptible, outside_a_run="(the report is written whole or not at all)")
def report_command(
    run_dirs: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Run folders; several make one report side by side (e.g. a claim and its A/A control).",
            metavar="RUN_DIR...",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            help="Markdown file to write (.md); needed for several run folders. "
            "Default: report.md inside the single run folder.",
        ),
    ] = None,
    tables: Annotated[
        bool,
        typer.Option(
            "--tables",
            help="Also write each folder's tables (CSVs) and claim.txt again from its log, as a run's end does "
            "(after the statistics' code changed); refused while a run holds the folder.",
        ),
    ] = False,
) -> None:
    """Write the markdown report (with PNG plots beside it) of one or more run folders, from the folders alone."""
    from harness.report import resolve_output, write_report

    folders = [RunFolder.open(path) for path in run_dirs or []]
    if tables:  # the folders named once, each locked and read, before any table is written
        resolve_output(folders, output)
        runner = Runner(registry())
        with contextlib.ExitStack() as held:
            for folder in folders:
                held.enter_context(folder.lock())
            runs = [Run.load(folder, tiers=runner.tiers) for folder in folders]
            for folder, run in zip(folders, runs, strict=True):
                runner.finish(folder, run)
    console.print(f"report: {write_report(folders, registry(), output)}")


def _one_line(text: str) -> str:
    """``text`` with control characters (a newline or an escape inside a value given) written as escapes, so
    an error stays one line whatever it quotes."""
    return "".join(ascii(c)[1:-1] if unicodedata.category(c) == "Cc" else c for c in text)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``bench`` script: bad input is one line on stderr and exit status 2."""
    global _ARGUMENTS
    args = sys.argv[1:] if argv is None else list(argv)
    if not args:
        args = ["--help"]
    _ARGUMENTS = args
    previous_sigterm = signal.signal(signal.SIGTERM, terminate)  # SIGTERM stops a run as Ctrl-C does
    try:
        check_given_once(args, typer.main.get_command(app).commands)
        result = typer.main.get_command(app).main(args=args, prog_name="bench", standalone_mode=False)
    except (InputError, RunFolderError) as exc:
        errors.print(f"bench: error: {_one_line(str(exc))}", soft_wrap=True)
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):  # an interrupt outside a command (commands say what it stopped)
        errors.print("bench: interrupted")
        return INTERRUPTED
    except Exception as exc:
        # click's (or typer's vendored click's) usage errors: bad option names or values.
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            errors.print(f"bench: error: {exc.format_message()}", soft_wrap=True)
            return int(exc.exit_code)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
