"""``bench``: the command line, and the composition root that wires the project's tiers into the harness.

Every command checks its inputs before anything is written; a bad input is one line on stderr and exit
status 2. The tier commands share one set of protocol options and one set of run options (``SHARED`` and
``RUN`` below, added to each command by ``tier_command``); their defaults come from ``ProtocolOptions``, and
each tier's own options take theirs from the tier's settings dataclass.
"""

from __future__ import annotations

import inspect
import json
import shlex
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from experiments.fit.plan import FitSettings as _Fit
from experiments.parity import ParitySettings as _Parity
from experiments.probe.plan import ProbeSettings as _Probe
from experiments.screen.plan import ScreenSettings as _Screen
from harness import env as env_module
from harness.console import console, errors
from harness.options import (
    AUTO_DEVICE,
    DEFAULT_ARMS,
    InputError,
    check_gpus,
    check_non_negative,
    check_positive,
    protocol_options,
    resolve_device,
    split_device_list,
)
from harness.protocol import Arm, Plan, ProtocolOptions
from harness.run import Runner, RunOptions
from harness.tables import PLAN, NotARunFolder, RunFolder
from harness.tier import Run, TierRegistry

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
        str,
        DEFAULT_ARMS,
        "Comma-separated arms, baseline first: baseline, candidate, upstream, or package.module:Class.",
    ),
    Shared(
        "warmup",
        int,
        _default("warmup"),
        "Discarded warm-up trials per case, cycling through the arms (kept in the log, not in the statistics).",
    ),
    Shared(
        "pairs",
        int,
        _default("pairs"),
        "Measured pairs (rounds: each arm once) per case, in counterbalanced order.",
    ),
    Shared(
        "order", str, _default("order"), "Arm order within pairs: alternate (AB, BA, …) or random (seeded)."
    ),
    Shared("seed", int, _default("seed"), "Seed for data, random order and the bootstrap."),
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
        "control", bool, _default("control"), "A/A control: run the first arm against itself.", "--control"
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
    Shared("out", Path, Path("runs"), "Folder under which run folders are created."),
    Shared(
        "stop_after",
        float | None,
        None,
        "Stop cleanly (exit 130) before a trial that would not end within this many seconds of the command's start (estimated from the log); continue with --resume.",
    ),
    Shared("quiet", bool, False, "No live progress bar: one plain line per trial (for CI logs).", "--quiet"),
    Shared("no_report", bool, False, "Do not write the markdown report when the run ends.", "--no-report"),
)


@dataclass(frozen=True)
class RunArgs:
    """The run options as given: where, how, resume or not."""

    resume: Path | None
    out: Path
    stop_after: float | None
    quiet: bool
    no_report: bool

    def runner(self) -> Runner:
        if self.stop_after is not None and not self.stop_after > 0:
            raise InputError(f"--stop-after must be a positive number of seconds (got {self.stop_after})")
        options = RunOptions(
            out=self.out, quiet=self.quiet, report=not self.no_report, stop_after=self.stop_after
        )
        return Runner(registry(), options)


def tier_command(name: str, protocol: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``func`` as command ``name`` with the shared protocol options (unless ``protocol=False``) and
    the run options after its own; ``func`` receives them as ``protocol`` (a dict of the values as given)
    and ``run`` (``RunArgs``)."""
    shared = SHARED if protocol else ()

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        hints = typing.get_type_hints(func, include_extras=True)
        own = [
            inspect.Parameter(
                p.name, inspect.Parameter.KEYWORD_ONLY, default=p.default, annotation=hints[p.name]
            )
            for p in inspect.signature(func).parameters.values()
            if p.name not in ("protocol", "run")
        ]

        def command(**values: Any) -> Any:
            given = {option.name: values.pop(option.name) for option in shared}
            run = RunArgs(**{option.name: values.pop(option.name) for option in RUN})
            return func(protocol=given, run=run, **values)

        command.__signature__ = inspect.Signature([*own, *(o.parameter() for o in (*shared, *RUN))])
        command.__doc__, command.__name__ = func.__doc__, func.__name__
        app.command(name)(command)
        return func

    return decorate


def command_line() -> str:
    """The exact command as typed, recorded in the plan and shown in the report."""
    return "bench " + shlex.join(sys.argv[1:])


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
    if run.resume is not None:
        recorded = Plan.from_json(RunFolder.open(run.resume).read_json(PLAN)).tier
        if recorded not in accepts:
            raise InputError(
                f"--resume {run.resume} is a '{recorded}' run; resume it with the command that started it "
                f"(this one resumes {', '.join(accepts)} runs)"
            )
        return runner.resume(run.resume)
    if not isinstance(protocol, ProtocolOptions):
        protocol = protocol_options(**protocol, announce=console.print)
    plan = runner.tiers.get(tier).make_plan(protocol, settings, command_line())
    return runner.start(plan)


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


@tier_command("pair")
def pair_command(
    protocol: dict[str, Any],
    run: RunArgs,
    steps: Annotated[
        int,
        typer.Option(help="Optimizer steps per fit; a whole number of epochs of images/batch iterations."),
    ] = _Fit.steps,
    workload: Annotated[
        str,
        typer.Option(
            help="auto (the real trainer when ultralytics is importable, else embedded), ultralytics or embedded."
        ),
    ] = _Fit.workload,
    images: Annotated[
        int | None,
        typer.Option(help="Synthetic training images (default 256; with --data, counted from it)."),
    ] = _Fit.images,
    val_images: Annotated[
        int, typer.Option(help="Synthetic validation images (32 = four validation batches).")
    ] = _Fit.val_images,
    imgsz: Annotated[
        int | None, typer.Option(help="Image size in pixels (default 640 real trainer, 32 embedded).")
    ] = _Fit.imgsz,
    batch: Annotated[
        int, typer.Option(help="Batch size; nbs is set to it so every iteration steps the optimizer.")
    ] = _Fit.batch,
    amp: Annotated[
        str, typer.Option(help="Precision: auto (bf16 on CUDA, fp32 on cpu), bf16, fp16 or fp32.")
    ] = _Fit.amp,
    model: Annotated[
        str, typer.Option(help="Model yaml for the real trainer (no pretrained weights).")
    ] = _Fit.model,
    data: Annotated[
        Path | None,
        typer.Option(help="A YOLO-format data.yaml (real trainer); default: a generated synthetic set."),
    ] = None,
    data_cache: Annotated[
        Path | None, typer.Option(help="Folder for generated synthetic sets (default OUT/datasets).")
    ] = None,
    workers: Annotated[
        int, typer.Option(help="Real trainer: dataloader workers (0 on cpu, upstream's rule).")
    ] = _Fit.workers,
    cache: Annotated[str, typer.Option(help="Real trainer: image cache ram, disk or none.")] = _Fit.cache,
    close_mosaic: Annotated[
        int, typer.Option(help="Real trainer: close mosaic for the final N epochs (upstream's 10).")
    ] = _Fit.close_mosaic,
    stages: Annotated[
        bool,
        typer.Option(
            "--stages", help="Diagnostic run (own run folder, never a claim): stage shares and the ceiling."
        ),
    ] = _Fit.stages,
    trial_timeout: Annotated[
        int, typer.Option(help="Seconds before a worker is killed (its trial fails).")
    ] = _Fit.trial_timeout,
    keep_checkpoints: Annotated[
        bool,
        typer.Option(
            "--keep-checkpoints",
            help="Keep each fit's checkpoint files (deleted after each trial by default).",
        ),
    ] = _Fit.keep_checkpoints,
    torchrun: Annotated[
        str,
        typer.Option(
            help="With --gpus N, embedded workload: torch.distributed.run's rendezvous options for several nodes, "
            "passed through, e.g. '--nnodes 2 --node-rank 0 --rdzv-backend c10d --rdzv-endpoint HOST:29400 --rdzv-id ID'.",
        ),
    ] = _Fit.torchrun,
) -> None:
    """Complete paired fits (the decisive tier): `bench pair --steps 384`."""
    settings = _Fit(
        workload=workload,
        steps=steps,
        images=images,
        val_images=val_images,
        batch=batch,
        imgsz=imgsz,
        amp=amp,
        model=model,
        data=None if data is None else str(data),
        data_cache=str(data_cache or run.out / "datasets"),
        workers=workers,
        cache=cache,
        close_mosaic=close_mosaic,
        stages=stages,
        trial_timeout=trial_timeout,
        keep_checkpoints=keep_checkpoints,
        torchrun=torchrun,
    )
    launch("stages" if stages else "pair", protocol, settings, run, accepts=("pair", "stages"))


@tier_command("screen")
def screen_command(
    protocol: dict[str, Any],
    run: RunArgs,
    scales: Annotated[
        str, typer.Option(help="Comma-separated YOLO26 scales: n, s, m, l, x.")
    ] = _Screen.scales,
    guards: Annotated[
        str,
        typer.Option(help="Padding guards for arms that have one: whole numbers (0 = exact shapes) or none."),
    ] = _Screen.guards,
    steps: Annotated[int, typer.Option(help="Timed optimizer steps per trial (the window).")] = _Screen.steps,
    warmup_steps: Annotated[
        int, typer.Option(help="Untimed warm-up steps inside each trial, before the window.")
    ] = _Screen.warmup_steps,
    floor_replays: Annotated[
        int, typer.Option(help="CUDA-graph replays timed for the launch floor.")
    ] = _Screen.floor_replays,
    dtype: Annotated[
        str, typer.Option(help="Parameter dtype: float32, bfloat16 or float16.")
    ] = _Screen.dtype,
) -> None:
    """Optimizer-only crossover screen over YOLO26 scales and padding guards."""
    settings = _Screen(scales, guards, steps, warmup_steps, floor_replays, dtype)
    launch("screen", protocol, settings, run, accepts=("screen",))


@tier_command("probe")
def probe_command(
    protocol: dict[str, Any],
    run: RunArgs,
    head: Annotated[
        str, typer.Option(help="Head workload: lm (softcapped LM head) or detect (YOLO26 detect head).")
    ] = _Probe.head,
    variants: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated variants, one case each: lm takes native,chunked (default both); detect takes native."
        ),
    ] = _Probe.variants,
    reserve: Annotated[
        str | None,
        typer.Option(
            help="Device memory held for the whole of every trial, standing for the rest of the learner (e.g. 14GiB); needs CUDA."
        ),
    ] = _Probe.reserve,
    learner_ms: Annotated[
        float | None,
        typer.Option(
            help="Measured milliseconds of one whole learner step: the report states the head's share and the most a zero-cost head could save."
        ),
    ] = _Probe.learner_ms,
    tokens: Annotated[int, typer.Option(help="lm: hidden states N (rows).")] = _Probe.tokens,
    vocab: Annotated[int, typer.Option(help="lm: vocabulary V (head weight rows).")] = _Probe.vocab,
    dim: Annotated[int, typer.Option(help="lm: model width d.")] = _Probe.dim,
    cap: Annotated[float, typer.Option(help="lm: logit softcap, cap·tanh(z/cap).")] = _Probe.cap,
    chunk: Annotated[
        int, typer.Option(help="lm chunked: rows per chunk (memory O(chunk·V)).")
    ] = _Probe.chunk,
    scale: Annotated[
        str, typer.Option(help="detect: YOLO26 scale(s), comma-separated: n, s, m, l, x.")
    ] = _Probe.scale,
    imgsz: Annotated[
        int, typer.Option(help="detect: image size in pixels (a multiple of 32).")
    ] = _Probe.imgsz,
    batch: Annotated[int, typer.Option(help="detect: images per batch.")] = _Probe.batch,
) -> None:
    """Head-memory probes under a device budget; out-of-memory is a recorded result."""
    settings = _Probe(
        head, variants, reserve, learner_ms, tokens, vocab, dim, cap, chunk, scale, imgsz, batch
    )
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
    candidate: Annotated[str, typer.Option(help="The arm checked against the baseline.")] = _Parity.candidate,
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

    settings = _Parity(scale=scale, steps=steps, fit=fit, candidate=candidate)
    options = None
    if run.resume is None:
        first, gpus = split_device_list(device, gpus)
        resolved, why = resolve_device(first)
        console.print(f"device: {resolved} ({why})")
        arms = (Arm(settings.baseline, "baseline", settings.baseline), Arm(candidate, "candidate", candidate))
        options = ProtocolOptions(
            arms,
            warmup=0,
            pairs=check_positive("--steps", steps),
            seed=int(check_non_negative("--seed", seed)),
            device=resolved,
            gpus=check_gpus(gpus, resolved),
        )
    result = launch("parity", options, settings, run, accepts=("parity",))
    if not parity.result_of(result).holds:
        errors.print("bench parity: the one-step contract is broken (see the report)")
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
    console.print(f"report: {write_report(folders, registry(), output)}")


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
