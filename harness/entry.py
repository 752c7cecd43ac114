"""The ``bench`` console script: takes Ctrl-C and SIGTERM before anything heavy is imported.

The command line imports typer, torch and the tiers, which takes seconds; an interrupt in that time would
otherwise be a KeyboardInterrupt traceback, and SIGTERM a silent exit 143.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

INTERRUPTED = 130  # the shell's status for a command stopped by Ctrl-C


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so the run stops as it does for Ctrl-C."""


def terminate(signum: int, frame: Any) -> None:
    raise Terminated(f"signal {signum}")


def entry() -> None:
    signal.signal(signal.SIGTERM, terminate)
    # As `python -m` would: arm modules (``--arms myopt:Mine``) import from the working directory. Workers
    # start with `python -m`, from this same directory, so they find them too.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        from harness.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("bench: interrupted\n")
        sys.exit(INTERRUPTED)
    sys.exit(main())
