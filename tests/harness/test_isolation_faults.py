"""A trial's worker starts lean: torch and its trial, not the statistics or the plots."""

from __future__ import annotations

import subprocess
import sys

from tests import ROOT

WORKER_TARGETS = [
    "experiments.fit.worker",
    "experiments.screen.ranks",
    "experiments.parity",
]


def test_a_trial_worker_imports_torch_and_its_trial_not_the_statistics_or_the_plots() -> None:
    """Every trial starts a process that imports `harness.isolation` and its target, without pandas, scipy or
    matplotlib.

    Those three serve only the parent's tables and reports, and cost each worker about 3 s of its 6 s start on
    two cores.
    """
    code = (
        "import importlib, sys\n"
        "import harness.isolation\n"
        f"for name in {WORKER_TARGETS!r}: importlib.import_module(name)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'pandas', 'scipy', 'matplotlib'}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout
