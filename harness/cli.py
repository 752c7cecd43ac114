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
from harness.options import InputError, check_choice, check_device, check_non_negative, check_positive
from harness.protocol import Plan
from harness.run import resume_run, start_run
from harness.tables import PLAN, NotARunFolder, RunFolder

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
WarmupOption = Annotated[
    int,
    typer.Option(help="Warm-up trials per case (alternating arms; kept in the log, not in the statistics)."),
]
PairsOption = Annotated[int, typer.Option(help="Measured pairs (rounds) per case, in counterbalanced order.")]
OrderOption = Annotated[
    str, typer.Option(help="Arm order within pairs: alternate (AB, BA, …) or random (seeded).")
]
SeedOption = Annotated[int, typer.Option(help="Seed for data, random order and the bootstrap.")]
BarOption = Annotated[
    float | None,
    typer.Option(
        help="The bar, in percent, the paired reduction must clear (e.g. 8); with --control, the tolerance ±bar "
        "the A/A difference must stay within (e.g. 1)."
    ),
]
DeviceOption = Annotated[str, typer.Option(help="cpu, cuda or cuda:N.")]
BudgetOption = Annotated[
    str | None, typer.Option(help="Device-memory cap emulated on a larger card, e.g. 24GiB or 800MiB.")
]
ControlOption = Annotated[
    bool, typer.Option("--control", help="A/A control: run the first arm against itself.")
]
ResumeOption = Annotated[
    Path | None,
    typer.Option(help="Continue an interrupted run folder where it stopped (its saved plan wins)."),
]
OutOption = Annotated[Path, typer.Option(help="Folder under which run folders are created.")]
QuietOption = Annotated[
    bool, typer.Option("--quiet", help="No live progress bar: one plain line per trial (for CI logs).")
]
NoReportOption = Annotated[
    bool, typer.Option("--no-report", help="Do not write the markdown report when the run ends.")
]


def command_line() -> str:
    """The exact command as typed, recorded in the plan and shown in the report."""
    return "bench " + shlex.join(sys.argv[1:])


def write_default_report(folder: RunFolder) -> Path:
    """The report every tier command writes when its run ends (unless --no-report)."""
    from harness.report import write_report

    return write_report([folder])


def launch(
    build_plan: Callable[[], Plan],
    resume: Path | None,
    out: Path,
    quiet: bool,
    no_report: bool,
    tiers: tuple[str, ...],
) -> RunFolder:
    """Start the run ``build_plan`` describes, or resume ``resume`` (whose saved plan wins over options).

    ``build_plan`` checks every input before anything is written, so a bad input leaves no run folder; a
    resumed folder must be one of this command's ``tiers``.
    """
    report = None if no_report else write_default_report
    if resume is not None:
        tier = Plan.from_json(RunFolder.open(resume).read_json(PLAN)).tier
        if tier not in tiers:
            raise InputError(
                f"--resume {resume} is a '{tier}' run; resume it with the command that started it "
                f"(this one resumes {', '.join(tiers)} runs)"
            )
        return resume_run(resume, quiet=quiet, report=report)
    return start_run(build_plan(), out, quiet=quiet, report=report)


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
def pair_command(
    arms: ArmsOption = "baseline,candidate",
    steps: Annotated[
        int,
        typer.Option(help="Optimizer steps per fit; a whole number of epochs of images/batch iterations."),
    ] = 384,
    workload: Annotated[
        str,
        typer.Option(
            help="auto (the real trainer when ultralytics is importable, else embedded), ultralytics or embedded."
        ),
    ] = "auto",
    images: Annotated[
        int | None,
        typer.Option(help="Synthetic training images (default 256; with --data, counted from it)."),
    ] = None,
    val_images: Annotated[
        int, typer.Option(help="Synthetic validation images (32 = four validation batches).")
    ] = 32,
    imgsz: Annotated[
        int | None, typer.Option(help="Image size in pixels (default 640 real trainer, 32 embedded).")
    ] = None,
    batch: Annotated[
        int, typer.Option(help="Batch size; nbs is set to it so every iteration steps the optimizer.")
    ] = 4,
    amp: Annotated[
        str, typer.Option(help="Precision: auto (bf16 on CUDA, fp32 on cpu), bf16, fp16 or fp32.")
    ] = "auto",
    model: Annotated[
        str, typer.Option(help="Model yaml for the real trainer (no pretrained weights).")
    ] = "yolo26n.yaml",
    data: Annotated[
        Path | None,
        typer.Option(help="A YOLO-format data.yaml (real trainer); default: a generated synthetic set."),
    ] = None,
    data_cache: Annotated[
        Path | None, typer.Option(help="Folder for generated synthetic sets (default OUT/datasets).")
    ] = None,
    workers: Annotated[
        int, typer.Option(help="Real trainer: dataloader workers (0 on cpu, upstream's rule).")
    ] = 4,
    cache: Annotated[str, typer.Option(help="Real trainer: image cache ram, disk or none.")] = "ram",
    close_mosaic: Annotated[
        int, typer.Option(help="Real trainer: close mosaic for the final N epochs (upstream's 10).")
    ] = 10,
    stages: Annotated[
        bool,
        typer.Option(
            "--stages", help="Diagnostic run (own run folder, never a claim): stage shares and the ceiling."
        ),
    ] = False,
    trial_timeout: Annotated[
        int, typer.Option(help="Seconds before a worker is killed (its trial fails).")
    ] = 3600,
    keep_checkpoints: Annotated[
        bool,
        typer.Option(
            "--keep-checkpoints",
            help="Keep each fit's checkpoint files (deleted after each trial by default).",
        ),
    ] = False,
    stop_after: Annotated[
        int | None,
        typer.Option(
            help="Stop cleanly (exit 130) before a trial that would not end within this many seconds of "
            "the command's start (estimated from the log); continue with --resume."
        ),
    ] = None,
    warmup: WarmupOption = 2,
    pairs: PairsOption = 5,
    order: OrderOption = "alternate",
    seed: SeedOption = 0,
    bar: BarOption = None,
    device: DeviceOption = "cpu",
    budget: BudgetOption = None,
    control: ControlOption = False,
    resume: ResumeOption = None,
    out: OutOption = Path("runs"),
    quiet: QuietOption = False,
    no_report: NoReportOption = False,
) -> None:
    """Complete paired fits (the decisive tier): `bench pair --steps 384`."""
    from experiments import fit
    from experiments.fit.report import finish

    fit.stop_after(stop_after)
    folder = launch(
        lambda: fit.make_plan(
            arms=arms,
            warmup=warmup,
            pairs=pairs,
            order=order,
            seed=seed,
            bar=bar,
            device=device,
            budget=budget,
            control=control,
            workload=workload,
            steps=steps,
            images=images,
            val_images=val_images,
            batch=batch,
            imgsz=imgsz,
            amp=amp,
            model=model,
            data=data,
            data_cache=data_cache or out / "datasets",
            workers=workers,
            cache=cache,
            close_mosaic=close_mosaic,
            stages=stages,
            trial_timeout=trial_timeout,
            keep_checkpoints=keep_checkpoints,
            command=command_line(),
            announce=console.print,
        ),
        resume,
        out,
        quiet,
        no_report,
        tiers=("pair", "stages"),
    )
    finish(folder, echo=console.print)


@app.command("screen")
def screen_command(
    scales: Annotated[str, typer.Option(help="Comma-separated YOLO26 scales: n, s, m, l, x.")] = "n,s,m,l,x",
    guards: Annotated[
        str,
        typer.Option(help="Padding guards for arms that have one: whole numbers (0 = exact shapes) or none."),
    ] = "0,256,512,none",
    arms: ArmsOption = "baseline,candidate",
    steps: Annotated[int, typer.Option(help="Timed optimizer steps per trial (the window).")] = 10,
    repeats: Annotated[int, typer.Option(help="Measured rounds per scale (each arm once per round).")] = 5,
    warmup: Annotated[
        int, typer.Option(help="Untimed warm-up STEPS inside each trial, before the window.")
    ] = 2,
    warmup_trials: Annotated[
        int, typer.Option(help="Discarded warm-up TRIALS per arm per scale, before the rounds.")
    ] = 1,
    floor_replays: Annotated[int, typer.Option(help="CUDA-graph replays timed for the launch floor.")] = 20,
    dtype: Annotated[str, typer.Option(help="Parameter dtype: float32, bfloat16 or float16.")] = "float32",
    device: DeviceOption = "cuda",
    order: OrderOption = "alternate",
    seed: SeedOption = 0,
    bar: BarOption = None,
    resume: ResumeOption = None,
    out: OutOption = Path("runs"),
    quiet: QuietOption = False,
    no_report: NoReportOption = False,
) -> None:
    """Optimizer-only crossover screen over YOLO26 scales and padding guards."""
    from experiments import screen
    from harness.run import summarize

    folder = launch(
        lambda: screen.make_plan(
            scales,
            guards,
            arms,
            steps,
            repeats,
            warmup,
            warmup_trials,
            floor_replays,
            dtype,
            device,
            seed,
            order,
            bar,
            command_line(),
        ),
        resume,
        out,
        quiet,
        no_report,
        tiers=("screen",),
    )
    if no_report:  # the report's screen section writes screen_summary.csv; without a report, write it here
        screen.write_screen_summary(folder, summarize(folder)[1])


@app.command("probe")
def probe_command(
    head: Annotated[
        str, typer.Option(help="Head workload: lm (softcapped LM head) or detect (YOLO26 detect head).")
    ] = "lm",
    variants: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated variants, one case each: lm takes native,chunked (default both); "
            "detect takes native."
        ),
    ] = None,
    arms: ArmsOption = "baseline,candidate",
    warmup: WarmupOption = 2,
    pairs: PairsOption = 5,
    order: OrderOption = "alternate",
    seed: SeedOption = 0,
    bar: BarOption = None,
    device: DeviceOption = "cpu",
    budget: BudgetOption = None,
    reserve: Annotated[
        str | None,
        typer.Option(
            help="Device memory held for the whole of every trial, standing for the rest of the learner "
            "(e.g. 14GiB); needs CUDA."
        ),
    ] = None,
    learner_ms: Annotated[
        float | None,
        typer.Option(
            help="Measured milliseconds of one whole learner step: the report states the head's share "
            "and the most a zero-cost head could save."
        ),
    ] = None,
    tokens: Annotated[int, typer.Option(help="lm: hidden states N (rows).")] = 131072,
    vocab: Annotated[int, typer.Option(help="lm: vocabulary V (head weight rows).")] = 8192,
    dim: Annotated[int, typer.Option(help="lm: model width d.")] = 512,
    cap: Annotated[float, typer.Option(help="lm: logit softcap, cap·tanh(z/cap).")] = 30.0,
    chunk: Annotated[int, typer.Option(help="lm chunked: rows per chunk (memory O(chunk·V)).")] = 16384,
    scale: Annotated[
        str, typer.Option(help="detect: YOLO26 scale(s), comma-separated: n, s, m, l, x.")
    ] = "n",
    imgsz: Annotated[int, typer.Option(help="detect: image size in pixels (a multiple of 32).")] = 640,
    batch: Annotated[int, typer.Option(help="detect: images per batch.")] = 16,
    control: ControlOption = False,
    resume: ResumeOption = None,
    out: OutOption = Path("runs"),
    quiet: QuietOption = False,
    no_report: NoReportOption = False,
) -> None:
    """Head-memory probes under a device budget; out-of-memory is a recorded result."""
    from experiments import probe

    launch(
        lambda: probe.make_plan(
            head=head,
            variants=variants,
            arms=arms,
            warmup=warmup,
            pairs=pairs,
            order=order,
            seed=seed,
            bar=bar,
            device=device,
            budget=budget,
            control=control,
            reserve=reserve,
            learner_ms=learner_ms,
            tokens=tokens,
            vocab=vocab,
            dim=dim,
            cap=cap,
            chunk=chunk,
            scale=scale,
            imgsz=imgsz,
            batch=batch,
            command=command_line(),
        ),
        resume,
        out,
        quiet,
        no_report,
        tiers=("probe",),
    )


@app.command("parity")
def parity_command(
    scale: Annotated[str, typer.Option(help="YOLO26 parameter set: n, s, m, l or x.")] = "n",
    steps: Annotated[
        int, typer.Option(help="Steps to follow; step one is judged, later ones are reported.")
    ] = 1,
    fit: Annotated[
        bool, typer.Option("--fit", help="Real forward/backward steps of the embedded fit workload instead.")
    ] = False,
    candidate: Annotated[str, typer.Option(help="The arm checked against the baseline.")] = "candidate",
    device: DeviceOption = "cpu",
    seed: SeedOption = 0,
    out: OutOption = Path("runs"),
) -> None:
    """The numerical contract of candidate against baseline, as a command (exit 1 when it breaks)."""
    from experiments import parity
    from experiments.arms import checked_optimizer
    from experiments.workloads import SCALES

    check_choice("--scale", scale, SCALES)
    check_positive("--steps", steps)
    check_non_negative("--seed", seed)
    check_device(device)
    checked_optimizer(candidate, option="--candidate")
    settings = parity.ParitySettings(
        scale=scale, device=device, steps=steps, seed=seed, fit=fit, candidate=candidate
    )
    result = parity.run_parity(settings)
    folder = parity.write_parity_folder(result, out, command_line())
    console.print(folder.file("report.md").read_text())
    console.print(f"parity folder: {folder.path}")
    if not result.holds:
        errors.print("bench parity: the one-step contract is broken (see the table above)")
        raise typer.Exit(1)


@app.command("report")
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
