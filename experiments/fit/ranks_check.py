"""A fit's ranks: the launcher options passed through, the checks of --gpus, the isolation in words."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import shlex
from typing import Any

from harness.errors import InputError
from harness.protocol_options import ProtocolOptions


def isolation_text(protocol: ProtocolOptions, workload: str) -> str:
    if protocol.gpus == 1:
        return (
            "a fresh worker process per trial (python -m harness.isolation); the parent schedules and "
            "collects rows and never touches the GPU"
        )
    launch = (
        "one worker per trial launches Ultralytics' own DDP fit (torch.distributed.run over a generated file)"
        if workload == "ultralytics"
        else "each trial's ranks started fresh by torch.distributed.run (python -m harness.isolation in each)"
    )
    return (
        f"{protocol.gpus} ranks per trial, data-parallel ({protocol.backend}, devices "
        f"{', '.join(protocol.rank_devices)}): {launch}; the parent schedules and collects rank 0's row and "
        "never touches the GPU; a rank that dies fails the trial"
    )


def check_launcher_options(text: str, words: list[str]) -> None:
    """``--torchrun``'s words read by ``torch.distributed.run``'s own parser."""
    from torch.distributed.run import get_args_parser  # the elastic launcher: a worker's start needs none

    parser = get_args_parser()
    parser.exit_on_error = False
    launch = ["--nproc-per-node", "2", *words, "--module", "harness.isolation", "target"]
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            parsed, unknown = parser.parse_known_args(launch)
    except (argparse.ArgumentError, SystemExit) as exc:
        unknown, parsed = [str(exc)], None
    if unknown or parsed is None or parsed.training_script != "harness.isolation":
        left = " ".join(unknown) or "a script of its own"
        raise InputError(
            f"--torchrun '{text}' is not torch.distributed.run's options ({left}); give its rendezvous options, "
            "e.g. '--nnodes 2 --node-rank 0 --rdzv-backend c10d --rdzv-endpoint HOST:29400 --rdzv-id ID'"
        )


def check_ranks(protocol: ProtocolOptions, settings: Any, workload: str, machine: bool = True) -> None:
    """Refuse --gpus, --batch or --torchrun settings a data-parallel fit cannot run (``InputError``)."""
    ranks = protocol.gpus
    if settings.torchrun and (ranks == 1 or workload != "embedded"):
        raise InputError(
            "--torchrun passes rendezvous options to the embedded workload's ranks: it needs --gpus 2 or more "
            "and --workload embedded (Ultralytics' DDP launch runs on one node)"
        )
    try:
        words = shlex.split(settings.torchrun)
    except ValueError as exc:
        raise InputError(f"--torchrun '{settings.torchrun}' is not a command line: {exc}") from None
    if words:
        check_launcher_options(settings.torchrun, words)
    if ranks == 1:
        return
    if settings.batch % ranks:
        raise InputError(
            f"--batch {settings.batch} is the global batch, split evenly over --gpus {ranks}; use a multiple of "
            f"{ranks} (e.g. --batch {settings.batch + ranks - settings.batch % ranks})"
        )
    if workload == "ultralytics":
        if not protocol.device.startswith("cuda"):
            raise InputError(
                f"--gpus {ranks} with the real trainer: Ultralytics' DDP launch needs CUDA devices; use --device "
                "cuda, or --workload embedded for CPU ranks on gloo"
            )
        if machine and importlib.util.find_spec("cloudpickle") is None:
            raise InputError(
                "--gpus with the real trainer: Ultralytics' DDP launch pickles its trainer with cloudpickle, which "
                "is not importable here; pip install 'cloudpickle>=3.1.1'"
            )
