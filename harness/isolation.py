"""Run one trial in a fresh worker process, so each trial starts from a cold process and a clean device.

A plain worker is ``python -m harness.isolation``; a trial's ranks are the same module under
``torch.distributed.run``. Either writes one result record per rank (a plain worker is rank 0).
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from harness.errors import DISK_FULL
from harness.placement import (
    PLACEMENT_ENV,
    Placement,
    apply_from_environment,
    split_placement,
    worker_environment,
)
from harness.telemetry import USAGE_KEY, ProcessUsage, usage_of_pid
from harness.timing import is_out_of_memory

# What a failure message reads of a trial's log: a worker's last line, or the launcher's failure summary at
# its end. That summary is about 1.5 KB plus 0.4 KB per rank (measured, torch 2.x: 2.3 KB for 2 ranks, 3.1 KB
# for 4), since each rank logs to its own file; 64 KiB holds it for over 100 ranks. A fit's log can be MBs.
LOG_TAIL_BYTES = 64 * 1024
PR_SET_PDEATHSIG = 1
RANKS_ENV = "BENCH_RANKS"  # set for the ranks run_in_ranks starts: harness.isolation runs as a rank
TRIAL_PID_ENV = "BENCH_TRIAL_PID"  # the process whose end ends every rank of the trial
RANK_LOG_ENV = "BENCH_RANK_LOG"  # each rank's own log: a path with {rank}
RANK_PLACEMENTS_ENV = "BENCH_RANK_PLACEMENTS"  # one placement per local rank (JSON list)
# Every rank's environment: NVLink multicast (NVLS) and symmetric-memory multicast stay off.
RANK_ENVIRONMENT = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


class WorkerDied(RuntimeError):
    """The worker process ended without writing a result (killed, crashed, timed out)."""


class WorkerError(RuntimeError):
    """The worker raised; the message carries the worker's exception type and text."""


class Cancelled(Exception):
    """The wait was called off (``wait_and_reap``'s ``cancel`` was set) before the child exited."""


def wait_and_reap(
    process: subprocess.Popen,
    timeout_s: float | None = None,
    poll_s: float = 0.01,
    cancel: threading.Event | None = None,
) -> ProcessUsage:
    """Wait for a child started with ``subprocess.Popen`` to exit, reap it."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    if not (hasattr(os, "waitid") and hasattr(os, "WNOWAIT")):
        process.wait(timeout_s)
        return ProcessUsage()
    while os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if deadline is not None and time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(process.args, timeout_s)
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"process {process.pid} called off")
        time.sleep(poll_s)
    return reap(process)


def reap(process: subprocess.Popen) -> ProcessUsage:
    """Reap a child that has exited but is not yet reaped: its usage, its switches from ``wait4``."""
    times = usage_of_pid(process.pid)
    _, status, rusage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return replace(
        times, voluntary_switches=rusage.ru_nvcsw, involuntary_switches=rusage.ru_nivcsw, source="wait4"
    )


def _launch(
    command: list[str],
    target: str,
    payload: dict[str, Any],
    env: dict[str, str],
    timeout_s: float | None,
    log_path: Path | None,
    cancel: threading.Event | None,
) -> tuple[list[dict[str, Any]], Any, int | str, str]:
    """Run ``command -m harness.isolation target`` to its end: the ranks' records, usage, exit and log tail.

    The tail is read only where the trial failed (an exit other than 0, or no record of local rank 0)."""
    with tempfile.TemporaryDirectory(prefix="bench-worker-") as tmp:
        payload_file, result_file = Path(tmp) / "payload.json", Path(tmp) / "result.json"
        payload_file.write_text(json.dumps(payload))
        output_file = Path(log_path or Path(tmp) / "output.log")
        root = str(Path(__file__).resolve().parent.parent)  # this checkout on PYTHONPATH
        env = {**os.environ, **env, "PYTHONUNBUFFERED": "1", RANK_LOG_ENV: rank_log_template(output_file)}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        command = [*command, "harness.isolation", target, str(payload_file), str(result_file)]
        with open(output_file, "ab") as output:
            process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env)
            try:
                usage, returncode = wait_and_reap(process, timeout_s, cancel=cancel), process.returncode
            except (subprocess.TimeoutExpired, Cancelled) as stopped:
                process.kill()
                wait_and_reap(process)
                called_off = isinstance(stopped, Cancelled)
                usage, returncode = None, "called off" if called_off else f"timeout after {timeout_s:g} s"
            except BaseException:
                process.kill()
                process.wait()
                raise
        records = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("result.json.rank*"))]
        ended_well = returncode == 0 and any(r["local_rank"] == 0 for r in records)
        return records, usage, returncode, "" if ended_well else log_tail(output_file)


def log_tail(path: Path) -> str:
    """The last ``LOG_TAIL_BYTES`` of a log, as text.

    A line cut at its start cannot mislead ``_raise_first_failure``: each summary entry names its rank first."""
    with open(path, "rb") as log:
        log.seek(max(log.seek(0, os.SEEK_END) - LOG_TAIL_BYTES, 0))
        return log.read().decode(errors="replace")


def last_line(text: str) -> str:
    """A log's last line with text in it, or ``no output``."""
    text = text.strip()
    return text.splitlines()[-1] if text else "no output"


def run_in_worker(
    target: str,
    payload: dict[str, Any],
    timeout_s: float | None = None,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    placement: Placement | None = None,
    cancel: threading.Event | None = None,
) -> dict[str, Any]:
    """Call ``target(payload)`` in a fresh Python process and return its result dict."""
    worker_env = {**(env or {}), **(worker_environment(placement) if placement else {})}
    records, usage, returncode, tail = _launch(
        [sys.executable, "-m"], target, payload, worker_env, timeout_s, log_path, cancel
    )
    if not records:
        raise WorkerDied(f"worker died without a result (exit {returncode}): {last_line(tail)}")
    if "exception" in records[0]:
        raise _raised(records[0]["exception"], "worker")
    return _with_usage(records[0]["value"], usage)


def rank_log_template(output_file: Path) -> str:
    """Where each rank of a trial logs: ``trials/3.log`` → ``trials/3.rank{rank}.log``."""
    output_file = Path(output_file)
    return str(output_file.with_name(f"{output_file.stem}.rank{{rank}}{output_file.suffix or '.log'}"))


def run_in_ranks(
    target: str,
    payload: dict[str, Any],
    ranks: int,
    timeout_s: float | None = None,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    launcher_options: Sequence[str] = (),
    placement: Placement | None = None,
    cancel: threading.Event | None = None,
) -> dict[str, Any]:
    """Call ``target(payload)`` in ``ranks`` fresh processes started by ``torch.distributed.run``."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
    command = [*launcher, *(list(launcher_options) or ["--standalone"]), "--module"]
    rank_env = {**(env or {}), **RANK_ENVIRONMENT, RANKS_ENV: "1", TRIAL_PID_ENV: str(os.getpid())}
    if placement is not None:
        shares = rank_placements(placement, ranks)
        rank_env.update(worker_environment(min(shares, key=lambda p: p.omp_threads)))
        rank_env[RANK_PLACEMENTS_ENV] = json.dumps([share.to_dict() for share in shares])
    records, usage, returncode, launcher_tail = _launch(
        command, target, payload, rank_env, timeout_s, log_path, cancel
    )
    _raise_first_failure(records, launcher_tail, returncode)
    firsts = [r for r in records if r.get("local_rank") == 0]
    if returncode != 0 or not firsts:
        lines = launcher_tail.splitlines()
        last = next((line for line in reversed(lines) if line.strip(" =-")), "no output")
        raise WorkerDied(f"the ranks ended without a result: {last.strip()} (launcher exit {returncode})")
    return _with_usage(firsts[0]["value"], usage)  # the launcher's and its reaped ranks' CPU time


def _with_usage(value: Any, usage: Any) -> Any:
    """A worker's result with the CPU usage of its whole life (where it is a dict and usage was read)."""
    if isinstance(value, dict) and usage is not None:
        value[USAGE_KEY] = asdict(usage)
    return value


def rank_placements(placement: Placement, ranks: int) -> list[Placement]:
    """One placement per local rank: equal shares of the worker cores, or all of them for fewer cores."""
    if len(placement.worker_cores) >= ranks:
        return split_placement(placement, ranks)
    threads = max(1, placement.torch_threads // ranks)
    shared = replace(
        placement,
        torch_threads=threads,
        interop_threads=max(1, placement.interop_threads // ranks),
        omp_threads=threads,
        mkl_threads=threads,
        reason=f"{placement.reason}; the worker cores shared by {ranks} ranks",
    )
    return [shared] * ranks


def _raised(failure: dict[str, Any], where: str) -> Exception:
    """The parent's exception for a failure a worker or rank reported."""
    message = f"{failure['type']} in {where}: {failure['message']}"
    if failure.get("out_of_memory"):
        return torch.OutOfMemoryError(message)
    if failure.get("errno") in DISK_FULL:
        return OSError(failure["errno"], message)
    return WorkerError(message)


def _raise_first_failure(records: list[dict[str, Any]], launcher_tail: str, returncode: int | str) -> None:
    """Raise the trial's first failure, if any: a rank that died without a record, else the first to raise."""
    # Each failed rank's exit code, from the launcher's failure summary: an entry's "rank :" line, then its
    # "exitcode :" line. A rank may be listed twice (a failure and the root cause); its first entry counts.
    summary = re.findall(r"^\s*rank\s*:\s*(\d+).*\n\s*exitcode\s*:\s*(-?\d+)", launcher_tail, re.M)
    exits: dict[int, int] = {}
    for rank, code in summary:
        exits.setdefault(int(rank), int(code))
    recorded = {r["rank"] for r in records}
    died = {rank: code for rank, code in exits.items() if rank not in recorded and code != -signal.SIGTERM}
    if died:
        rank = min(died)
        code = died[rank]
        how = (
            f"{code} ({signal.Signals(-code).name})" if code < 0 and -code in signal.valid_signals() else code
        )
        raise WorkerDied(f"rank {rank} died without a result (exitcode {how}; launcher exit {returncode})")
    failures = sorted((r for r in records if "exception" in r), key=lambda r: r["time"])
    if failures:
        raise _raised(failures[0]["exception"], f"rank {failures[0]['rank']}")


def die_with_parent(parent_pid: int | None = None) -> None:
    """Ask Linux to kill this process when its parent dies."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def _end_now() -> None:
    """SIGKILL this process, and its process group where it leads one."""
    if os.getpgid(0) == os.getpid():
        os.killpg(0, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def end_with(pid: int, poll_s: float = 0.5) -> None:
    """End this process as soon as process ``pid`` ends: a daemon thread waits on a pidfd (or polls)."""
    try:
        handle: int | None = os.pidfd_open(pid)
    except ProcessLookupError:
        _end_now()
        return
    except (OSError, AttributeError):
        handle = None

    def watch() -> None:
        if handle is not None:
            select.select([handle], [], [])  # readable once the process has ended
        else:
            while True:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(poll_s)
        _end_now()

    threading.Thread(target=watch, name="bench-trial-watch", daemon=True).start()


def launched_rank() -> tuple[int, int] | None:
    """(rank, local rank) of a process started by ``torch.distributed.run``; None otherwise."""
    if "RANK" not in os.environ or "LOCAL_RANK" not in os.environ:
        return None
    return int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])


def guard_rank() -> None:
    """In a rank: die with the launcher that started it and with the trial's process, log to its own file."""
    die_with_parent()
    rank, _ = launched_rank() or (0, 0)
    template = os.environ.get(RANK_LOG_ENV)
    if template:
        sys.stdout.flush()
        sys.stderr.flush()
        log = os.open(template.format(rank=rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
    trial_pid = os.environ.get(TRIAL_PID_ENV)
    if trial_pid:
        end_with(int(trial_pid))


def _worker_main(target: str, payload_file: str, result_file: str) -> int:
    ranked = launched_rank() if os.environ.get(RANKS_ENV) else None
    if ranked is not None:
        guard_rank()
        shares = json.loads(os.environ.get(RANK_PLACEMENTS_ENV) or "[]")
        if shares:
            os.environ[PLACEMENT_ENV] = json.dumps(shares[ranked[1] % len(shares)])
    else:
        os.environ[TRIAL_PID_ENV] = str(os.getpid())  # ranks the target launches itself end with this worker
    placed = apply_from_environment()  # first, so every thread the target starts is placed
    module_name, _, attr = target.partition(":")
    payload = json.loads(Path(payload_file).read_text())
    try:
        value = getattr(importlib.import_module(module_name), attr)(payload)
        result: dict[str, Any] = {
            "value": {**value, **placed} if isinstance(value, dict) and placed else value
        }
    except Exception as exc:  # noqa: BLE001 - reported to the parent as data
        traceback.print_exc()
        failure = {
            "type": type(exc).__name__,
            "message": str(exc),
            "out_of_memory": is_out_of_memory(exc),
            "errno": exc.errno if isinstance(exc, OSError) else None,
        }
        result = {"exception": failure}
    rank, local_rank = ranked or (0, 0)
    record = {**result, "rank": rank, "local_rank": local_rank, "time": time.time()}
    Path(f"{result_file}.rank{rank}.tmp").write_text(json.dumps(record))
    os.replace(f"{result_file}.rank{rank}.tmp", f"{result_file}.rank{rank}")
    if ranked is None:
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if "exception" in result else 0)  # at once; non-zero: the launcher stops the other ranks


if __name__ == "__main__":
    sys.exit(_worker_main(*sys.argv[1:4]))
