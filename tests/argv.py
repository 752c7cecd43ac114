"""Command lines for tests: a base list of options with some given again, each given once (the CLI refuses an
option given twice)."""

from __future__ import annotations

import sys


def overridden(base: list[str], extra: list[str]) -> list[str]:
    """``base`` without the ``--option value`` pairs that ``extra`` gives again, then ``extra``."""
    again = {token.split("=")[0] for token in extra if token.startswith("--")}
    kept: list[str] = []
    tokens = iter(base)
    for token in tokens:
        if token in again:
            next(tokens, None)  # its value
            continue
        kept.append(token)
    return [*kept, *extra]


# A screen of one scale and one guard, one step per window: the smallest screen that runs, on the CPU.
TINY_SCREEN = [
    *("screen", "--device", "cpu", "--scales", "n", "--guards", "0"),
    *("--steps", "1", "--warmup-steps", "0"),
]

# The tiny fit: the embedded workload's smallest fit of whole epochs, on any device.
TINY_FIT = ["--workload", "embedded", "--images", "8", "--batch", "4", "--steps", "4", "--val-images", "8"]
# A tiny fit of one pair: the command of the `half_run` folder (tests/conftest.py).
TINY_PAIR = ["pair", *TINY_FIT, "--pairs", "1"]
EMBEDDED = ["pair", "--workload", "embedded"]
# The CLI in a child process (run from the checkout's root, with `tests.child_env()`).
BENCH = [sys.executable, "-m", "harness.cli"]
# One measured pair and no warm-up: the fewest trials a run of any tier holds.
ONE_PAIR = ["--warmup", "0", "--pairs", "1"]
