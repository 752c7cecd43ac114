"""Ctrl-C and SIGTERM as one kind of stop: the status a stopped command exits with, and the handler."""

from __future__ import annotations

from typing import Any

INTERRUPTED = 130  # the shell's status for a command stopped by Ctrl-C


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so the run stops as it does for Ctrl-C."""


def terminate(signum: int, frame: Any) -> None:
    raise Terminated(f"signal {signum}")
