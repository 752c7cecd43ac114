"""``bench``: the command line, and the composition root that wires experiments into the harness.

Every command checks its inputs before anything is written; a bad input is one line on stderr and exit
status 2. The tier commands share one set of protocol options (below) and one runner (``harness.run``).
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from harness import env as env_module
from harness.console import console, errors
from harness.options import InputError
from harness.protocol import Plan
from harness.run import resume_run, start_run
from harness.tables import NotARunFolder, RunFolder

app = typer.Typer(
    name="bench",
    help="Paired, synchronized benchmarks of MuSGD implementations: screen, probe, complete fits, parity, reports.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# --- options shared by the tier commands -----------------------------------------------------------------
ArmsOption = Annotated[
    str,
    typer.Option(
        help="Comma-separated arms, baseline first: baseline, candidate, upstream, or package.module:Class."
    ),
]
WarmupOption = Annotated[int, typer.Option(help="Warm-up trials per case (alternating arms; kept in the log, not in the statistics).")]
PairsOption = Annotated[int, typer.Option(help="Measured pairs (rounds) per case, in counterbalanced order.")]
OrderOption = Annotated[str, typer.Option(help="Arm order within pairs: alternate (AB, BA, …) or random (seeded).")]
SeedOption = Annotated[int, typer.Option(help="Seed for data, random order and the bootstrap.")]
BarOption = Annotated[float | None, typer.Option(help="The bar, in percent, the paired reduction must clear (e.g. 8).")]
DeviceOption = Annotated[str, typer.Option(help="cpu, cuda or cuda:N.")]
BudgetOption = Annotated[str | None, typer.Option(help="Device-memory cap emulated on a larger card, e.g. 24GiB or 800MiB.")]
ControlOption = Annotated[bool, typer.Option("--control", help="A/A control: run the first arm against itself.")]
ResumeOption = Annotated[
    Path | None, typer.Option(help="Continue an interrupted run folder where it stopped (its saved plan wins).")
]
OutOption = Annotated[Path, typer.Option(help="Folder under which run folders are created.")]
QuietOption = Annotated[bool, typer.Option("--quiet", help="No live progress bar: one plain line per trial (for CI logs).")]
NoReportOption = Annotated[bool, typer.Option("--no-report", help="Do not write the markdown report when the run ends.")]


def command_line() -> str:
    """The exact command as typed, recorded in the plan and shown in the report."""
    return "bench " + shlex.join(sys.argv[1:])


def write_default_report(folder: RunFolder) -> Path:
    """The report every tier command writes when its run ends (unless --no-report)."""
    from harness.report import write_report

    return write_report([folder])


def launch(build_plan: Callable[[], Plan], resume: Path | None, out: Path, quiet: bool, no_report: bool) -> RunFolder:
    """Start the run ``build_plan`` describes, or resume ``resume`` (whose saved plan wins over options).

    ``build_plan`` checks every input before anything is written, so a bad input leaves no run folder.
    """
    report = None if no_report else write_default_report
    if resume is not None:
        return resume_run(resume, quiet=quiet, report=report)
    return start_run(build_plan(), out, quiet=quiet, report=report)


def not_available(command: str, issue: int) -> None:
    """Say plainly that a command has not landed yet, and exit non-zero."""
    errors.print(f"bench {command} is not available yet (see issue {issue}); nothing was run.")
    raise typer.Exit(1)


@app.command("env")
def env_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print the fingerprint as JSON.")] = False,
) -> None:
    """Show this machine's environment fingerprint (what every run records in env.json)."""
    record = env_module.collect()
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


@app.command("pair")
def pair_command() -> None:
    """Complete paired fits (the decisive tier): `bench pair --steps 384`."""
    not_available("pair", 5)


@app.command("screen")
def screen_command() -> None:
    """Optimizer-only crossover screen over YOLO26 scales and padding guards."""
    not_available("screen", 4)


@app.command("probe")
def probe_command() -> None:
    """Head-memory probes under a device budget; out-of-memory is a recorded result."""
    not_available("probe", 6)


@app.command("parity")
def parity_command() -> None:
    """The numerical contract of candidate against baseline, as a command."""
    not_available("parity", 3)


@app.command("report")
def report_command(
    run_dirs: Annotated[
        list[Path] | None,
        typer.Argument(help="Run folders; several make one report side by side (e.g. a claim and its A/A control).",
                       metavar="RUN_DIR...", show_default=False),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="Markdown file to write (.md); needed for several run folders. "
                     "Default: report.md inside the single run folder."),
    ] = None,
) -> None:
    """Write the markdown report (with PNG plots beside it) of one or more run folders, from the folders alone."""
    from harness.report import write_report

    folders = [RunFolder.open(path) for path in run_dirs or []]
    console.print(f"report: {write_report(folders, output)}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``bench`` script: bad input is one line on stderr and exit status 2."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args:
        args = ["--help"]
    try:
        result = typer.main.get_command(app).main(args=args, prog_name="bench", standalone_mode=False)
    except (InputError, NotARunFolder) as exc:
        errors.print(f"bench: error: {exc}", soft_wrap=True)
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        errors.print("bench: interrupted; finished trials are in the run folder (resume it with --resume)")
        return 130
    except Exception as exc:
        # click's (or typer's vendored click's) usage errors: bad option names or values.
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            errors.print(f"bench: error: {exc.format_message()}", soft_wrap=True)
            return int(exc.exit_code)
        raise
    return result if isinstance(result, int) else 0


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
