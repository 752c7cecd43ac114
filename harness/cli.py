"""``bench``: the command line, and the composition root that wires the project's tiers into the harness."""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import sys
from dataclasses import dataclass, replace
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
from harness import calibration, delay_check, design
from harness import env as env_module
from harness.arguments import check_given_once, check_plan_goal, parse_percent
from harness.cli_app import (
    ARGUMENTS,
    RunArgs,
    app,
    check_resume_options,
    command_line,
    interruptible,
    options_command,
    tier_command,
)
from harness.codepaths import what_ran
from harness.console import console, errors, print_error
from harness.errors import RunFolderError
from harness.failures import EVERY_TRIAL_FAILED, failed_arms, failure_lines
from harness.formatting import format_probability
from harness.interrupts import INTERRUPTED, terminate
from harness.options import (
    InputError,
    check_gpus,
    protocol_options,
    resolve_device,
    resolve_placement,
    split_device_list,
)
from harness.protocol import Arm, ProtocolOptions
from harness.protocol_options import check_protocol
from harness.run import Runner
from harness.schema import check_fields, option, require
from harness.tables import RunFolder
from harness.tier import (
    Run,
    TierRegistry,
    check_gate_threshold,
    check_run_log,
    gate_refusal,
    load_checked_plan,
)

__all__ = ["RunArgs", "app", "launch", "main", "registry"]


def registry() -> TierRegistry:
    """The project's tiers (imported on first use, so ``bench --help`` stays quick)."""
    from experiments.tiers import TIERS

    return TIERS


def launch(
    tier: str,
    protocol: dict[str, Any] | ProtocolOptions | None,
    settings: Any,
    run: RunArgs,
    accepts: tuple[str, ...],
) -> Run:
    """Start a run of ``tier`` from the options given, or resume ``run.resume`` (one of ``accepts``'
    tiers)."""
    runner = Runner(registry(), run.options())
    if run.gate and gate_refusal(runner.tiers.get(tier)):
        raise InputError(f"--gate judges claims, and a '{tier}' run makes none; drop --gate")
    if run.resume is not None:
        folder = RunFolder.open(run.resume)
        plan = load_checked_plan(folder, runner.tiers)  # the folder validated whole, its settings by its tier
        check_run_log(plan, folder, runner.tiers)
        recorded = plan.tier
        if recorded not in accepts:
            raise InputError(
                f"--resume: the folder is a '{recorded}' run; this command resumes {', '.join(accepts)} runs",
                hint="resume it with the command that started it",
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
        if "order" not in run.given:  # the quiet design where the cores allow (harness.design)
            placement = resolve_placement(protocol.cpus)
            chosen = design.default_order(plan, None if placement is None else len(placement.worker_cores))
            if chosen.order != protocol.order:
                protocol = replace(protocol, order=chosen.order)
                plan = runner.tiers.get(tier).make_plan(protocol, settings, command_line())
            console.print(chosen.text)
        calibration.check_plan(plan)
        line = what_ran(plan)
        if line:
            console.print(line)  # before anything runs: what the arms will run
        result = runner.start(plan)
    rows = result.folder.rows() if isinstance(result, Run) else []
    for line in failure_lines(rows):  # an arm with nothing measured: not a success
        errors.print(f"bench: {line}", soft_wrap=True)
    if failed_arms(rows):
        raise typer.Exit(EVERY_TRIAL_FAILED)
    if isinstance(result, Run):
        for reading in delay_check.readings(result.folder.trials()):
            console.print(reading.text)
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


PARITY_HELPS = {
    "arms": "baseline,candidate (default baseline,candidate); each built with muon, sgd and its own keywords.",
    "seed": "Seed for the parameters, gradients and data.",
    "gpus": "Also follow the candidate on N ranks (fresh processes; gloo on the CPU) against the one-rank "
    "candidate.",
}


@tier_command("parity", settings=_Parity, protocol=("arms", "seed", "device", "gpus"), helps=PARITY_HELPS)
def parity_command(protocol: dict[str, Any], run: RunArgs, settings: _Parity) -> None:
    """The numerical contract of candidate against baseline, as a run folder (exit 1 when it breaks)."""
    from experiments import parity

    baseline, candidate = parity.arms_of(protocol["arms"], settings.candidate)
    settings = replace(settings, candidate=candidate, baseline=baseline)
    options = None
    if run.resume is None:
        first, gpus = split_device_list(protocol["device"], protocol["gpus"])
        resolved, why = resolve_device(first)
        console.print(f"device: {resolved} ({why})")
        check_fields(settings)
        arms = (Arm(baseline, "baseline", baseline), Arm(candidate, "candidate", candidate))
        options = ProtocolOptions(
            arms, warmup=0, pairs=settings.steps, seed=protocol["seed"], device=resolved, gpus=gpus
        )
        check_gpus(check_protocol(options).gpus, resolved)
    result = launch("parity", options, settings, run, accepts=("parity",))
    if not parity.result_of(result).holds:
        where = (
            "see the report" if not run.no_report else f"bench report {result.folder.path} writes the report"
        )
        errors.print(f"bench parity: the one-step contract is broken ({where})", soft_wrap=True)
        raise typer.Exit(1)


MIN_POWER, MAX_POWER = 0.5, 0.999  # `bench plan --power`: past 0.999 the pairs grow without a useful end


_power = require(
    lambda power: MIN_POWER <= power <= MAX_POWER,
    f"--power {{}} must be a probability from {MIN_POWER} to {MAX_POWER}, the chance the goal is met",
)


def _tolerance(text: str) -> None:
    if parse_percent("--tolerance", text) <= 0:
        raise InputError(f"--tolerance {text} must be positive, e.g. 1%")


@dataclass(frozen=True)
class PlanArgs:
    """``bench plan``'s goal."""

    effect: str | None = option(
        None,
        "A claim's true reduction to resolve, e.g. 3% (default: the run's measured one).",
        check=functools.partial(parse_percent, "--effect"),
    )
    tolerance: str | None = option(
        None, "An A/A arm's ±tolerance to fall within, e.g. 1% (default: the run's).", check=_tolerance
    )
    bar: str | None = option(
        None,
        "The bar the effect is resolved against, e.g. 8% (default: 0, i.e. faster at all).",
        check=functools.partial(parse_percent, "--bar"),
    )
    power: float = option(0.8, "The probability the goal must be met with.", check=_power)


@options_command("plan", PlanArgs)
def plan_command(
    run_dir: Annotated[Path, typer.Argument(help="A run folder whose per-pair spread to plan from.")],
    settings: PlanArgs,
) -> None:
    """Pairs and time a goal needs, from a run folder's measured per-pair spread: `bench plan RUN_DIR --effect 3%`."""
    from harness.planning import plan_rows

    effect, tolerance, power = settings.effect, settings.tolerance, settings.power
    effect_value = parse_percent("--effect", effect)
    tolerance_value = parse_percent("--tolerance", tolerance)
    bar_value = parse_percent("--bar", settings.bar)
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


@dataclass(frozen=True)
class EnvArgs:
    """``bench env``'s options."""

    as_json: bool = option(False, "Print the fingerprint as JSON.", flag="--json")
    arms: str | None = option(None, "Arms whose own files to fingerprint too.")


@options_command("env", EnvArgs)
def env_command(settings: EnvArgs) -> None:
    """Show this machine's environment fingerprint (what every run records in env.json)."""
    from experiments.arms import arm_files  # noqa: PLC0415 - the composition root names the tiers' code

    arms = settings.arms
    record = env_module.collect(code_files=arm_files(arms) if arms else ())
    if settings.as_json:
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


@dataclass(frozen=True)
class ReportArgs:
    """``bench report``'s options."""

    output: Path | None = option(
        None,
        "Markdown file to write (.md); needed for several run folders. Default: report.md inside the single "
        "run folder.",
        flag=("-o", "--output"),
    )
    tables: bool = option(
        False,
        "Also write each folder's tables (CSVs) and claim.txt again from its log, as a run's end does (after "
        "the statistics' code changed); refused while a run holds the folder.",
        flag="--tables",
    )


@options_command("report", ReportArgs)
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
    settings: ReportArgs = ReportArgs(),
) -> None:
    """Write the markdown report (with PNG plots beside it) of one or more run folders, from the folders alone."""
    from harness.report import resolve_output, write_report

    folders, output = [RunFolder.open(path) for path in run_dirs or []], settings.output
    if settings.tables:  # the folders named once, each locked and read, before any table is written
        resolve_output(folders, output)
        runner = Runner(registry())
        with contextlib.ExitStack() as held:
            for folder in folders:
                held.enter_context(folder.lock())
            runs = [Run.load(folder, tiers=runner.tiers) for folder in folders]
            for folder, run in zip(folders, runs, strict=True):
                runner.finish(folder, run)
    console.print(f"report: {write_report(folders, registry(), output)}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``bench`` script: bad input is one line on stderr and exit status 2."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args:
        args = ["--help"]
    ARGUMENTS[:] = [args]
    previous_sigterm = signal.signal(signal.SIGTERM, terminate)  # SIGTERM stops a run as Ctrl-C does
    try:
        check_given_once(args, typer.main.get_command(app).commands)
        result = typer.main.get_command(app).main(args=args, prog_name="bench", standalone_mode=False)
    except (InputError, RunFolderError) as exc:
        print_error(str(exc), exc.hint)
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):  # an interrupt outside a command (commands say what it stopped)
        errors.print("bench: interrupted")
        return INTERRUPTED
    except Exception as exc:
        # click's (or typer's vendored click's) usage errors: bad option names or values.
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            text = exc.format_message()  # "Invalid value for '--x': why": the why goes to the hint line
            message, _, detail = text.partition(": ") if text.startswith("Invalid value") else (text, "", "")
            print_error(message, detail or None)
            return int(exc.exit_code)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
