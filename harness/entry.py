"""The ``bench`` console script: takes Ctrl-C and SIGTERM before typer, torch and the tiers load."""

from __future__ import annotations

import os
import signal
import sys

from harness.interrupts import INTERRUPTED, terminate


def entry() -> None:
    signal.signal(signal.SIGTERM, terminate)
    # As `python -m` would: arm modules (``--arms myopt:Mine``) import from the working directory. Workers
    # start with `python -m`, from this same directory, so they find them too.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        from harness.cli import main  # heavy: imported once the handlers are in place
    except KeyboardInterrupt:
        sys.stderr.write("bench: interrupted\n")
        sys.exit(INTERRUPTED)
    sys.exit(main())
