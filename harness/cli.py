"""``bench``: the command line, and the composition root that wires the project's tiers into the harness."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import signal
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

import experiments.tiers
from experiments.arms import arm_files, default_arms
from harness import calibration, delay_check, schedule
from harness import env as env_module
from harness.cli_app import (
    ARGUMENTS,
    RunArgs,
    add_options_command,
    add_tier_command,
    check_given_once,
    check_resume_options,
    command_line,
    interruptible,
    new_app,
)
from harness.codepaths import what_ran
from harness.console import console, errors, print_error, shown_path
from harness.errors import InputError, RunFolderError
from harness.formatting import format_probability
from harness.interrupts import INTERRUPTED, terminate
from harness.options import protocol_options, resolve_placement
from harness.plan import Plan
from harness.planning import plan_rows
from harness.protocol_options import ProtocolOptions
from harness.report import resolve_output, write_report
from harness.run import EVERY_TRIAL_FAILED, Runner, failed_arms, failure_lines
from harness.schema import check_fields, option, require
from harness.tables import RunFolder
from harness.tier import (
    CommandSpec,
    Run,
    Start,
    TierRegistry,
    check_gate_threshold,
    gate_refusal,
    load_checked_plan,
)


def registry() -> TierRegistry:
    """The project's tiers, as ``experiments.tiers`` registers them now."""
    return experiments.tiers.TIERS


def launch(
    tier: str,
    protocol: dict[str, Any] | ProtocolOptions | None,
    settings: Any,
    run: RunArgs,
    accepts: tuple[str, ...],
    plan: Plan | None = None,
) -> Run:
    """Start a run of ``tier`` from the options given, or resume ``run.resume`` (one of ``accepts``' tiers),
    whose checked ``plan`` is read here where not given."""
    runner = Runner(registry(), run.options())
    if run.gate and gate_refusal(runner.tiers.get(tier)):
        raise InputError(f"--gate judges claims, and a '{tier}' run makes none; drop --gate")
    if run.resume is not None:
        plan = plan or load_checked_plan(RunFolder.open(run.resume), runner.tiers)
        recorded = plan.tier
        if recorded not in accepts:
            raise InputError(
                f"--resume: the folder is a '{recorded}' run; this command resumes {', '.join(accepts)} runs",
                hint="resume it with the command that started it",
            )
        check_resume_options(plan.command, run, app_of(runner.tiers))
        if run.gate:
            check_gate_threshold(plan.protocol, resuming=True)
        result = runner.resume(run.resume)
    else:
        if not isinstance(protocol, ProtocolOptions):
            protocol = protocol_options(**protocol, announce=console.print, default_arms=default_arms)
        if run.gate:
            check_gate_threshold(protocol)
        plan = runner.tiers.get(tier).make_plan(protocol, settings, command_line())
        if "order" not in run.given:  # the quiet design where the cores allow (harness.schedule)
            placement = resolve_placement(protocol.cpus)
            chosen = schedule.default_order(plan, None if placement is None else len(placement.worker_cores))
            if chosen.order != protocol.order:  # the schedule built again in that order, not the whole plan
                plan = replace(plan, protocol=replace(protocol, order=chosen.order), schedule=[])
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


def start_command(
    spec: CommandSpec, protocol: dict[str, Any], run: RunArgs, settings: Any, argv: tuple[str, ...]
) -> None:
    """A tier command: its settings checked and prepared by the tier, the run launched, then its finish."""
    tier, report = spec.tiers[0].name, not run.no_report
    # The one check of a resume's folder (by its tier) or of a new run's settings, before any line.
    plan = load_checked_plan(RunFolder.open(run.resume), registry()) if run.resume is not None else None
    if plan is None and settings is not None:
        check_fields(settings)
    start = Start(tier, protocol, settings, run.resume, run.given, run.out, report, argv, console.print, plan)
    if spec.prepare is not None:
        start = spec.prepare(start)
    accepts = tuple(t.name for t in spec.tiers)
    result = launch(start.tier, start.protocol, start.settings, run, accepts, start.plan)
    problem = spec.finish(result, start) if spec.finish is not None else None
    if problem:
        errors.print(f"bench {spec.name}: {problem}", soft_wrap=True)
        raise typer.Exit(1)


def parse_percent(name: str, text: str | None) -> float | None:
    """``3%`` or ``3`` → 0.03; ``InputError`` for anything else."""
    if text is None:
        return None
    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        raise InputError(f"{name} '{text}' is not a percentage; use e.g. 3% or 3") from None
    if not -100 < value < 100:
        raise InputError(f"{name} {text} must lie between -100% and 100%")
    return value / 100


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


def check_plan_goal(protocol: ProtocolOptions, goal: PlanArgs) -> None:
    """``InputError`` unless ``bench plan``'s goal fits the run: a tolerance needs an A/A arm.

    An effect at its bar is refused too: no number of pairs resolves it."""
    effect_value, bar_value = parse_percent("--effect", goal.effect), parse_percent("--bar", goal.bar)
    if goal.tolerance is not None and not protocol.control:
        raise InputError(
            f"--tolerance {goal.tolerance} plans an A/A arm, and the run has none (it ran without --control); drop "
            "--tolerance"
        )
    if effect_value is None:
        return
    against = bar_value if bar_value is not None else 0.0  # an effect is planned against 0 unless asked
    if math.isclose(effect_value, against, abs_tol=1e-12):
        raise InputError(
            f"--effect {goal.effect} is at the bar ({100 * against:.1f}%): no number of pairs resolves an effect at "
            "its bar; give an effect away from it, or another --bar"
        )


def plan_command(
    run_dir: Annotated[Path, typer.Argument(help="A run folder whose per-pair spread to plan from.")],
    settings: PlanArgs,
) -> None:
    """Pairs and time a goal needs, from a run folder's measured per-pair spread: `bench plan RUN_DIR --effect 3%`."""
    run = Run.load(RunFolder.open(run_dir), tiers=registry())
    check_plan_goal(run.plan.protocol, settings)
    goal = (parse_percent(f"--{name}", getattr(settings, name)) for name in ("effect", "tolerance", "bar"))
    rows = plan_rows(run.plan.protocol, run.summaries, *goal, settings.power)
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


def env_command(settings: EnvArgs) -> None:
    """Show this machine's environment fingerprint (what every run records in env.json)."""
    arms = settings.arms
    record = env_module.collect(code_files=arm_files(arms) if arms else ())
    if settings.as_json:
        print(json.dumps(record, indent=1, default=str))
        return
    table = Table("field", "value", title="environment")
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
    console.print(f"report: {shown_path(write_report(folders, registry(), output))}", soft_wrap=True)


@functools.cache
def app_of(tiers: TierRegistry) -> typer.Typer:
    """The ``bench`` app: a command per tier command registered, then plan, env and report."""
    made = new_app()
    for spec in tiers.commands():
        add_tier_command(made, spec, start_command)
    add_options_command(made, "plan", PlanArgs, plan_command)
    add_options_command(made, "env", EnvArgs, env_command)
    add_options_command(made, "report", ReportArgs, report_command)
    return made


app = app_of(registry())  # the project's commands (``harness.cli_doc`` documents them)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``bench`` script: bad input is one line on stderr and exit status 2."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args:
        args = ["--help"]
    ARGUMENTS[:] = [args]
    previous_sigterm = signal.signal(signal.SIGTERM, terminate)  # SIGTERM stops a run as Ctrl-C does
    try:
        group = typer.main.get_command(app_of(registry()))
        check_given_once(args, group.commands)
        result = group.main(args=args, prog_name="bench", standalone_mode=False)
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
