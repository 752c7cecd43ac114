"""Run one trial in a fresh worker process, so each trial starts from a cold process and a clean device.

The parent only schedules and collects: it writes the payload to a file, starts
``python -m harness.isolation TARGET PAYLOAD RESULT`` and reads the result file back. The worker imports
``TARGET`` (``module:function``), calls it with the payload dict and writes the returned dict. An exception in
the worker comes back as data and is raised again in the parent (an out-of-memory as
``torch.OutOfMemoryError``, so the protocol records a ``resource_failure``); a worker that dies without a
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
from pathlib import Path
from typing import Any

import torch

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
) -> dict[str, Any]:
    """Call ``target(payload)`` in a fresh Python process and return its result dict."""
    with tempfile.TemporaryDirectory(prefix="bench-worker-") as tmp:
        payload_file, result_file = Path(tmp) / "payload.json", Path(tmp) / "result.json"
        payload_file.write_text(json.dumps(payload))
        output_file = log_path or Path(tmp) / "output.log"
        command = [sys.executable, "-m", "harness.isolation", target, str(payload_file), str(result_file)]
        worker_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        root = str(Path(__file__).resolve().parent.parent)
        worker_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, worker_env.get("PYTHONPATH")) if p)
        with open(output_file, "ab") as output:
            try:
                process = subprocess.run(
                    command, stdout=output, stderr=subprocess.STDOUT, timeout=timeout_s, env=worker_env
                )
                returncode: int | str = process.returncode
            except subprocess.TimeoutExpired:
                returncode = f"timeout after {timeout_s:g} s"
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
        raise WorkerError(message)
    return result["value"]


def _worker_main(target: str, payload_file: str, result_file: str) -> int:
    module_name, _, attr = target.partition(":")
    payload = json.loads(Path(payload_file).read_text())
    try:
        value = getattr(importlib.import_module(module_name), attr)(payload)
        result: dict[str, Any] = {"value": value}
    except Exception as exc:  # noqa: BLE001 - reported to the parent as data
        traceback.print_exc()
        result = {
            "exception": {
                "type": type(exc).__name__,
                "message": str(exc),
                "out_of_memory": is_out_of_memory(exc),
            }
        }
    tmp = Path(result_file + ".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, result_file)
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(*sys.argv[1:4]))
