"""One trial of ``bench command``: the arm's command line in a fresh process, timed by the parent."""

from __future__ import annotations

import atexit
import os
import subprocess
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

from experiments.command.plan import CommandSettings, expand, figure_pattern
from harness.calibration import delay_seconds, runs_as
from harness.injected import inject
from harness.isolation import last_line, log_tail, reap
from harness.placement import worker_environment
from harness.plan import Plan
from harness.telemetry import USAGE_KEY, ProcessUsage
from harness.trial import TrialContext, TrialFunction

WATCH_S = 0.02  # how often a running command's timeout and cancel are looked at (its exit is not polled)

_live: set[subprocess.Popen] = set()  # commands still running: ended if bench itself ends first
_live_lock = threading.Lock()


class CommandFailed(RuntimeError):
    """The command exited non-zero, ran past its timeout, or printed no figure."""


def _end_live() -> None:
    with _live_lock:
        for process in list(_live):
            _kill_tree(process)


atexit.register(_end_live)


def _kill_tree(process: subprocess.Popen) -> None:
    """End a command and everything it started (its children first)."""
    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.Error:  # the process is gone: end what can be ended
        children = []
    for child in [*children, process]:
        try:
            child.kill()
        except Exception:  # noqa: BLE001 - it ended meanwhile
            pass


def run_command(
    argv: list[str],
    env: dict[str, str],
    log_path: Path,
    timeout_s: float | None,
    cores: frozenset[int] | None,
    cancel: threading.Event | None = None,
    delay_s: float | None = None,
) -> tuple[float, ProcessUsage, int | str, dict[str, float]]:
    """Run ``argv`` on ``cores``: (wall seconds, CPU usage, exit status or why stopped, delay figure)."""
    stopped: list[str] = []
    exited = threading.Event()

    def stop_when_due() -> (
        None
    ):  # ends the command past its timeout or once called off, unless it exits first
        while not exited.wait(WATCH_S):
            if timeout_s is not None and time.perf_counter() - started > timeout_s:
                stopped.append(f"timeout after {timeout_s:g} s")
            elif cancel is not None and cancel.is_set():
                stopped.append("called off")
            else:
                continue
            _kill_tree(process)
            return

    with open(log_path, "ab") as output:
        started = time.perf_counter()
        try:
            process = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, env=env)
        except OSError as exc:
            raise CommandFailed(f"the command could not start: {exc.strerror or exc} ({argv[0]})") from None
        with _live_lock:
            _live.add(process)
        if cores:
            try:
                os.sched_setaffinity(process.pid, cores)
            except OSError:  # it ended already
                pass
        threading.Thread(target=stop_when_due, daemon=True).start()
        try:
            os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)  # blocks until it has exited
            injected = inject(delay_s)
            seconds = time.perf_counter() - started
            usage = reap(process)
        except BaseException:
            _kill_tree(process)
            process.wait()
            raise
        finally:
            exited.set()
            with _live_lock:
                _live.discard(process)
    return seconds, usage, stopped[0] if stopped else process.returncode, injected


def trial_function(plan: Plan) -> TrialFunction:
    """The command tier's trial function: one fresh process per trial, its output in ``trials/<index>.log``."""
    settings = CommandSettings.from_dict(plan.settings)
    pattern = figure_pattern(settings.figure) if settings.figure else None

    def trial(ctx: TrialContext) -> dict[str, Any]:
        logs = ctx.run_dir / "trials"
        logs.mkdir(exist_ok=True)
        log_path = logs / f"{ctx.trial.index}.log"
        log_path.unlink(missing_ok=True)  # a resumed trial's log starts empty
        arm = runs_as(ctx.arm)  # a calibration arm runs the baseline's command
        env = {
            **os.environ,
            "BENCH_ARM": arm.label,
            "BENCH_ARM_SPEC": arm.spec,
            "BENCH_SEED": str(ctx.seed),
            "BENCH_TRIAL": str(ctx.trial.index),
            **(worker_environment(ctx.placement) if ctx.placement is not None else {}),
        }
        cores = frozenset(ctx.placement.worker_cores) if ctx.placement is not None else None
        argv = expand(settings.argv, arm)
        delay = delay_seconds(ctx.arm, ctx.run_dir, ctx.case.label)
        seconds, usage, code, injected = run_command(
            argv, env, log_path, settings.timeout, cores, ctx.cancel, delay
        )
        if code != 0:
            raise CommandFailed(f"the command {_ended(code)}: {last_line(log_tail(log_path))}")
        figures: dict[str, Any] = {"command_seconds": round(seconds, 6), USAGE_KEY: asdict(usage), **injected}
        return {"value": round(seconds, 6) if pattern is None else _figure(pattern, log_path), **figures}

    return trial


def _ended(code: int | str) -> str:
    if isinstance(code, str):
        return f"was stopped ({code})"
    return f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"


def _figure(pattern: Any, log_path: Path) -> float:
    """The number of the last match of ``--figure`` in the command's output."""
    matches = list(pattern.finditer(log_path.read_text(errors="replace")))
    if not matches:
        raise CommandFailed(
            f"the command printed no match of --figure '{pattern.pattern}': {last_line(log_tail(log_path))}"
        )
    text = matches[-1].group("value" if "value" in pattern.groupindex else 1)
    try:
        return float(text)
    except (TypeError, ValueError):
        raise CommandFailed(f"--figure matched '{text}', which is not a number") from None
