"""Run one trial in a fresh worker process, so each trial starts from a cold process and a clean device.

The parent only schedules and collects: it writes the payload to a file, starts
``python -m harness.isolation TARGET PAYLOAD RESULT`` and reads the result file back. The worker imports
``TARGET`` (``module:function``), calls it with the payload dict and writes the returned dict. An exception in
the worker comes back as data and is raised again in the parent (an out-of-memory as
``torch.OutOfMemoryError``, so the protocol records a ``resource_failure``; a full disk as ``OSError``, so the
run stops); a worker that dies without a
result raises ``WorkerDied`` with its exit status and the tail of its output.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from harness.errors import DISK_FULL
from harness.placement import Placement, apply_from_environment, worker_environment
from harness.telemetry import USAGE_KEY, wait_and_reap
from harness.timing import is_out_of_memory

OUTPUT_TAIL_CHARS = 2000


class WorkerDied(RuntimeError):
    """The worker process ended without writing a result (killed, crashed, timed out)."""


class WorkerError(RuntimeError):
    """The worker raised; the message carries the worker's exception type and text."""


def run_in_worker(
    target: str,
    payload: dict[str, Any],
    timeout_s: float | None = None,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    placement: Placement | None = None,
) -> dict[str, Any]:
    """Call ``target(payload)`` in a fresh Python process and return its result dict.

    With a ``placement`` the worker places itself (cores and thread counts) before it imports the target. The
    worker's whole-life CPU usage (``telemetry.wait_and_reap``: its own and its reaped children's, e.g.
    DataLoader workers) comes back in the result under ``telemetry.USAGE_KEY``.
    """
    with tempfile.TemporaryDirectory(prefix="bench-worker-") as tmp:
        payload_file, result_file = Path(tmp) / "payload.json", Path(tmp) / "result.json"
        payload_file.write_text(json.dumps(payload))
        output_file = log_path or Path(tmp) / "output.log"
        command = [sys.executable, "-m", "harness.isolation", target, str(payload_file), str(result_file)]
        worker_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        if placement is not None:
            worker_env.update(worker_environment(placement))
        root = str(Path(__file__).resolve().parent.parent)
        worker_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, worker_env.get("PYTHONPATH")) if p)
        usage = None
        with open(output_file, "ab") as output:
            process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=worker_env)
            try:
                usage = wait_and_reap(process, timeout_s)
                returncode: int | str = process.returncode
            except subprocess.TimeoutExpired:
                process.kill()
                wait_and_reap(process)
                returncode = f"timeout after {timeout_s:g} s"
            except BaseException:  # interrupted while waiting: take the worker down with the parent
                process.kill()
                process.wait()
                raise
        if not result_file.is_file():
            tail = output_file.read_text(errors="replace")[-OUTPUT_TAIL_CHARS:].strip()
            last = tail.splitlines()[-1] if tail else "no output"
            raise WorkerDied(f"worker died without a result (exit {returncode}): {last}")
        result = json.loads(result_file.read_text())
    if "exception" in result:
        failure = result["exception"]
        message = f"{failure['type']} in worker: {failure['message']}"
        if failure.get("out_of_memory"):
            raise torch.OutOfMemoryError(message)
        if failure.get("errno") in DISK_FULL:  # the disk is full, not the arm broken: the run must stop
            raise OSError(failure["errno"], message)
        raise WorkerError(message)
    value = result["value"]
    if isinstance(value, dict) and usage is not None:
        value[USAGE_KEY] = asdict(usage)
    return value


def _worker_main(target: str, payload_file: str, result_file: str) -> int:
    placed = apply_from_environment()  # first, so every thread the target starts is placed
    module_name, _, attr = target.partition(":")
    payload = json.loads(Path(payload_file).read_text())
    try:
        value = getattr(importlib.import_module(module_name), attr)(payload)
        if isinstance(value, dict) and placed is not None:
            value = {**value, **placed}
        result: dict[str, Any] = {"value": value}
    except Exception as exc:  # noqa: BLE001 - reported to the parent as data
        traceback.print_exc()
        result = {
            "exception": {
                "type": type(exc).__name__,
                "message": str(exc),
                "out_of_memory": is_out_of_memory(exc),
                "errno": exc.errno if isinstance(exc, OSError) else None,
            }
        }
    tmp = Path(result_file + ".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, result_file)
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(*sys.argv[1:4]))
