"""The ``bench`` console script: takes Ctrl-C and SIGTERM before anything heavy is imported.

The command line imports typer, torch and the tiers, which takes seconds; an interrupt in that time would
otherwise be a KeyboardInterrupt traceback, and SIGTERM a silent exit 143.
"""

from __future__ import annotations

import signal
import sys

from harness.interrupts import INTERRUPTED, terminate


def entry() -> None:
    signal.signal(signal.SIGTERM, terminate)
    try:
        from harness.cli import main  # heavy: imported once the handlers are in place
    except KeyboardInterrupt:
        sys.stderr.write("bench: interrupted\n")
        sys.exit(INTERRUPTED)
    sys.exit(main())
