"""The calibration arm's known delay in a trial: its role, its row's figure, and the sleep that measures it.

Light on purpose: a fit's worker imports ``inject`` at its start (no pandas, no scipy).
"""

from __future__ import annotations

import time

ROLE = "calibration"  # the calibration arm's role
FIGURE = "injected_s"  # its rows' figure: the sleep each trial measured, the known size


def inject(seconds: float | None) -> dict[str, float]:
    """Sleep ``seconds`` (None: nothing) and return the row's figure: the sleep as the clock measured it."""
    if seconds is None:
        return {}
    started = time.perf_counter()
    time.sleep(seconds)
    return {FIGURE: round(time.perf_counter() - started, 6)}
